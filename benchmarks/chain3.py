"""chain3 on the engine: the peers' reference workload (../shared/peers), measured the same way.

A workflow takes an int, runs three steps of x + 1 and returns x + 3. Two variants:

- ``inline``: ``ctx.run`` steps, run and journalled by the processor in the workflow's turn
  (what Restate's ``ctx.run`` and DBOS steps do); no worker.
- ``activities``: three activities, each a round trip processor -> activity-tasks -> worker
  -> activity-results -> processor.

Throughput: start N instances as fast as the client can (``flush=False``, then one flush),
wait for all; workflows/s = N / (first start -> last completion seen by the client).
Latency: N instances one after the other (start, wait for completion); p50/p90/p99/max.
Warm-up 100 + 50 unrecorded, then ``repeats`` x (throughput, latency); medians reported.
Every result is checked (input + 3). The engine runs as subprocesses (one processor, one
worker), and the CPU each of them, the broker and the client used is recorded per workflow.

With ``--brokers 3`` both variants run on a private local cluster of three brokers
(``engine.dev.local_cluster``): the engine's topics get replication factor 3 and
``min.insync.replicas`` 2, read back from the cluster into every result, and the rows go to
``benchmarks/results/chain3-cluster.jsonl``.

    .venv/bin/python benchmarks/chain3.py --variant inline [--bootstrap-servers HOST:PORT]
    .venv/bin/python benchmarks/chain3.py --brokers 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

import harness
from common import CpuSpan, emit, git_commit, host_info, latency_summary, median, progress

from engine.client import Client
from engine.core.errors import WaitTimeoutError
from engine.core.messages import InstanceStatus
from engine.services.client.workflow_client import InstanceState

STEPS = 3
WORKFLOWS = {"inline": "chain3.inline", "activities": "chain3.activities"}
MODULE = "engine.examples.chain3"


@dataclass(frozen=True)
class Params:
    variant: str
    n_throughput: int = 1000
    n_latency: int = 200
    repeats: int = 3
    warmup: int = 100
    partitions: int = 8
    pin: bool = False
    timeout_s: float = 300.0

    @property
    def workflow(self) -> str:
        return WORKFLOWS[self.variant]


def _check(state: InstanceState, expected: int) -> None:
    """Every result is checked: a fast wrong answer is not a result."""
    if state.output != expected:
        raise AssertionError(
            f"instance {state.instance_id} ended {state.status.value} with {state.output!r}, "
            f"expected {expected} (failure: {state.failure})"
        )


def throughput_run(
    client: Client, eng: harness.Engine, params: Params, n: int, run: object
) -> dict[str, Any]:
    """N starts without waiting, one flush, then wait for every completion."""
    with CpuSpan(eng.pids) as cpu:
        t0 = time.perf_counter()
        ids = [client.start(params.workflow, i, flush=False) for i in range(n)]
        client.flush()
        t1 = time.perf_counter()
        futures: list[Future[InstanceStatus]] = [client.completion_future(i) for i in ids]
        _await_all(futures, eng, params.timeout_s)
        t2 = time.perf_counter()
    eng.check_alive()
    record = {
        "run": run,
        "n": n,
        "start_phase_s": round(t1 - t0, 4),
        "total_s": round(t2 - t0, 4),
        "start_rate_per_s": round(n / (t1 - t0), 2),
        "workflows_per_s": round(n / (t2 - t0), 2),
        "activities_per_s": round(n * STEPS / (t2 - t0), 2),
    }
    record.update(cpu.as_dict(per=n))
    return record


def _await_all(futures: list[Future[InstanceStatus]], eng: harness.Engine, timeout: float) -> None:
    """Wait for every completion (instance i got input i) and check each result."""
    deadline = time.monotonic() + timeout
    for i, future in enumerate(futures):
        try:
            status = future.result(max(deadline - time.monotonic(), 0.001))
        except TimeoutError:
            done = sum(f.done() for f in futures)
            raise RuntimeError(
                f"only {done} of {len(futures)} instances completed within {timeout:.0f}s\n"
                + eng.describe()
            ) from None
        _check(InstanceState(status), i + STEPS)


def latency_run(
    client: Client, eng: harness.Engine, params: Params, n: int, run: object
) -> dict[str, Any]:
    """N instances one at a time: start (flushed), wait for completion; per-instance wall."""
    lat_ms: list[float] = []
    with CpuSpan(eng.pids) as cpu:
        for i in range(n):
            t0 = time.perf_counter()
            instance = client.start(params.workflow, i)
            try:
                state = client.wait_for_completion(instance, timeout=params.timeout_s)
            except WaitTimeoutError as exc:
                raise RuntimeError(f"{exc}\n{eng.describe()}") from None
            lat_ms.append((time.perf_counter() - t0) * 1000.0)
            _check(state, i + STEPS)
    eng.check_alive()
    record: dict[str, Any] = {"run": run, "n": n, **latency_summary(lat_ms)}
    record["wall_s"] = round(cpu.wall, 3)
    record.update(cpu.as_dict(per=n))
    record["raw_ms"] = [round(x, 3) for x in lat_ms]
    return record


def idle_run(eng: harness.Engine, seconds: float = 3.0) -> dict[str, Any]:
    """CPU with the engine running and nothing to do: the fixed cost (consumers polling,
    the broker answering empty fetches) that every throughput and latency number carries."""
    with CpuSpan(eng.pids) as cpu:
        time.sleep(seconds)
    return {
        "run": "idle",
        "wall_s": round(cpu.wall, 3),
        "cores_used": {n: round(s / cpu.wall, 3) for n, s in cpu.seconds().items()},
    }


def summarize(tp: list[dict[str, Any]], lat: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats (benchlib's fields, plus p90/max and CPU per workflow)."""
    med: dict[str, Any] = {}
    for key in ("workflows_per_s", "activities_per_s", "start_rate_per_s", "total_s"):
        if tp:
            med[key] = round(median(r[key] for r in tp), 2)
    for key in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"):
        if lat:
            med[key] = round(median(r[key] for r in lat), 3)
    for kind, runs in (("throughput", tp), ("latency", lat)):
        if runs:
            names = runs[0]["cpu_ms_per_workflow"].keys()
            med[f"cpu_ms_per_workflow_{kind}"] = {
                name: round(median(r["cpu_ms_per_workflow"][name] for r in runs), 3)
                for name in names
            }
            med[f"machine_avg_busy_cores_{kind}"] = round(
                statistics.median(r["machine_avg_busy_cores"] for r in runs), 3
            )
    return med


