"""More instances in flight than the cache holds: chain3 with activities, before and after.

Each *arm* starts ``--instances`` chain3.activities workflows at once (so that many are in
flight, each taking four turns) against a processor whose cache budget
(``cache_instances``) holds only ``--cache`` of them, and waits for all. It records
workflows/s, the processor's CPU per workflow and its cache hits and misses per turn (a
miss of a running instance is a replay of its history).

The A/B runs the arms interleaved on one broker, so load changes on a shared machine hit
them alike, and reports per-round ratios and their median:

- *before*: the baseline commit (exported with ``git archive``, this script copied in);
- *after*: this checkout;
- *after, fits*: this checkout with a cache that holds every instance in flight, the
  reference for "no throughput cliff when instances in flight exceed the cache".

    .venv/bin/python benchmarks/cache_pressure.py --baseline REV [--instances 4000] \\
        [--cache 2000] [--rounds 2] [--bootstrap-servers HOST:PORT]

The ratio of in-flight instances to cache is what matters, not the absolute numbers:
4,000 in flight over a 2,000 budget is the 20,000-over-10,000 case at a size that runs
in minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import chain3
import harness
from common import REPO, git_commit, host_info, machine_line, progress

from engine.client import Client

ARMS = ("before", "after", "after, fits")


def run_arm(bootstrap: str, instances: int, cache: int, partitions: int) -> dict[str, Any]:
    """One arm in this process's checkout: a fresh namespace, processor and worker."""
    os.environ["TURNSTILE_CACHE_INSTANCES"] = str(cache)
    params = chain3.Params(variant="activities", partitions=partitions, timeout_s=900.0)
    broker = harness.Broker(bootstrap)
    with (
        harness.engine(broker, "cache", chain3.MODULE, partitions, with_worker=True) as eng,
        Client(settings=eng.settings, timeout=60) as client,
    ):
        chain3.throughput_run(client, eng, params, 100, "warmup")
        measured = chain3.throughput_run(client, eng, params, instances, 0)
    totals = eng.processor_progress or {}
    hits, misses = totals.get("cache_hits", 0.0), totals.get("cache_misses", 0.0)
    return {
        "workflows_per_s": measured["workflows_per_s"],
        "processor_cpu_ms_per_wf": measured["cpu_ms_per_workflow"]["processor"],
        "misses_per_lookup": round(misses / (hits + misses), 3) if hits + misses else None,
        "commit": git_commit(),
    }


def export_baseline(revision: str, into: Path) -> Path:
    """The baseline's tree in a folder of its own, with this script copied in."""
    archive = subprocess.run(
        ["git", "archive", revision], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.copy(Path(__file__), into / "benchmarks" / Path(__file__).name)
    return into


def _arm_in(checkout: Path, args: argparse.Namespace, bootstrap: str, cache: int) -> dict[str, Any]:
    command = [
        sys.executable, str(checkout / "benchmarks" / Path(__file__).name), "--arm",
        "--bootstrap-servers", bootstrap, "--instances", str(args.instances),
        "--cache", str(cache), "--partitions", str(args.partitions),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    load = round(os.getloadavg()[0], 2)
    done = subprocess.run(
        command, cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the arm in {checkout} failed:\n{done.stderr[-3000:]}")
    [line] = [x for x in done.stdout.splitlines() if x.startswith('{"arm"')]
    return {**json.loads(line)["arm"], "load": load}


def ab(args: argparse.Namespace) -> dict[str, Any]:
    """The three arms, interleaved, ``rounds`` times; medians and per-round ratios."""
    folder = Path(tempfile.mkdtemp(prefix="turnstile-bench-baseline-"))
    try:
        baseline = export_baseline(args.baseline, folder)
        checkouts = {"before": baseline, "after": REPO, "after, fits": REPO}
        caches = {"before": args.cache, "after": args.cache, "after, fits": 2 * args.instances}
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        with harness.kafka(args.bootstrap_servers) as broker:
            for round_ in range(args.rounds):
                for arm in ARMS:
                    result = _arm_in(checkouts[arm], args, broker.bootstrap, caches[arm])
                    progress(f"round {round_} {arm}: {result}")
                    runs[arm].append(result)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    base = subprocess.run(
        ["git", "rev-parse", "--short", args.baseline], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    return {"runs": runs, "base_commit": base or args.baseline, **_ratios(runs)}


def _ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def median_ratio(key: str, top: str, bottom: str) -> float:
        pairs = zip(runs[top], runs[bottom], strict=True)
        return round(statistics.median(t[key] / b[key] for t, b in pairs), 3)

    def median_of(arm: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[arm]), 3)

    return {
        "median": {
            arm: {k: median_of(arm, k) for k in ("workflows_per_s", "processor_cpu_ms_per_wf")}
            | {"misses_per_lookup": median_of(arm, "misses_per_lookup")}
            for arm in ARMS
        },
        "after_over_before": {
            "workflows_per_s": median_ratio("workflows_per_s", "after", "before"),
            "processor_cpu_ms_per_wf": median_ratio("processor_cpu_ms_per_wf", "after", "before"),
        },
        "over_cache_over_fits": {
            "workflows_per_s": median_ratio("workflows_per_s", "after", "after, fits"),
        },
    }


def add_row(result: dict[str, Any]) -> None:
    """The run's row in ``benchmarks/results/cache-pressure.jsonl`` (and RESULTS.md)."""
    import results_md

    med, params = result["median"], result["params"]

    def three(key: str) -> str:
        return " / ".join(str(med[arm][key]) for arm in ARMS)

    cells = [
        str(result["host"]["date_utc"]).replace("T", " ").rstrip("Z"),
        f"{result['base_commit']} -> {result['commit']}",
        machine_line(result["host"]),
        " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        f"instances={params['instances']}, cache={params['cache']}, "
        f"partitions={params['partitions']}, rounds={params['rounds']}",
        three("workflows_per_s"),
        f"{result['after_over_before']['workflows_per_s']:.2f}x",
        f"{result['over_cache_over_fits']['workflows_per_s']:.2f}",
        f"{three('processor_cpu_ms_per_wf')} "
        f"({result['after_over_before']['processor_cpu_ms_per_wf']:.2f}x before)",
        three("misses_per_lookup"),
    ]
    results_md.append_record(results_md.make_record("cache-pressure", cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="the commit to compare against")
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--instances", type=int, default=4000, help="in flight at once")
    parser.add_argument("--cache", type=int, default=2000, help="the cache budget")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arm", action="store_true", help="run one arm here (used by the A/B)")
    parser.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    args = parser.parse_args(argv)
    if args.arm:
        arm = run_arm(args.bootstrap_servers, args.instances, args.cache, args.partitions)
        print(json.dumps({"arm": arm}), flush=True)
        return 0
    result = {"params": vars(args), "host": host_info(), "commit": git_commit(), **ab(args)}
    print(json.dumps({"benchmark": "cache-pressure", **result}))
    if not args.no_results_md:
        add_row(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
