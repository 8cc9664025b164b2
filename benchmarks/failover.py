"""Failover: how long a processor replica's partitions stand still when it dies or stops,
and whether the other replica's partitions pause meanwhile.

Per case: two replicas (``python -m engine run processor``, as deployed) share the
partitions; ``--instances`` workflows are run first so the tables hold state; then a load
of ``chain3.inline`` workflows arrives on every partition (one every ``--every-ms`` per
partition, ids chosen per partition) while one replica is SIGKILLed or SIGTERMed. Every
committed turn writes a status record, so the status topic's record timestamps say when
each partition committed: ``resumed`` is, per partition the stopped replica owned, the time
from the signal to that partition's first status record after it (p50 and max over those
partitions); ``others' longest gap`` is the longest silence between status records on the
other replica's partitions from the signal on (their load arrives every ``--every-ms``, so
about that means they never paused). The cases: SIGKILL with liveness (the peer evicts the
dead replica and fences it), the same with ``standby_replicas = 1`` (the survivor keeps
warm copies of the other's partitions, and the load starts only once they caught up, as the
offsets the survivor's copies recorded say), SIGKILL without liveness (the group's
10 s session timeout), SIGTERM (the replica leaves the group itself), and SIGKILL and
SIGTERM under the consumer group protocol (KIP-848: the broker moves only the partitions
that change owner). Each row also says how
many changelog records the survivor restored when it took the partitions over (from its log).

    .venv/bin/python benchmarks/failover.py [--instances 20000] [--bootstrap-servers HOST:PORT]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import harness
from common import emit, git_commit, host_info, median, progress
from confluent_kafka import Consumer, KafkaError, TopicPartition
from rocksdict import AccessType, Options, Rdict

from engine.adapters.kafka.config import consumer_config, expected_partition
from engine.adapters.kafka.io import log_end_offsets
from engine.client import Client
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.services.processor.keys import offset_key
from engine.services.processor.tables import STATE_CHANGELOG, TIMER_CHANGELOG

MODULE = "engine.examples.chain3"
WORKFLOW = "chain3.inline"
MOVED = re.compile(r"partitions \[([\d, ]*)\] (restored|revoked)")
RESTORED = re.compile(r"partitions \[[\d, ]*\] restored: (\d+) changelog records in ([\d.]+)s")

LIVENESS = {"TURNSTILE_LIVENESS_INTERVAL_MS": "500"}
STANDBY = LIVENESS | {"TURNSTILE_STANDBY_REPLICAS": "1"}
NO_LIVENESS = {"TURNSTILE_LIVENESS_INTERVAL_MS": "0"}
CONSUMER_PROTOCOL = {"TURNSTILE_GROUP_PROTOCOL": "consumer"}

#: (label, signal, the replicas' environment)
CASES = (
    ("SIGKILL, liveness", signal.SIGKILL, LIVENESS),
    ("SIGKILL, liveness, standby", signal.SIGKILL, STANDBY),
    ("SIGKILL, no liveness", signal.SIGKILL, NO_LIVENESS),
    ("SIGTERM", signal.SIGTERM, LIVENESS),
    ("SIGKILL, consumer protocol", signal.SIGKILL, CONSUMER_PROTOCOL),
    ("SIGTERM, consumer protocol", signal.SIGTERM, CONSUMER_PROTOCOL),
)


@dataclass(frozen=True)
class Params:
    instances: int = 20_000
    partitions: int = 8
    every_ms: int = 100
    before_s: float = 5.0
    after_s: float = 20.0


def _processor(
    settings: Settings, work_dir: Path, replica_id: str, env: dict[str, str]
) -> harness.EngineProcess:
    return harness.spawn("processor", settings, MODULE, work_dir, replica_id=replica_id, env=env)


def _copy_behind(settings: Settings, state: Path, partitions: set[int]) -> dict[str, int]:
    """Per changelog partition, how far the replica's copy (read-only: no lock, no effect
    on the replica) is behind the changelog's last record; on a quiet topic the last offset
    is the last transaction's commit marker, so a copy that is up to date is 1 behind."""
    topics = topic_names(settings.namespace)
    pairs = [(topics.state_changelog, STATE_CHANGELOG), (topics.timer_changelog, TIMER_CHANGELOG)]
    config = consumer_config(settings.bootstrap_servers, f"failover-{time.time_ns()}")
    wanted = [TopicPartition(t, p) for p in partitions for t, _ in pairs]
    ends = log_end_offsets(config, wanted)
    behind = {}
    for p in partitions:
        db = Rdict(str(state / f"p{p}"), Options(raw_mode=True), access_type=AccessType.read_only())
        try:
            for topic, name in pairs:
                raw = db.get(offset_key(name))
                recorded = -1 if raw is None else int(bytes(raw))
                end = ends[(topic, p)][1]
                if end:
                    behind[f"{topic}[{p}]"] = end - 1 - recorded
        finally:
            db.close()
    return behind


