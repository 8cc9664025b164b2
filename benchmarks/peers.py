"""The peers (Restate, DBOS, Temporal) on the same machine in the same session, for ratios.

The machine is shared and noisy, so an absolute number from another day says little; a
ratio to a peer measured minutes apart on the same machine says more. This runs the peers
from ``../shared/peers`` one after the other in ``run_all.sh``'s order (each installs what it
needs under ``PEERS_TMP`` and stops its servers at the end; none runs at the same time as the
engine's benchmarks), then the peers' ``summarize.py``, reads their result files and computes
our chain3 numbers as ratios to theirs, with the performance targets marked met or not met.

Temporal runs as its ``run.sh`` does (``install.sh``, ``start.sh``, ``bench.py`` per
variant, ``stop.sh``), one variant at a time, so that each variant gets its own sizes and a
variant whose client fails does not take the others with it (its SDK can abort the client
process at exit after the result was written: such a result is kept, with a note). Its two
activity variants run at about 10 workflows/s, so at the peers' full sizes (1000 + 200, three
times) they alone take over 15 minutes; they get smaller counts through the peers' own knobs
(``TEMPORAL_SIZES``: ``N_THROUGHPUT``, ``N_LATENCY``) unless ``--temporal-full`` is given.
The sizes each result ran with are in its ``params``.

    .venv/bin/python benchmarks/peers.py [--peers-tmp DIR] [--quick] [--temporal-full]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import PEERS_DIR, emit, progress

DEFAULT_TMP = Path(os.environ.get("TURNSTILE_PEERS_TMP", "/tmp/turnstile-bench-peers"))
#: The peers in the order ``run_all.sh`` runs them.
PEERS = ("restate", "dbos", "temporal")
#: The peer results each of our chain3 variants is compared with (file stems in results/),
#: the first being the baseline of the RESULTS.md row: inline steps against the peers' inline
#: steps (Restate ``ctx.run``, DBOS steps, Temporal local activities); activities against
#: Restate and Temporal's activities, through matching (``-noeager``, what a broker topic to
#: workers is) and eagerly dispatched (its default).
COMPARED = {
    "inline": ("restate-workflow", "dbos-start_workflow", "temporal-local"),
    "activities": ("restate-workflow", "temporal-activities-noeager", "temporal-activities"),
}
BASELINE = {variant: stems[0] for variant, stems in COMPARED.items()}
EXPECTED = (
    "restate-workflow",
    "dbos-start_workflow",
    "temporal-local",
    "temporal-activities",
    "temporal-activities-noeager",
)
QUICK_ENV = {"N_THROUGHPUT": "200", "N_LATENCY": "50", "REPEATS": "1", "N_WARMUP": "20"}
#: Temporal's variants in ``run.sh``'s order, and the sizes of the slow ones in a full run:
#: half the throughput and half the latency count keep each ~10 workflows/s variant to about
#: 4 minutes, so a whole ``run_all.py --peers`` stays within about 40 minutes.
TEMPORAL_VARIANTS = ("activities", "activities-noeager", "local")
TEMPORAL_SIZES = {
    "activities": {"N_THROUGHPUT": "500", "N_LATENCY": "100"},
    "activities-noeager": {"N_THROUGHPUT": "500", "N_LATENCY": "100"},
}


@dataclass(frozen=True)
class Target:
    """One of the performance targets: our ``variant``'s ``metric`` over ``peer``'s, within
    ``bound`` (at least it for throughput, at most it for latency)."""

    variant: str
    metric: str
    peer: str
    bound: float

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "workflows_per_s"

    @property
    def label(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        name = "wf/s" if self.higher_is_better else "p50"
        return f"{name} {op} {self.bound:g}x {self.peer}"

    def verdict(self, ratio: float | None) -> str:
        if ratio is None:
            return "n/a (peer did not run)"
        met = ratio >= self.bound if self.higher_is_better else ratio <= self.bound
        return "met" if met else "not met"


TARGETS = (
    Target("activities", "workflows_per_s", "restate-workflow", 3.0),
    Target("activities", "workflows_per_s", "temporal-activities", 30.0),
    Target("activities", "p50_ms", "restate-workflow", 2.0),
    Target("inline", "workflows_per_s", "restate-workflow", 8.0),
    Target("inline", "p50_ms", "restate-workflow", 0.8),
)


def _clear_results(results: Path) -> None:
    """Old result files in our own PEERS_TMP would pass for this run's: remove them."""
    results.mkdir(parents=True, exist_ok=True)
    for stale in results.glob("*.json"):
        stale.unlink()


