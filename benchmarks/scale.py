"""chain3 at 8 and 32 partitions and with 2 processor replicas: does throughput hold up?

Three layouts per chain3 variant (``inline`` and ``activities``, see ``chain3.py``):

- ``p8-r1``: 8 partitions, one processor replica;
- ``p32-r1``: 32 partitions, one replica (four times the partitions, same work);
- ``p32-r2``: 32 partitions, two replicas of one consumer group (16 partitions each).

Each layout runs in a fresh namespace with its own processes, warmed up, then measured once
per round (chain3's throughput run, then its latency run); the layouts are interleaved
(round 1: every layout in turn, round 2: again, ...), so a change in the machine's load hits
them alike, and the medians over the rounds are compared as ratios to ``p8-r1`` of the same
variant. Every processor serves its metrics, which are scraped before and after each
throughput run: transactions per second, input records and output records per transaction,
and seconds per transaction phase come from there.

Replicas are not pinned by default (the kernel places them on the two cores); ``--pin`` puts
replica i on CPU i mod 2 and the worker and client on CPU 1. On a 2-core machine two replicas
share the cores with the broker, the worker and the client, so ``p32-r2`` shows the cost of a
second transaction stream and of a rebalanced group, not a second machine's capacity.

    .venv/bin/python benchmarks/scale.py [--rounds 3] [--variant inline|activities|both]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import chain3
import harness
from common import emit, git_commit, host_info, median, progress

from engine.client import Client
from engine.core.errors import BrokerError


@dataclass(frozen=True)
class Layout:
    """Partitions per topic and processor replicas of one measured configuration."""

    partitions: int
    replicas: int

    @property
    def name(self) -> str:
        return f"p{self.partitions}-r{self.replicas}"


LAYOUTS = (Layout(8, 1), Layout(32, 1), Layout(32, 2))
BASELINE = LAYOUTS[0]


@dataclass(frozen=True)
class Params:
    rounds: int = 3
    n_throughput: int = 1000
    n_latency: int = 100
    warmup: int = 100
    pin: bool = False
    ready_timeout_s: float = 120.0


# --- processor metrics --------------------------------------------------------------------

#: The processor's metrics a throughput run reads (sums over label values where labelled).
_METRICS = {
    "transactions": "turnstile_transactions_total",
    "aborts": "turnstile_transaction_aborts_total",
    "records_out": "turnstile_records_out_total",
    "records_in": "turnstile_batch_records_sum",
    "batches": "turnstile_batch_records_count",
    "step_s": "turnstile_turn_duration_seconds_sum",
}
_PHASE = "turnstile_transaction_phase_seconds_sum"


def scrape(port: int) -> dict[str, float]:
    """The counters above, and ``<phase>_s`` per transaction phase, from one /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    wanted = {metric: name for name, metric in _METRICS.items()}
    out: dict[str, float] = dict.fromkeys(_METRICS, 0.0)
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, value = line.rpartition(" ")
        base, _, labels = metric.partition("{")
        if base in wanted:
            out[wanted[base]] += float(value)
        elif base == _PHASE and 'phase="' in labels:
            phase = labels.split('phase="', 1)[1].split('"', 1)[0]
            out[f"{phase}_s"] = out.get(f"{phase}_s", 0.0) + float(value)
    return out


def transaction_stats(
    before: list[dict[str, float]], after: list[dict[str, float]], wall_s: float
) -> dict[str, Any]:
    """Per run, summed over the replicas: transactions/s, records per transaction, and the
    seconds each transaction phase took on average (ms)."""
    delta: dict[str, float] = {}
    per_replica: list[float] = []
    for b, a in zip(before, after, strict=True):
        for key, value in a.items():
            delta[key] = delta.get(key, 0.0) + value - b.get(key, 0.0)
        per_replica.append(a["transactions"] - b["transactions"])
    tx = delta["transactions"] or 1.0
    out: dict[str, Any] = {
        "transactions": int(delta["transactions"]),
        "transactions_by_replica": [int(x) for x in per_replica],
        "aborts": int(delta["aborts"]),
        "transactions_per_s": round(delta["transactions"] / wall_s, 2),
        "records_in_per_tx": round(delta["records_in"] / tx, 2),
        "records_out_per_tx": round(delta["records_out"] / tx, 2),
        "step_ms_per_tx": round(delta["step_s"] * 1000 / tx, 3),
    }
    for phase in ("produce", "offsets", "commit"):
        out[f"{phase}_ms_per_tx"] = round(delta.get(f"{phase}_s", 0.0) * 1000 / tx, 3)
    return out