def _standbys_caught_up(
    settings: Settings, state: Path, partitions: set[int], timeout: float = 600.0
) -> None:
    """Wait until the copies are within the last commit marker of every changelog."""
    deadline = time.monotonic() + timeout
    behind: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            behind = _copy_behind(settings, state, partitions)
        except Exception as exc:  # the copy's database is not there yet
            behind = {f"not readable ({exc})": -1}
        else:
            if all(n <= 1 for n in behind.values()):
                return
        time.sleep(1.0)
    raise RuntimeError(f"standby copies of {sorted(partitions)} did not catch up: {behind}")


def _restored(proc: harness.EngineProcess) -> list[tuple[int, float]]:
    """Changelog records and seconds of each restore the replica logged, in order."""
    text = proc.log_path.read_text(errors="replace")
    return [(int(n), float(s)) for n, s in RESTORED.findall(text)]


def _owned(proc: harness.EngineProcess, timeout: float = 120.0) -> set[int]:
    """The partitions the replica holds now, from the restores and revocations it logged
    (an eager rebalance revokes all and restores its share; an incremental one moves some)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held: set[int] = set()
        for parts, kind in MOVED.findall(proc.log_path.read_text(errors="replace")):
            moved = {int(p) for p in parts.split(",") if p.strip()}
            held = held | moved if kind == "restored" else held - moved
        if held:
            return held
        proc.check_alive()
        time.sleep(0.1)
    raise RuntimeError(f"no assignment logged within {timeout:.0f}s\n{proc.describe()}")


def _ids_per_partition(partitions: int, per: int) -> dict[int, list[str]]:
    ids: dict[int, list[str]] = {p: [] for p in range(partitions)}
    for n in itertools.count():
        instance = f"fo-{n}"
        p = expected_partition(instance.encode(), partitions)
        if len(ids[p]) < per:
            ids[p].append(instance)
        if all(len(v) >= per for v in ids.values()):
            return ids
    raise AssertionError("unreachable")


def _load(
    client: Client, ids: dict[int, list[str]], every_s: float, stop: threading.Event
) -> list[str]:
    """One start per partition every ``every_s`` until ``stop``; the ids of the last round."""
    last: list[str] = []
    for round_ in range(len(ids[0])):
        if stop.is_set():
            break
        tick = time.monotonic()
        last = [ids[p][round_] for p in ids]
        for instance in last:
            client.start(WORKFLOW, round_, instance_id=instance, flush=False)
        client.flush()
        time.sleep(max(0.0, every_s - (time.monotonic() - tick)))
    return last


def _status_times(settings: Settings) -> dict[int, list[float]]:
    """Per status partition, the timestamps (s) of its committed records, in order."""
    topic = topic_names(settings.namespace).status
    config = consumer_config(settings.bootstrap_servers, f"failover-{time.time_ns()}")
    wanted = [TopicPartition(topic, p, 0) for p in range(settings.partitions)]
    ends = log_end_offsets(config, wanted)
    consumer = Consumer(config | {"enable.partition.eof": True})
    consumer.assign(wanted)
    times: dict[int, list[float]] = {p: [] for p in range(settings.partitions)}
    done: set[int] = {p for p in range(settings.partitions) if ends[(topic, p)][1] == 0}
    try:
        while len(done) < settings.partitions:
            message = consumer.poll(1.0)
            partition = None if message is None else message.partition()
            if message is None or partition is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    done.add(partition)
                continue
            times[partition].append(message.timestamp()[1] / 1000)
    finally:
        consumer.close()
    return times


def _prefill(client: Client, count: int, partitions: int) -> float:
    """Run ``count`` workflows through the engine so the tables hold state; the seconds it
    took. Each partition runs its starts in order, so once the last one started on every
    partition has completed, all have (a million take minutes: the wait scales with it)."""
    progress(f"running {count} workflows first, so the tables hold state")
    t0 = time.monotonic()
    last: dict[int, str] = {}
    for n in range(count):
        instance = f"pre-{n}"
        client.start(WORKFLOW, n, instance_id=instance, flush=False)
        last[expected_partition(instance.encode(), partitions)] = instance
        if n and n % 100_000 == 0:
            progress(f"started {n} ({n / (time.monotonic() - t0):.0f}/s)")
    client.flush()
    progress(f"started {count} in {time.monotonic() - t0:.0f}s; waiting for them to complete")
    for instance in last.values():
        client.wait_for_completion(instance, timeout=600 + count / 100)
    took = time.monotonic() - t0
    progress(f"{count} workflows ran in {took:.0f}s ({count / max(took, 1e-9):.0f}/s)")
    return took


def _gaps(times: dict[int, list[float]], partitions: set[int], t0: float, until: float) -> float:
    """The longest silence on ``partitions`` between ``t0`` and ``until`` (s)."""
    longest = 0.0
    for p in partitions:
        stamps = [t0, *(t for t in times[p] if t0 < t <= until), until]
        longest = max(longest, *(b - a for a, b in itertools.pairwise(stamps)))
    return longest


def run_case(
    broker: harness.Broker,
    params: Params,
    label: str,
    sig: signal.Signals,
    env: dict[str, str],
    logs: Path | None = None,
) -> dict[str, Any]:
    namespace = harness.fresh_namespace("failover")
    settings = harness.create_topics(broker.bootstrap, namespace, params.partitions)
    work_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-failover-"))
    procs = [_processor(settings, work_dir, f"processor-{r}", env) for r in (0, 1)]
    survivor, victim = procs
    rounds = int((params.before_s + params.after_s) * 1000 / params.every_ms) + 1
    ids = _ids_per_partition(params.partitions, rounds)
    try:
        with Client(settings=settings, timeout=60) as client:
            prefill_s = _prefill(client, params.instances, params.partitions)
            victims = _owned(victim)
            if "TURNSTILE_STANDBY_REPLICAS" in env:
                progress(f"{label}: waiting for the standby copies of {sorted(victims)}")
                state = work_dir / "state" / settings.namespace / "processor-0"
                _standbys_caught_up(settings, state, victims)
            restores_before = len(_restored(survivor))
            stop = threading.Event()
            last: list[str] = []
            loader = threading.Thread(
                target=lambda: last.extend(_load(client, ids, params.every_ms / 1000, stop)),
                daemon=True,
            )
            progress(f"{label}: load on every partition, then the signal to {sorted(victims)}")
            loader.start()
            time.sleep(params.before_s)
            t0 = time.time()
            victim.popen.send_signal(sig)
            time.sleep(params.after_s)
            stop.set()
            loader.join()
            for instance in last:
                client.wait_for_completion(instance, timeout=120)
        times = _status_times(settings)
        takeover = _restored(survivor)[restores_before:]
    finally:
        for proc in procs:
            proc.stop()
            if logs is not None:
                logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(proc.log_path, logs / f"{namespace}-{proc.log_path.name}")
        shutil.rmtree(work_dir, ignore_errors=True)
    result = _row(params, label, times, victims, t0)
    result["takeover_restored_records"] = sum(n for n, _ in takeover)
    result["takeover_restore_s"] = round(sum(s for _, s in takeover), 2)
    result["prefill_s"] = round(prefill_s, 1)
    emit(result)
    return result


def _row(
    params: Params, label: str, times: dict[int, list[float]], victims: set[int], t0: float
) -> dict[str, Any]:
    """The case's timings from the status records' timestamps."""
    # The longest silence of each of its partitions from the signal on: a SIGTERMed replica
    # still commits its last batch after the signal, so "the first record after it" would
    # be its own; the silence that follows until the new owner's first turn is the gap.
    resumed = [_gaps(times, {p}, t0, t0 + params.after_s) for p in victims]
    others = set(range(params.partitions)) - victims
    return {
        "benchmark": "failover",
        "case": label,
        "params": asdict(params),
        "host": host_info(),
        "commit": git_commit(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "resumed_p50_s": round(median(resumed), 3),
        "resumed_max_s": round(max(resumed), 3),
        "others_longest_gap_s": round(_gaps(times, others, t0, t0 + params.after_s), 3),
        "others_gap_before_s": round(_gaps(times, others, t0 - params.before_s + 1, t0), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--instances", type=int, default=Params.instances)
    parser.add_argument("--partitions", type=int, default=Params.partitions)
    parser.add_argument("--logs", type=Path, help="keep the replicas' logs in this directory")
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    parser.add_argument(
        "--case", action="append", choices=[c[0] for c in CASES], help="only this case (repeat)"
    )
    args = parser.parse_args(argv)
    params = Params(instances=args.instances, partitions=args.partitions)
    import results_md

    with harness.kafka(args.bootstrap_servers) as broker:
        for label, sig, env in CASES:
            if args.case and label not in args.case:
                continue
            result = run_case(broker, params, label, sig, env, args.logs)
            if not args.no_results_md:
                results_md.add_failover(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
