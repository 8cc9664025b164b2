"""The in-process test engine: the real processor over in-memory topics, with time you
control.

:class:`TestEngine` runs the same :class:`PartitionProcessor` state machine the Kafka loop
runs, one batch at a time, over :class:`MemoryTopics` and the in-memory partition store.
Activity tasks go to the real worker service, which runs the registered activity functions
(or the replacements a test passes). Its clock is a :class:`ManualClock` that follows what
runs: while an activity runs, engine time moves with the wall clock (a real 3 s activity
loses a race with a 1 s timer); when nothing runs and nothing is due, waiting skips straight
to the next due timer (or the end of a :func:`~engine.testing.fakes.takes` fake), so a
30-day timer fires at once, in fire-time order with every other timer, and ``ctx.now()``
in the workflow moves with it. Records on the topics of declared triggers become commands
through the same mapping as the Kafka trigger bridge.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

from engine.codec import decode_history, decode_message
from engine.config.payloads import install_payload_codecs
from engine.config.settings import Settings
from engine.config.topics import TopicNames, full_name, logical_names, topic_names
from engine.config.triggers import parse_triggers
from engine.core.errors import (
    CommandTimeoutError,
    InstanceTurnError,
    RecordHandlingError,
    TurnstileError,
    WaitTimeoutError,
)
from engine.core.history import HistoryEvent
from engine.core.keys import murmur2_partition
from engine.core.messages import CommandOutcome, DeadLetter, Message
from engine.runtime.registry import Registry, default_registry
from engine.services.client.commands import CommandMethods
from engine.services.client.outcomes import OutcomeWaiters
from engine.services.client.schedule_client import ScheduleClient, ScheduleMethods
from engine.services.client.workflow_client import (
    InstanceState,
    StatusPredicate,
    StatusView,
    WorkflowClient,
    completed_since,
)
from engine.services.dead_letters import FirstPerSource, source_place
from engine.services.processor.memory_store import MemoryPartitionStore
from engine.services.processor.partition import Environment, PartitionProcessor
from engine.services.processor.protocol import BatchMetrics, NoMetrics, Step
from engine.services.processor.state import partition_cache_capacity
from engine.services.processor.tables import STATE_CHANGELOG, TIMER_CHANGELOG
from engine.services.records import RawRecord
from engine.services.tracing import NoTracing, TraceHook
from engine.services.triggers import Outgoing, check_workflows
from engine.services.watchdog import TurnWatchdog
from engine.services.worker.worker import Outbound, Worker
from engine.testing.fakes import HeldResults, Takes, worker_registry
from engine.testing.topics import MemoryTopics
from engine.testing.triggers import MemoryTriggerBridge

__all__ = ["ManualClock", "TestEngine"]

#: A guard against a workflow that never settles (a timer loop with no end, say).
MAX_ROUNDS = 100_000


class ManualClock:
    """Engine time: it moves only when the test engine moves it (never backwards), with
    the wall clock while activities run and in jumps when nothing does."""

    def __init__(self, start_ms: int) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic(self) -> float:
        return time.monotonic()

    def advance_to(self, when_ms: int) -> None:
        self._now_ms = max(self._now_ms, when_ms)


class _CommandSink:
    """The client's command sink: commands go straight onto the in-memory topic."""

    def __init__(self, produce: Callable[[str, bytes, bytes | None], RawRecord], topic: str):
        self._produce = produce
        self._topic = topic

    def send(self, key: bytes, value: bytes) -> None:
        self._produce(self._topic, key, value)

    def flush(self, timeout_s: float) -> None:
        return None  # every send is written at once


class _RunningOutcomes(OutcomeWaiters):
    """The test engine's outcome waits: run the processors (not the clock, not the
    activities) until the command is answered, as a processor would in the background.
    An answer that waits for activities (an update's handler awaits one) gets whole
    rounds after that: the activities the batches started run too, the clock still not."""

    def __init__(self, run_once: Callable[[], bool], run_round: Callable[[], bool]) -> None:
        super().__init__()
        self._run_once = run_once
        self._run_round = run_round

    def wait(
        self, request_id: str, future: Future[CommandOutcome], timeout_s: float, what: str
    ) -> CommandOutcome:
        for run in (self._run_once, self._run_round):
            for _ in range(MAX_ROUNDS):
                if future.done() or not run():
                    break
        if not future.done():
            self.forget(request_id)
            raise CommandTimeoutError(f"{what} was not answered: the engine has nothing to run")
        return future.result()


