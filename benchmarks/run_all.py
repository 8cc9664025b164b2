"""Every benchmark in one command: chain3 (inline, activities), fan-out, replay, restore,
restart, scale, and chain3 on a 3-broker cluster.

    .venv/bin/python benchmarks/run_all.py            # full sizes, adds to benchmarks/results/
    .venv/bin/python benchmarks/run_all.py --peers    # also Restate, DBOS, Temporal: ratios
    .venv/bin/python benchmarks/run_all.py --quick    # reduced sizes: a smoke run

It starts its own Kafka broker (in a fresh temporary folder, stopped at the end) unless
``--bootstrap-servers`` is given, and the engine processes for each benchmark. Results are
JSON lines on stdout, progress on stderr. Order matters on two shared cores: the peers run
first and have stopped before anything of ours starts; replay (CPU only) runs before the
broker starts; nothing runs concurrently with anything else. chain3 on a cluster
(``cluster``) runs last, on a private local cluster of three brokers started once the
single broker has stopped, and its rows carry the ratios to the single-broker chain3 of
the same run.

A ``--quick`` run does not touch RESULTS.md unless ``--results-md`` is given: smoke-run
numbers are not results.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import chain3
import fanout
import harness
import peers
import replay
import restart
import restore
import results_md
import scale
from common import emit, git_commit, host_info, progress

BENCHMARKS = ("chain3", "fanout", "replay", "restore", "restart", "scale", "cluster")
#: The benchmarks that run on the single broker (``run_kafka_benchmarks``).
SINGLE_BROKER = {"chain3", "fanout", "restore", "restart", "scale"}
#: The brokers of the ``cluster`` run (replication factor 3, ``min.insync.replicas`` 2).
CLUSTER_BROKERS = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes, a smoke run")
    parser.add_argument("--peers", action="store_true", help="run Restate, DBOS and Temporal first")
    parser.add_argument("--peers-tmp", type=Path, default=peers.DEFAULT_TMP)
    parser.add_argument(
        "--temporal-full", action="store_true", help="with --peers: Temporal at full sizes"
    )
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run only these")
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a private one")
    parser.add_argument("--partitions", type=int, default=8, help="partitions per topic (8)")
    parser.add_argument(
        "--pin", action="store_true", help="pin the processor to CPU 0, worker and client to 1"
    )
    parser.add_argument("--restore-instances", type=int, help="instances for restore (100000)")
    md = parser.add_mutually_exclusive_group()
    md.add_argument("--results-md", action="store_true", help="append rows even with --quick")
    md.add_argument("--no-results-md", action="store_true", help="do not touch RESULTS.md")
    return parser.parse_args(argv)


def chain3_params(args: argparse.Namespace, variant: str) -> chain3.Params:
    params = chain3.Params(variant=variant, partitions=args.partitions, pin=args.pin)
    if args.quick:
        params = replace(params, n_throughput=200, n_latency=50, repeats=1, warmup=20)
    return params


def fanout_params(args: argparse.Namespace) -> fanout.Params:
    params = fanout.Params(partitions=args.partitions)
    return replace(params, n=200, repeats=1) if args.quick else params


def restore_params(args: argparse.Namespace) -> restore.Params:
    default = 10_000 if args.quick else 100_000
    return restore.Params(args.restore_instances or default, args.partitions)


def run_scale(args: argparse.Namespace, broker: harness.Broker) -> dict[str, Any]:
    """chain3 at 8 and 32 partitions, one and two replicas (benchmarks/scale.py)."""
    params = scale.Params(pin=args.pin)
    if args.quick:
        params = replace(params, rounds=1, n_throughput=200, n_latency=30, warmup=20)
    return scale.run(broker, params, list(chain3.WORKFLOWS))


def attempt(name: str, fn: Callable[[], Any], failures: list[str]) -> Any:
    """Run one benchmark; a failure is reported and the others still run."""
    try:
        return fn()
    except Exception as exc:
        progress(f"{name} FAILED: {exc}")
        failures.append(f"{name}: {exc}".splitlines()[0])
        return None


def run_kafka_benchmarks(
    args: argparse.Namespace, wanted: set[str], failures: list[str]
) -> dict[str, Any]:
    """chain3, fan-out, restore and restart, one after the other against one broker."""
    out: dict[str, Any] = {}
    with harness.kafka(args.bootstrap_servers) as broker:
        if broker.pid is not None and not args.quick:
            attempt(
                "broker warm-up", lambda: chain3.warm_up_broker(broker, args.partitions), failures
            )
        if "chain3" in wanted:
            for variant in chain3.WORKFLOWS:
                params = chain3_params(args, variant)
                result = attempt(f"chain3.{variant}", partial(chain3.run, broker, params), failures)
                if result is not None:
                    out.setdefault("chain3", []).append(result)
        if "fanout" in wanted:
            progress("fan-out")
            result = attempt("fanout", lambda: fanout.run(broker, fanout_params(args)), failures)
            if result is not None:
                out["fanout"] = result
        if "restore" in wanted:
            result = attempt("restore", lambda: restore.run(broker, restore_params(args)), failures)
            if result is not None:
                out["restore"] = result
        if "restart" in wanted:
            params = restart.Params(repeats=1 if args.quick else 3, partitions=args.partitions)
            result = attempt("restart", lambda: restart.run(broker, params), failures)
            if result is not None:
                out["restart"] = result
        if "scale" in wanted:
            result = attempt("scale", lambda: run_scale(args, broker), failures)
            if result is not None:
                out["scale"] = result
    return out


def run_cluster(args: argparse.Namespace, failures: list[str]) -> list[dict[str, Any]]:
    """chain3 (inline, activities) on a private local cluster of three brokers, warmed up
    like the single broker; always a cluster of its own, even with ``--bootstrap-servers``."""
    out: list[dict[str, Any]] = []
    with harness.kafka(brokers=CLUSTER_BROKERS) as cluster:
        if not args.quick:
            attempt(
                "cluster warm-up",
                lambda: chain3.warm_up_broker(cluster, args.partitions),
                failures,
            )
        for variant in chain3.WORKFLOWS:
            params = chain3_params(args, variant)
            result = attempt(
                f"cluster chain3.{variant}", partial(chain3.run, cluster, params), failures
            )
            if result is not None:
                out.append(result)
    return out


def single_broker(result: dict[str, Any], out: dict[str, Any]) -> dict[str, Any] | None:
    """The single-broker chain3 result of the same variant in this run, if it ran."""
    return next((r for r in out.get("chain3", []) if r["variant"] == result["variant"]), None)


def peer_baseline(result: dict[str, Any], peer_results: dict[str, Any]) -> dict[str, Any] | None:
    """The peer median our variant is compared with in RESULTS.md (None if it did not run)."""
    stem = peers.BASELINE.get(result["variant"])
    peer = peer_results.get(stem or "")
    return None if peer is None else dict(peer.get("median", {}))


def write_results_md(out: dict[str, Any], peer_results: dict[str, Any]) -> None:
    for result in out.get("chain3", []):
        comparison = peers.ratios(result, peer_results) if peer_results else None
        results_md.add_chain3(result, peer_baseline(result, peer_results), comparison)
    for result in out.get("cluster", []):
        results_md.add_chain3_cluster(result, single_broker(result, out))
    if "fanout" in out:
        results_md.add_fanout(out["fanout"])
    if "replay" in out:
        results_md.add_replay(out["replay"])
    if "restore" in out:
        results_md.add_restore(out["restore"])
    for result in out.get("restart", []):
        results_md.add_restart(result)
    if "scale" in out:
        results_md.add_scale(out["scale"])
    if peer_results:
        results_md.add_peers(list(peer_results.values()), host_info())
    progress(f"rows added to {results_md.RESULTS_DIR}, {results_md.PATH} written again")


def summary(out: dict[str, Any], peer_outcome: dict[str, Any] | None) -> dict[str, Any]:
    """The headline numbers of the whole run, with ratios to the peers when they ran."""
    peer_results = (peer_outcome or {}).get("results", {})
    lines: dict[str, Any] = {}
    targets: dict[str, str] = {}
    for result in out.get("chain3", []):
        entry = {"median": result["median"]}
        if peer_results:
            entry["ratios"] = compared = peers.ratios(result, peer_results)
            for label, target in compared["targets"].items():
                targets[f"chain3.{result['variant']} {label}"] = (
                    f"{target['verdict']} ({target['ratio']}x)"
                )
        lines[f"chain3.{result['variant']}"] = entry
    for result in out.get("cluster", []):
        lines[f"cluster.chain3.{result['variant']}"] = {
            "median": result["median"],
            **{k: result[k] for k in ("brokers", "replication_factor", "min_insync_replicas")},
        }
    if targets:
        lines["targets"] = targets
    if "fanout" in out:
        lines["fanout"] = out["fanout"]["median"]
    if "replay" in out:
        lines["replay"] = out["replay"]["workloads"]
    if "restore" in out:
        r = out["restore"]
        lines["restore"] = {k: r[k] for k in ("restore_s", "instances_per_s", "records_per_s")}
    if "scale" in out:
        lines["scale"] = [
            {k: r[k] for k in ("variant", "layout", "ratio_wf_s", "ratio_p50")}
            | {"workflows_per_s": r["median"]["workflows_per_s"]}
            for r in out["scale"]["rows"]
        ]
    if peer_outcome is not None:
        lines["peers"] = {
            k: {**v.get("median", {}), "params": v.get("params")} for k, v in peer_results.items()
        }
        lines["peers_failed"] = peer_outcome["failed"]
    return {"benchmark": "summary", "commit": git_commit(), "host": host_info(), **lines}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    wanted = set(args.only or BENCHMARKS)
    peer_outcome = (
        peers.run_peers(args.peers_tmp, args.quick, args.temporal_full) if args.peers else None
    )
    out: dict[str, Any] = {}
    failures: list[str] = []
    if "replay" in wanted:
        progress("replay")
        result = attempt("replay", lambda: replay.run(1000, 0.5 if args.quick else 2.0), failures)
        if result is not None:
            out["replay"] = result
    if wanted & SINGLE_BROKER:
        out.update(run_kafka_benchmarks(args, wanted, failures))
    if "cluster" in wanted:
        progress(f"chain3 on a cluster of {CLUSTER_BROKERS} brokers")
        cluster = attempt("cluster", lambda: run_cluster(args, failures), failures)
        if cluster:
            out["cluster"] = cluster
    final = summary(out, peer_outcome)
    final["failed"] = failures
    emit(final)
    if args.results_md or (not args.quick and not args.no_results_md):
        write_results_md(out, (peer_outcome or {}).get("results", {}))
    for failure in failures:
        progress(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