def peer_env(
    base: dict[str, str], quick: bool, sizes: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment a peer's benchmark runs with: the quick sizes for everyone, or the
    given reduced sizes (a size already set in our own environment wins)."""
    env = dict(base)
    if quick:
        env.update(QUICK_ENV)
    elif sizes:
        env.update({k: v for k, v in sizes.items() if k not in os.environ})
    return env


def _sizes(env: dict[str, str]) -> dict[str, str]:
    return {k: env[k] for k in ("N_THROUGHPUT", "N_LATENCY", "REPEATS") if k in env}


def run_peers(
    peers_tmp: Path = DEFAULT_TMP, quick: bool = False, temporal_full: bool = False
) -> dict[str, Any]:
    """Run every peer; returns their results by file stem and what failed."""
    missing = [p for p in PEERS if not (PEERS_DIR / p / "run.sh").is_file()]
    missing += [
        f for f in ("temporal/bench.py", "temporal/start.sh") if not (PEERS_DIR / f).is_file()
    ]
    if missing:
        where = ", ".join(str(PEERS_DIR / (p if "/" in p else f"{p}/run.sh")) for p in missing)
        return {"results": {}, "failed": [f"{where} not found (set PEERS_DIR)"]}
    results_dir = peers_tmp / "results"
    _clear_results(results_dir)
    base = {**os.environ, "PEERS_TMP": str(peers_tmp), "RESULTS_DIR": str(results_dir)}
    failed: list[str] = []
    for peer in ("restate", "dbos"):
        env = peer_env(base, quick)
        progress(f"peers: {peer} (PEERS_TMP={peers_tmp}, sizes {_sizes(env) or 'default'})")
        log_path = results_dir / f"{peer}-run.log"
        code = _stream(["bash", str(PEERS_DIR / peer / "run.sh")], env, log_path)
        if code != 0:
            failed.append(f"{peer}: run.sh exited with {code} (see {log_path})")
    failed += run_temporal(base, results_dir, quick, temporal_full)
    _summarize(results_dir, base)
    results = read_results(results_dir)
    failed += [f"{stem}: no result (see {results_dir})" for stem in EXPECTED if stem not in results]
    for problem in failed:
        progress(f"peers: {problem}")
    return {"results": results, "failed": failed, "peers_tmp": str(peers_tmp)}


def run_temporal(base: dict[str, str], results_dir: Path, quick: bool, full: bool) -> list[str]:
    """Temporal's ``run.sh``, one variant at a time; returns what failed."""
    here = PEERS_DIR / "temporal"
    log_path = results_dir / "temporal-run.log"
    log_path.write_text("")
    python = Path(base["PEERS_TMP"]) / "temporal-venv" / "bin" / "python"
    setup = [] if base.get("SKIP_INSTALL") == "1" else ["install.sh"]
    for script in (*setup, "start.sh"):
        code = _stream(["bash", str(here / script)], base, log_path, append=True)
        if code != 0:
            _stream(["bash", str(here / "stop.sh")], base, log_path, append=True)
            return [f"temporal: {script} exited with {code} (see {log_path})"]
    failed: list[str] = []
    try:
        for variant in TEMPORAL_VARIANTS:
            env = peer_env(base, quick, None if full else TEMPORAL_SIZES.get(variant))
            progress(f"peers: temporal {variant} (sizes {_sizes(env) or 'default'})")
            out = results_dir / f"temporal-{variant}.json"
            command = [str(python), str(here / "bench.py"), "--variant", variant, "--db", "file"]
            code = _stream([*command, "--out", str(out)], env, log_path, append=True)
            if code != 0 and out.is_file():
                progress(f"peers: temporal {variant}: bench.py exited with {code} after "
                         f"writing its result; the result is kept (see {log_path})")  # fmt: skip
            elif code != 0:
                failed.append(f"temporal {variant}: bench.py exited with {code} (see {log_path})")
    finally:
        _stream(["bash", str(here / "stop.sh")], base, log_path, append=True)
    return failed


def _summarize(results_dir: Path, env: dict[str, str]) -> None:
    """The peers' own markdown summary of the run, next to their results."""
    script = PEERS_DIR / "common" / "summarize.py"
    if script.is_file():
        _stream(["python3", str(script), str(results_dir)], env, results_dir / "summary.md")


def _stream(command: list[str], env: dict[str, str], log_path: Path, append: bool = False) -> int:
    """Run a command, copying its output to a log file and, as progress, to stderr."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a" if append else "w") as log:
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
    """Our chain3 medians over the peers' this variant is compared with: workflows/s
    (higher is better) and p50 (lower is better), and the variant's targets."""
    ours = chain3["median"]
    variant = chain3["variant"]
    vs: dict[str, Any] = {}
    for stem in COMPARED.get(variant, ()):
        theirs = peers.get(stem, {}).get("median", {})
        vs[stem] = {
            "peer_workflows_per_s": theirs.get("workflows_per_s"),
            "peer_p50_ms": theirs.get("p50_ms"),
            "workflows_per_s_ratio": _div(
                ours.get("workflows_per_s"), theirs.get("workflows_per_s")
            ),
            "p50_ratio": _div(ours.get("p50_ms"), theirs.get("p50_ms")),
        }
    targets = {}
    for target in TARGETS:
        if target.variant == variant:
            key = "workflows_per_s_ratio" if target.higher_is_better else "p50_ratio"
            ratio = vs.get(target.peer, {}).get(key)
            targets[target.label] = {"ratio": ratio, "verdict": target.verdict(ratio)}
    return {"baseline": BASELINE.get(variant), "vs": vs, "targets": targets}


def _div(a: float | None, b: float | None) -> float | None:
    if not a or not b:
        return None
    return round(a / b, 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers-tmp", type=Path, default=DEFAULT_TMP)
    parser.add_argument("--quick", action="store_true", help="reduced workload sizes")
    parser.add_argument(
        "--temporal-full",
        action="store_true",
        help="Temporal at the peers' full sizes too (adds about 10 minutes)",
    )
    args = parser.parse_args(argv)
    outcome = run_peers(args.peers_tmp, args.quick, args.temporal_full)
    for stem, peer in outcome["results"].items():
        emit({"benchmark": "peer", "result": stem, "median": peer.get("median")})
    return 1 if outcome["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
