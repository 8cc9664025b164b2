"""The peers (Restate, DBOS) on the same machine in the same session, for ratios.

The machine is shared and noisy, so an absolute number from another day says little; a
ratio to a peer measured minutes apart on the same machine says more. This runs the peers'
own ``run_all.sh`` (it installs what it needs under ``PEERS_TMP`` and stops its servers at
the end; it never runs at the same time as the engine's benchmarks), reads their result
files and computes our chain3 numbers as ratios to theirs.

    .venv/bin/python benchmarks/peers.py [--peers-tmp DIR] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import PEERS_DIR, emit, progress

DEFAULT_TMP = Path(os.environ.get("TURNSTILE_PEERS_TMP", "/tmp/turnstile-bench-peers"))
#: The peer result each of our chain3 variants is compared with (file stem in results/).
BASELINE = {"inline": "restate-workflow", "activities": "restate-workflow"}
EXPECTED = ("restate-workflow", "dbos-start_workflow")
QUICK_ENV = {"N_THROUGHPUT": "200", "N_LATENCY": "50", "REPEATS": "1", "N_WARMUP": "20"}


def _clear_results(results: Path) -> None:
    """Old result files in our own PEERS_TMP would pass for this run's: remove them."""
    results.mkdir(parents=True, exist_ok=True)
    for stale in results.glob("*.json"):
        stale.unlink()


def run_peers(peers_tmp: Path = DEFAULT_TMP, quick: bool = False) -> dict[str, Any]:
    """Run every peer; returns their results by file stem and what failed."""
    script = PEERS_DIR / "run_all.sh"
    if not script.is_file():
        return {"results": {}, "failed": [f"{script} not found"]}
    results_dir = peers_tmp / "results"
    _clear_results(results_dir)
    env = {**os.environ, "PEERS_TMP": str(peers_tmp), "RESULTS_DIR": str(results_dir)}
    if quick:
        env.update(QUICK_ENV)
    progress(f"peers: bash {script} (PEERS_TMP={peers_tmp}); takes several minutes")
    code = _stream(["bash", str(script)], env, peers_tmp / "run_all.log")
    results = read_results(results_dir)
    failed = [f"{stem}: no result (see {results_dir})" for stem in EXPECTED if stem not in results]
    if code != 0:
        failed.append(f"run_all.sh exited with {code} (see {peers_tmp / 'run_all.log'})")
    for problem in failed:
        progress(f"peers: {problem}")
    return {"results": results, "failed": failed, "peers_tmp": str(peers_tmp)}


def _stream(command: list[str], env: dict[str, str], log_path: Path) -> int:
    """Run a command, copying its output to a log file and, as progress, to stderr."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        for line in process.stdout:
            log.write(line)
            print(f"  [peers] {line.rstrip()}", file=sys.stderr, flush=True)
        return process.wait()


def read_results(results_dir: Path) -> dict[str, dict[str, Any]]:
    """The peers' result files (those with a "peer" field), by file stem."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(data, dict) and "peer" in data:
            out[path.stem] = data
    return out


def ratios(chain3: dict[str, Any], peers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Our chain3 medians over a peer's: workflows/s (higher is better) and p50 (lower is
    better), against the baseline peer and every other peer that ran."""
    ours = chain3["median"]
    out: dict[str, Any] = {}
    for stem, peer in peers.items():
        theirs = peer.get("median", {})
        entry = {
            "peer_workflows_per_s": theirs.get("workflows_per_s"),
            "peer_p50_ms": theirs.get("p50_ms"),
            "workflows_per_s_ratio": _div(
                ours.get("workflows_per_s"), theirs.get("workflows_per_s")
            ),
            "p50_ratio": _div(ours.get("p50_ms"), theirs.get("p50_ms")),
        }
        out[stem] = entry
    return {"baseline": BASELINE.get(chain3["variant"]), "vs": out}


def _div(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers-tmp", type=Path, default=DEFAULT_TMP)
    parser.add_argument("--quick", action="store_true", help="reduced workload sizes")
    args = parser.parse_args(argv)
    outcome = run_peers(args.peers_tmp, args.quick)
    for stem, peer in outcome["results"].items():
        emit({"benchmark": "peer", "result": stem, "median": peer.get("median")})
    return 1 if outcome["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