class TestEngine(CommandMethods, ScheduleMethods):
    """A whole engine in the test process: no broker, no disk, no waiting for timers.

    ``registry`` holds the workflows and activities (default: the ``@workflow`` /
    ``@activity`` registry); ``activities`` replaces activities by name or function, e.g.
    ``{"orders.charge": fake_charge}``, or with a fake that lasts a span of engine time,
    ``{"orders.charge": takes(timedelta(minutes=10), "ok")}``. The commands are
    :class:`engine.client.Client`'s (the same methods, returning the same handles): each
    waits for the processor's answer (the processors run until it is there; the clock and
    the activities wait for :meth:`run`) and a refusal raises the same error; with
    ``wait=False`` the command only waits on its topic for the next :meth:`run`. The
    ``triggers`` of ``settings`` run too: :meth:`produce` a record on a trigger topic and
    the next run turns it into its command, or a dead letter.

    Time follows what runs: while an activity runs, engine time moves with the wall clock;
    when no activity runs and nothing is due, a wait jumps to the next timer.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        registry: Registry | None = None,
        *,
        activities: Mapping[str | Callable[..., Any], Callable[..., Any] | Takes] | None = None,
        partitions: int = 1,
        start: datetime | None = None,
        namespace: str = "test",
        settings: Settings | None = None,
        activity_timeout_s: float = 60.0,
        metrics: BatchMetrics | None = None,
        tracing: TraceHook | None = None,
    ) -> None:
        base = settings or Settings()
        if settings is not None:
            install_payload_codecs(settings)
        self._tracing: TraceHook = tracing or NoTracing()
        self.registry = registry or default_registry
        self.namespace = namespace
        self.topics: TopicNames = topic_names(namespace)
        when = start or datetime.now(UTC)
        self.clock = ManualClock(int(when.timestamp() * 1000))
        env = Environment(
            registry=self.registry,
            topics=self.topics,
            partitions=partitions,
            pending_events_max=base.pending_events_max,
            pending_events_ttl_ms=base.pending_events_ttl_ms,
            dedup_window=base.dedup_window,
            dedup_window_ms=base.dedup_window_ms,
            retention_ms=base.retention_ms,
            park_workflow_errors=base.park_workflow_errors,
            parked_events_max=base.parked_events_max,
            parked_events_max_bytes=base.parked_events_max_bytes,
            cache_capacity=partition_cache_capacity(base.cache_instances, partitions),
            limits=base.limits,
            watchdog=TurnWatchdog(base.turn_budget_ms),
            turn_max_events=base.turn_max_events,
            tracing=self._tracing,
            publish_topics=frozenset(base.publish_topics),
            backlog_events_max=base.backlog_events_max,
            history_limits=base.history_limits,
        )
        self._env = env
        self.processors = {
            p: PartitionProcessor(p, MemoryPartitionStore(), env) for p in range(partitions)
        }
        self.log = MemoryTopics(partitions)
        self._inputs = {
            self.topics.commands,
            self.topics.activity_results,
            self.topics.instance_messages,
        }
        self._inbox: dict[int, deque[RawRecord]] = {p: deque() for p in range(partitions)}
        self._max_batch = base.max_batch
        self._activity_timeout_s = activity_timeout_s
        self._metrics: BatchMetrics = metrics or NoMetrics()
        self._view = StatusView()
        self._view.mark_ready()
        self._outcomes = _RunningOutcomes(self._run_processors, self.step)
        self._replacements = dict(activities or {})
        self._held = HeldResults(self.clock.now_ms)
        triggers = parse_triggers(base.triggers)  # checked as run processor checks them
        check_workflows(triggers, self.registry)
        self._bridge = MemoryTriggerBridge(triggers, self.topics, base.max_record_bytes)
        self.client, self._worker = self._clients(self.registry)

    def _clients(self, registry: Registry) -> tuple[WorkflowClient, Worker]:
        sink = _CommandSink(self._produce, self.topics.commands)
        client = WorkflowClient(
            sink,
            self._view,
            registry=registry,
            outcomes=lambda: self._outcomes,
            limits=self._env.limits,
        )
        worker = Worker(
            worker_registry(registry, self._replacements, self._held),
            source_topic=self.topics.activity_tasks,
            concurrency=1,
            tracing=self._tracing,
            wall_ms=self.clock.now_ms,
        )
        worker.assigned(range(len(self.processors)))
        return client, worker

    # --- lifecycle --------------------------------------------------------------------------

    def deploy(self, registry: Registry) -> None:
        """Run other code from now on, as a deploy and restart would: the processors forget
        their hot instances (each is rebuilt from its history with the new workflows on its
        next turn) and activities run from ``registry`` (with the same replacements).
        Activities still running finish first, as on a worker that stops gracefully."""
        self._await_activities(None, stop_when_due=False)
        self._worker.shutdown()
        self.registry = registry
        self._env.registry = registry
        for pp in self.processors.values():
            pp.cache.clear()
        self.client, self._worker = self._clients(registry)

    def close(self) -> None:
        self._worker.shutdown()
        for pp in self.processors.values():
            pp.close()
        self._env.watchdog.close()

    def __enter__(self) -> TestEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- commands (the verbs are CommandMethods', as on engine.client.Client) -------------

    def _command_client(self) -> WorkflowClient:
        return self.client

    def _schedule_client(self) -> ScheduleClient:
        return ScheduleClient(self.client)

    def send(self, command: Message) -> None:
        """Send a hand-made command record (for tests of the wire contract)."""
        self.client.send(command)

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: Mapping[str, str | bytes] | None = None,
    ) -> RawRecord:
        """Write raw bytes to a topic (an engine topic by full name, or a business topic),
        as a foreign producer would; the partition defaults to murmur2 of the key, like
        every Turnstile producer. A record on a trigger topic becomes its command (or a
        dead letter) on the next run, as the trigger bridge would make it."""
        pairs = (headers or {}).items()
        raw = tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs)
        return self._produce(topic, key, value, partition, raw)

    # --- running ----------------------------------------------------------------------------

    def run(self) -> None:
        """Process everything that is due now (input, trigger records, due timers), and
        wait for the activities that starts, without skipping time: engine time moves only
        with the wall clock while activities run."""
        self._run(skip_time=False)

    def step(self) -> bool:
        """One round, without skipping time: a batch on every partition that has input or
        due timers, then the activities those batches started, to their end (their results
        wait for the next round). Returns whether anything happened. Commands sent between
        two rounds land in the same batch as those results, which lets a test put an event
        and an activity result into one turn."""
        progressed = self._round()
        return self._await_activities(None, stop_when_due=False) or progressed

    def advance(self, duration: timedelta | float) -> None:
        """Move the clock forward by ``duration`` (seconds or a timedelta), firing every
        timer due on the way in order, with the clock at each timer's time (activities
        running on the way move it with the wall clock, and may still run at the end)."""
        if _ms(duration) < 0:
            raise ValueError("advance() moves time forward only; pass a positive duration")
        horizon = self.clock.now_ms() + _ms(duration)
        self._run(skip_time=True, horizon_ms=horizon)
        self.clock.advance_to(horizon)
        self._run(skip_time=False, horizon_ms=horizon)

    def wait_for_completion(
        self, instance_id: str, timeout: timedelta | float | None = None, *, generation: int = 0
    ) -> InstanceState:
        """Run, skipping time to each next timer when nothing runs, until the instance
        has ended.

        ``timeout`` bounds the engine time to skip (seconds or a timedelta; default: no
        bound); a wait that runs out leaves the clock at its end, as a real wait would.
        With ``generation``, the end of an earlier run of the id does not count (what a
        handle's ``result()`` passes). Raises :class:`WaitTimeoutError` when the instance
        still runs after it, or
        when nothing is left to do (it waits for an event: raise it, or check the workflow).
        """
        horizon = None if timeout is None else self.clock.now_ms() + _ms(timeout)
        ended = completed_since(generation)
        self._run(skip_time=True, until=lambda: self._ended(instance_id, ended), horizon_ms=horizon)
        if horizon is not None and not self._ended(instance_id, ended):
            self.clock.advance_to(horizon)  # the whole timeout passed, as for a real wait
            self._run(skip_time=False, horizon_ms=horizon)
        status = self._view.get(instance_id)
        if status is not None and ended(status):
            return InstanceState(status)
        state = "unknown" if status is None else status.status.value
        if horizon is not None and (self._next_due_ms() is not None or self._worker.load):
            raise WaitTimeoutError(
                f"instance {instance_id} is still {state} after {timeout} of engine time; "
                f"wait longer or check what it waits for"
            )
        raise WaitTimeoutError(
            f"instance {instance_id} is {state} and nothing is left to run: it waits for "
            f"something only the test can send (an event, a resume), or it was never "
            f"started; send it, then wait again"
        )

    def now(self) -> datetime:
        """The engine's current time (what ``ctx.now()`` sees in a turn run now)."""
        return datetime.fromtimestamp(self.clock.now_ms() / 1000, UTC)

    # --- reads ------------------------------------------------------------------------------

    def get(self, instance_id: str) -> InstanceState | None:
        """The instance's latest status, as the client would read it (None if unknown)."""
        status = self._view.get(instance_id)
        return None if status is None else InstanceState(status)

    def history(self, instance_id: str) -> list[HistoryEvent]:
        """Every history event of the instance, all generations, from the history topic."""
        key = instance_id.encode()
        return [
            decode_history(r.value)
            for r in self.log.read(self.topics.history)
            if r.key == key and r.value is not None
        ]

    def records(self, topic: str) -> list[RawRecord]:
        """What was written to a topic, by full name or spec name (``dead-letters``), or
        to a user topic: one of the ``publish_topics`` setting (``ctx.publish``) or of a
        trigger."""
        if topic in self._env.publish_topics or topic in self._bridge.topics:
            return self.log.read(topic)
        full = topic if topic in self.topics.names() else full_name(self.namespace, topic)
        if full not in self.topics.names() and not self.topics.is_task_queue(full):
            names = ", ".join(logical_names())
            raise ValueError(f"no topic {topic!r} in this engine; use one of {names}")
        return self.log.read(full)

    def partition_of(self, instance_id: str) -> int:
        """The partition (and so the entry of :attr:`processors`) that owns the instance."""
        return murmur2_partition(instance_id.encode(), len(self.processors))

    def dead_letters(self) -> list[DeadLetter]:
        """The dead letters written so far, decoded: one per source record, as every
        reader of dead letters shows them."""
        out = []
        firsts = FirstPerSource()
        for r in self.log.read(self.topics.dead_letters):
            assert r.value is not None
            letter = decode_message(r.value)
            assert isinstance(letter, DeadLetter)
            if firsts.first(source_place(letter)):
                out.append(letter)
        return out

    # --- the loop ---------------------------------------------------------------------------

    def _run(
        self,
        *,
        skip_time: bool,
        until: Callable[[], bool] | None = None,
        horizon_ms: int | None = None,
    ) -> None:
        """Rounds until ``until`` holds or nothing is left: while activities run, engine
        time follows the wall clock; only when none runs and nothing is due does it jump
        (``skip_time``) to the next timer or fake's end, never past ``horizon_ms``."""
        for _ in range(MAX_ROUNDS):
            if until is not None and until():
                return
            if self._round():
                continue
            if self._worker.load:
                if horizon_ms is not None and self.clock.now_ms() >= horizon_ms:
                    return  # the activities still run at the end of the wait
                self._await_activities(horizon_ms, stop_when_due=True)
                continue
            if not skip_time:
                return
            due = self._next_due_ms()
            if due is None or (horizon_ms is not None and due > horizon_ms):
                return
            self.clock.advance_to(due)
        raise TurnstileError(
            f"the engine was still busy after {MAX_ROUNDS} rounds: a workflow seems to loop "
            f"forever (a timer loop without an end?); wait for another instance, or use "
            f"advance() to run for a bounded time"
        )

    def _run_processors(self) -> bool:
        """One batch on every partition with input or due timers (no activities)."""
        ran = [self._run_batch(pp) for pp in self.processors.values()]
        return any(ran)

    def _round(self) -> bool:
        """Route new trigger records, hand over the results of fakes whose time is over,
        run one batch on every partition with input or due timers, and collect the
        activities that have finished; returns whether anything happened."""
        progressed = self._bridge.step(self.log, self._write) > 0
        for out in self._held.due(self.clock.now_ms()):
            self._produce_outbound(out)
            progressed = True
        for pp in self.processors.values():
            progressed = self._run_batch(pp) or progressed
        return self._collect(self._worker.collect()) or progressed

    def _write(self, out: Outgoing) -> None:
        self._produce(out.topic, out.key, out.value, None, out.headers)

    def _run_batch(self, pp: PartitionProcessor) -> bool:
        """The commit protocol of the Kafka loop, over memory. The produce, offsets and
        commit steps cannot fail here, so the only abort path is the Kafka loop's for one
        poisoned instance or record: roll back, isolate it, put the input back."""
        now_ms = self.clock.now_ms()
        # 1. poll: take what the partition's inbox holds
        t = self.clock.monotonic()
        inbox = self._inbox[pp.partition]
        records = [inbox.popleft() for _ in range(min(len(inbox), self._max_batch))]
        t = self._observe(Step.POLL, t, len(records))
        try:
            return self._run_steps(pp, records, now_ms, t)
        except (InstanceTurnError, RecordHandlingError) as exc:
            pp.rolled_back()
            inbox.extendleft(reversed(records))
            if not pp.isolate(exc):
                raise
            self._observe(Step.ABORT, t, 1)
            return True

    def _run_steps(
        self, pp: PartitionProcessor, records: list[RawRecord], now_ms: int, t: float
    ) -> bool:
        # 2. accept
        for record in records:
            pp.accept(record, now_ms)
        t = self._observe(Step.ACCEPT, t, len(records))
        # 3. fire due timers
        fired = pp.fire_due_timers(now_ms)
        t = self._observe(Step.TIMERS, t, fired)
        if not records and not fired:
            return False
        # 4. step the touched instances and close the batch
        batch = pp.end_batch(now_ms)
        t = self._observe(Step.STEP, t, len(batch.touched))
        # 5-7. produce (offsets and commit are implicit: the inbox was consumed)
        reached: dict[str, int] = {}
        changelogs = {
            self.topics.state_changelog: STATE_CHANGELOG,
            self.topics.timer_changelog: TIMER_CHANGELOG,
        }
        for r in batch.out:
            written = self._produce(r.topic, r.key, r.value, r.partition, r.headers)
            name = changelogs.get(r.topic)
            if name is not None:
                reached[name] = written.offset
        t = self._observe(Step.PRODUCE, t, len(batch.out))
        # 8. apply the changes to the store
        pp.committed(reached)
        self._observe(Step.APPLY, t, len(batch.changes))
        return True

    def _observe(self, step: Step, started: float, count: int) -> float:
        now = self.clock.monotonic()
        self._metrics.observe(step, now - started, count)
        return now

    def _await_activities(self, horizon_ms: int | None, *, stop_when_due: bool) -> bool:
        """Wait for the running activities to end, engine time following the wall clock,
        or (``stop_when_due``) until a timer or a fake's end falls due or ``horizon_ms``
        is reached; their results go to the activity-results topic like a worker's."""
        worker = self._worker
        start_ms, started = self.clock.now_ms(), time.monotonic()
        deadline = started + self._activity_timeout_s
        collected = False
        while worker.load:
            now_ms = self.clock.now_ms()
            due = self._next_due_ms() if stop_when_due else None
            stops = [t for t in (due, horizon_ms) if t is not None]
            if stops and now_ms >= min(stops):
                break
            wall_left = deadline - time.monotonic()
            if wall_left <= 0:
                raise WaitTimeoutError(
                    f"activities still running after {self._activity_timeout_s}s; pass a "
                    f"faster replacement in activities=... (or a takes(...) fake) or raise "
                    f"activity_timeout_s"
                )
            wait_s = min(wall_left, 1.0, *((t - now_ms) / 1000 for t in stops))
            finished = worker.collect(wait_s=max(wait_s, 0.001))
            self.clock.advance_to(start_ms + int((time.monotonic() - started) * 1000))
            collected = self._collect(finished) or collected
        return collected or self.clock.now_ms() > start_ms

    def _collect(self, finished: list[Outbound]) -> bool:
        """Produce what the worker handed out; once it is idle, forget the tasks it does
        not serve (no other worker will come for them) and commit its offsets."""
        for out in finished:
            self._produce_outbound(out)
        if not self._worker.load:
            self._worker.drop_backlog()
            self._worker.committed(self._worker.offsets.to_commit())
        return bool(finished)

    def _produce_outbound(self, out: Outbound) -> None:
        if self._held.hold(out):  # a takes() fake: its result waits for its time
            return
        if out.requeue_to is not None:  # one worker serves every queue here
            self._produce(self.topics.activity_tasks, out.key, out.value, None, out.headers)
            return
        topic = self.topics.dead_letters if out.dead else self.topics.activity_results
        self._produce(topic, out.key, out.value, None, out.headers)

    def _produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
    ) -> RawRecord:
        record = self.log.append(topic, key, value, partition, self.clock.now_ms(), headers)
        if topic in self._inputs:
            self._inbox[record.partition].append(record)
        elif topic == self.topics.status:
            self._view.apply_record(key or b"", value)
        elif topic == self.topics.command_outcomes:
            self._outcomes.apply_record(value)
        elif self.topics.is_task_queue(topic):
            self._held.cancelled(record)
            for letter in self._worker.accept([record]):
                self._produce_outbound(letter)
        return record

    def _next_due_ms(self) -> int | None:
        """When the next timer fires or the next fake's result is due (None: neither)."""
        due = [t for pp in self.processors.values() if (t := pp.next_timer_ms()) is not None]
        held = self._held.next_end_ms()
        due += [] if held is None else [held]
        return min(due) if due else None

    def _ended(self, instance_id: str, ended: StatusPredicate) -> bool:
        status = self._view.get(instance_id)
        return status is not None and ended(status)


def _ms(duration: timedelta | float) -> int:
    seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
    return int(seconds * 1000)