# --- the engine of one layout -------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ScaleEngine:
    """The processes of one layout, and each replica's metrics port."""

    eng: harness.Engine
    ports: list[int]

    def scrape_all(self) -> list[dict[str, float]]:
        return [scrape(port) for port in self.ports]


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as reply:
            return int(reply.status) == 200
    except OSError:
        return False


def _wait_ready(se: ScaleEngine, timeout: float) -> None:
    """Every replica has restored an assignment (with two, the group has rebalanced)."""
    deadline = time.monotonic() + timeout
    while not all(_ready(port) for port in se.ports):
        se.eng.check_alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"replicas not ready within {timeout:.0f}s\n{se.eng.describe()}")
        time.sleep(0.5)


@contextlib.contextmanager
def engine(
    broker: harness.Broker, variant: str, layout: Layout, params: Params
) -> Iterator[ScaleEngine]:
    """Fresh namespace and topics, ``layout.replicas`` processors (and a worker)."""
    namespace = harness.fresh_namespace(f"scale-{variant}-{layout.name}")
    settings = harness.create_topics(broker.bootstrap, namespace, layout.partitions)
    work_dir = Path(tempfile.mkdtemp(prefix="turnstile-bench-scale-"))
    progress(f"{variant} {layout.name}: namespace {namespace}, files in {work_dir}")
    processes: list[harness.EngineProcess] = []
    ports: list[int] = []
    failed = True
    try:
        for i in range(layout.replicas):
            ports.append(_free_port())
            process = harness.spawn(
                "processor",
                settings,
                chain3.MODULE,
                work_dir,
                ["--metrics-port", str(ports[-1])],
                cpu=i % 2 if params.pin else None,
                replica_id=f"processor-{i}",
            )
            process.role = f"processor-{i}"
            processes.append(process)
        if variant == "activities":
            processes.append(
                harness.spawn(
                    "worker", settings, chain3.MODULE, work_dir, cpu=1 if params.pin else None
                )
            )
        if params.pin:
            os.sched_setaffinity(0, {1})
        se = ScaleEngine(harness.Engine(settings, work_dir, processes, broker.pid), ports)
        _wait_ready(se, params.ready_timeout_s)
        yield se
        failed = False
    finally:
        for process in reversed(processes):
            process.stop()
        if params.pin:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        progresses = [harness.final_progress(p.log_path) for p in processes if p.role != "worker"]
        progress(f"{variant} {layout.name}: processor totals {progresses}")
        if failed:
            shutil.rmtree(work_dir / "state", ignore_errors=True)
            progress(f"kept the engine's logs for inspection: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)


# --- one round of one layout ----------------------------------------------------------------


@contextlib.contextmanager
def open_client(se: ScaleEngine, attempts: int = 10) -> Iterator[Client]:
    """A client for the layout's namespace. Right after the topics were created a busy
    broker may not have elected their leaders yet (the client's first offsets read then
    fails with NOT_LEADER_FOR_PARTITION), so the first reads are retried for a while."""
    for attempt in range(attempts):
        try:
            client = Client(settings=se.eng.settings, timeout=60)
            break
        except BrokerError as exc:
            if attempt == attempts - 1:
                raise
            progress(f"client not ready yet ({str(exc).splitlines()[0][:120]}); retrying")
            time.sleep(2.0)
    with client:
        yield client


def warm_up_broker(broker: harness.Broker, params: Params) -> None:
    """Unrecorded chain3.inline traffic through a fresh broker first (its JIT warms up; see
    ``chain3.warm_up_broker``)."""
    cparams = chain3.Params(variant="inline")
    progress("warming up the broker (2 x 1000 + 100 chain3.inline, not recorded)")
    with engine(broker, "inline", BASELINE, params) as se, open_client(se) as client:
        for _ in range(2):
            chain3.throughput_run(client, se.eng, cparams, 1000, "broker-warmup")
        chain3.latency_run(client, se.eng, cparams, 100, "broker-warmup")


def cpu_ms(record: dict[str, Any]) -> dict[str, float]:
    """CPU ms per workflow by process, with the replicas also summed as ``processors``."""
    cpu = dict(record["cpu_ms_per_workflow"])
    cpu["processors"] = round(sum(v for k, v in cpu.items() if k.startswith("processor-")), 3)
    return cpu


def measure_once(
    variant: str, layout: Layout, params: Params, broker: harness.Broker, rnd: int
) -> dict[str, Any]:
    """A fresh engine for the layout: warm-up, then one throughput and one latency run."""
    cparams = chain3.Params(
        variant=variant, n_throughput=params.n_throughput, n_latency=params.n_latency
    )
    with engine(broker, variant, layout, params) as se, open_client(se) as client:
        chain3.throughput_run(client, se.eng, cparams, params.warmup, "warmup")
        chain3.latency_run(client, se.eng, cparams, min(params.warmup, 50), "warmup")
        before = se.scrape_all()
        tp = chain3.throughput_run(client, se.eng, cparams, params.n_throughput, rnd)
        after = se.scrape_all()
        lat = chain3.latency_run(client, se.eng, cparams, params.n_latency, rnd)
    record = {
        "benchmark": "scale",
        "variant": variant,
        "layout": layout.name,
        "partitions": layout.partitions,
        "replicas": layout.replicas,
        "round": rnd,
        "workflows_per_s": tp["workflows_per_s"],
        "total_s": tp["total_s"],
        "cpu_ms_per_workflow_throughput": cpu_ms(tp),
        "machine_avg_busy_cores": tp["machine_avg_busy_cores"],
        **transaction_stats(before, after, tp["total_s"]),
        "p50_ms": lat["p50_ms"],
        "p90_ms": lat["p90_ms"],
        "p99_ms": lat["p99_ms"],
        "cpu_ms_per_workflow_latency": cpu_ms(lat),
    }
    emit(record)
    progress(
        f"scale {variant} {layout.name} round {rnd}: {record['workflows_per_s']} wf/s, "
        f"p50 {record['p50_ms']} ms, {record['transactions_per_s']} tx/s, "
        f"{record['records_in_per_tx']} records in/tx"
    )
    return record


_MEDIAN_KEYS = (
    "workflows_per_s", "p50_ms", "p90_ms", "p99_ms", "transactions_per_s",
    "records_in_per_tx", "records_out_per_tx", "step_ms_per_tx", "produce_ms_per_tx",
    "offsets_ms_per_tx", "commit_ms_per_tx", "machine_avg_busy_cores",
)  # fmt: skip


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds of one (variant, layout)."""
    med: dict[str, Any] = {k: round(median(r[k] for r in runs), 3) for k in _MEDIAN_KEYS}
    for kind in ("throughput", "latency"):
        key = f"cpu_ms_per_workflow_{kind}"
        names = runs[0][key].keys()
        med[key] = {n: round(statistics.median(r[key].get(n, 0.0) for r in runs), 3) for n in names}
    return med


def run(broker: harness.Broker, params: Params, variants: list[str]) -> dict[str, Any]:
    """Every (variant, layout), interleaved round by round; medians and ratios to p8-r1."""
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rnd in range(params.rounds):
        for variant in variants:
            for layout in LAYOUTS:
                record = measure_once(variant, layout, params, broker, rnd)
                runs.setdefault((variant, layout.name), []).append(record)
    rows: list[dict[str, Any]] = []
    for variant in variants:
        base = summarize(runs[(variant, BASELINE.name)])
        for layout in LAYOUTS:
            med = summarize(runs[(variant, layout.name)])
            rows.append(
                {
                    "variant": variant,
                    "layout": layout.name,
                    "partitions": layout.partitions,
                    "replicas": layout.replicas,
                    "median": med,
                    "ratio_wf_s": round(med["workflows_per_s"] / base["workflows_per_s"], 3),
                    "ratio_p50": round(med["p50_ms"] / base["p50_ms"], 3),
                }
            )
    result = {
        "benchmark": "scale",
        "params": asdict(params),
        "host": host_info(),
        "commit": git_commit(),
        "load_average": load_average(),
        "rows": rows,
    }
    emit(result)
    return result


def load_average() -> str:
    """The 1/5/15-minute load averages: how busy the shared machine was around the run."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def params_from(args: argparse.Namespace) -> Params:
    params = Params(
        rounds=args.rounds,
        n_throughput=args.n_throughput,
        n_latency=args.n_latency,
        warmup=args.warmup,
        pin=args.pin,
    )
    return params


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every layout (3)")
    parser.add_argument("--n-throughput", type=int, default=1000)
    parser.add_argument("--n-latency", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument(
        "--pin", action="store_true", help="pin replica i to CPU i mod 2, worker and client to 1"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=[*chain3.WORKFLOWS, "both"], default="both")
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    add_arguments(parser)
    args = parser.parse_args(argv)
    variants = list(chain3.WORKFLOWS) if args.variant == "both" else [args.variant]
    import results_md

    with harness.kafka(args.bootstrap_servers) as broker:
        if broker.pid is not None:
            warm_up_broker(broker, params_from(args))
        result = run(broker, params_from(args), variants)
    if not args.no_results_md:
        results_md.add_scale(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