def _short(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "raw_ms"}


def measure(client: Client, eng: harness.Engine, params: Params) -> dict[str, Any]:
    """Warm-up, then ``repeats`` x (throughput, latency)."""
    if params.warmup:
        progress(f"chain3.{params.variant}: warm-up {params.warmup} + {min(params.warmup, 50)}")
        throughput_run(client, eng, params, params.warmup, "warmup")
        latency_run(client, eng, params, min(params.warmup, 50), "warmup")
    idle = idle_run(eng)
    emit({"benchmark": "chain3", "variant": params.variant, "kind": "idle", **idle})
    tp: list[dict[str, Any]] = []
    lat: list[dict[str, Any]] = []
    for run in range(params.repeats):
        rec = throughput_run(client, eng, params, params.n_throughput, run)
        emit({"benchmark": "chain3", "variant": params.variant, "kind": "throughput", **rec})
        progress(f"chain3.{params.variant} throughput run {run}: {rec['workflows_per_s']} wf/s")
        tp.append(rec)
        rec = latency_run(client, eng, params, params.n_latency, run)
        emit({"benchmark": "chain3", "variant": params.variant, "kind": "latency", **_short(rec)})
        progress(f"chain3.{params.variant} latency run {run}: p50 {rec['p50_ms']} ms")
        lat.append(rec)
    return {
        "idle": idle,
        "throughput_runs": tp,
        "latency_runs": lat,
        "median": summarize(tp, lat),
    }


def warm_up_broker(broker: harness.Broker, partitions: int, rounds: int = 3) -> None:
    """Unrecorded traffic through a freshly started broker before anything is measured.

    A new broker JVM is slow until its JIT has compiled the hot paths: without this, the
    first measured throughput run came out at a third of the later ones, which says
    something about JVM start-up, not about the engine. A long-running broker is the
    realistic case, so it is warmed once per broker, in a namespace of its own.
    """
    params = Params(variant="inline", partitions=partitions)
    progress(f"warming up the broker ({rounds} x 1000 + 100 chain3.inline, not recorded)")
    with (
        harness.engine(broker, "warmup", MODULE, partitions, with_worker=False) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        for _ in range(rounds):
            throughput_run(client, eng, params, 1000, "broker-warmup")
            latency_run(client, eng, params, 100, "broker-warmup")


def run(broker: harness.Broker, params: Params) -> dict[str, Any]:
    """One variant end to end, in a fresh namespace with its own engine processes. The
    result names the brokers and the topics' replication as the cluster describes them
    after the run (Kafka's transaction and offset topics exist by then)."""
    with (
        harness.engine(
            broker,
            f"chain3-{params.variant}",
            MODULE,
            params.partitions,
            with_worker=params.variant == "activities",
            pin=params.pin,
        ) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        measured = measure(client, eng, params)
    measured["processor_progress"] = eng.processor_progress
    replication = harness.topic_replication(eng.settings)
    result = {
        "benchmark": "chain3",
        "variant": params.variant,
        "workflow": params.workflow,
        "params": asdict(params),
        **asdict(replication),
        "host": host_info(),
        "commit": git_commit(),
        **measured,
    }
    emit({k: v for k, v in result.items() if k not in ("throughput_runs", "latency_runs")})
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n-throughput", type=int, default=1000)
    parser.add_argument("--n-latency", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument(
        "--pin",
        action="store_true",
        help="pin the processor to CPU 0, the worker and the client to CPU 1",
    )


def params_from(args: argparse.Namespace, variant: str) -> Params:
    return Params(
        variant=variant,
        n_throughput=args.n_throughput,
        n_latency=args.n_latency,
        repeats=args.repeats,
        warmup=args.warmup,
        partitions=args.partitions,
        pin=args.pin,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=[*WORKFLOWS, "both"], default="both")
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="start a private local cluster of this many brokers (3: replication factor 3, "
        "min.insync.replicas 2); rows go to results/chain3-cluster.jsonl",
    )
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.brokers > 1 and args.bootstrap_servers:
        parser.error("--brokers starts a private cluster; give it or --bootstrap-servers")
    variants = list(WORKFLOWS) if args.variant == "both" else [args.variant]
    import results_md

    with harness.kafka(args.bootstrap_servers, brokers=args.brokers) as broker:
        if broker.started_here:
            warm_up_broker(broker, args.partitions)
        for variant in variants:
            result = run(broker, params_from(args, variant))
            if args.no_results_md:
                continue
            if result["brokers"] > 1:
                results_md.add_chain3_cluster(result, single=None)
            else:
                results_md.add_chain3(result, peer=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
