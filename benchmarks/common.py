"""Helpers shared by the benchmark scripts: measurement definitions, host facts, output.

The percentile, machine-CPU and summary definitions come from the peers' ``benchlib``
(``../shared/peers/common``) when it is there, so that our numbers and the peers' are
computed the same way; the copies below are used only when it is not.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the scripts run from a checkout, engine not installed
    sys.path.insert(0, str(REPO))
PEERS_DIR = Path(os.environ.get("PEERS_DIR", REPO.parent / "shared" / "peers"))


def _shared_benchlib() -> ModuleType | None:
    """The peers' benchlib, imported from its folder, or None if it is not there."""
    folder = PEERS_DIR / "common"
    if not (folder / "benchlib.py").is_file():
        return None
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        import benchlib
    except ImportError:
        return None
    return benchlib  # type: ignore[no-any-return]


BENCHLIB = _shared_benchlib()


def _percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear'); q in [0, 100]."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds summed over all CPUs, from /proc/stat (benchlib's rule:
    busy = user + nice + system + irq + softirq)."""
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    vals = [int(x) for x in parts] + [0] * 10
    hz = os.sysconf("SC_CLK_TCK")
    busy = vals[0] + vals[1] + vals[2] + vals[5] + vals[6]
    return busy / hz, vals[7] / hz


def percentile(values: Iterable[float], q: float) -> float:
    if BENCHLIB is not None:
        return float(BENCHLIB.percentile(list(values), q))
    return _percentile(values, q)


def machine_cpu() -> tuple[float, float]:
    if BENCHLIB is not None:
        busy, steal = BENCHLIB.machine_cpu()
        return float(busy), float(steal)
    return _machine_cpu()


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


# --- CPU of processes ---------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat; 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    # After the command name: state is field 3, so utime (14) and stime (15) are [11], [12].
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process (the benchmark client, with its Kafka client threads)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class CpuSpan:
    """CPU used over a span: the whole machine, this process, and named other processes.

    Why per process: on two shared cores a throughput number alone does not say whether
    the processor, the worker, the broker or the client was the bottleneck.
    """

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.wall = 0.0
        self.machine_busy_s = 0.0
        self.steal_s = 0.0
        self.client_s = 0.0
        self.process_s: dict[str, float] = {}

    def __enter__(self) -> CpuSpan:
        self._m0 = machine_cpu()
        self._own0 = own_cpu_seconds()
        self._p0 = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t0
        m1 = machine_cpu()
        self.machine_busy_s = m1[0] - self._m0[0]
        self.steal_s = m1[1] - self._m0[1]
        self.client_s = own_cpu_seconds() - self._own0
        self.process_s = {
            name: proc_cpu_seconds(pid) - self._p0[name] for name, pid in self.pids.items()
        }

    def seconds(self) -> dict[str, float]:
        """CPU seconds by name: each recorded process, the client, the whole machine."""
        out = {name: round(s, 3) for name, s in self.process_s.items()}
        out["client"] = round(self.client_s, 3)
        out["machine"] = round(self.machine_busy_s, 3)
        return out

    def as_dict(self, per: int | None = None) -> dict[str, Any]:
        """Totals, and CPU milliseconds per unit of work when ``per`` is given."""
        out: dict[str, Any] = {
            "machine_busy_cpu_s": round(self.machine_busy_s, 3),
            "machine_avg_busy_cores": round(self.machine_busy_s / self.wall, 3)
            if self.wall
            else None,
            "machine_steal_s": round(self.steal_s, 3),
            "client_process_cpu_s": round(self.client_s, 3),
        }
        for name, seconds in self.process_s.items():
            out[f"{name}_cpu_s"] = round(seconds, 3)
        if per:
            out["cpu_ms_per_workflow"] = {
                "client": round(self.client_s * 1000 / per, 3),
                **{n: round(s * 1000 / per, 3) for n, s in self.process_s.items()},
                "machine": round(self.machine_busy_s * 1000 / per, 3),
            }
        return out


# --- host and version facts ---------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def ram_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return float("nan")


def host_info() -> dict[str, Any]:
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "ram_gib": ram_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def machine_line(host: dict[str, Any]) -> str:
    """One short cell for RESULTS.md."""
    return (
        f"{host['cores']}x {host['cpu']}, {host['ram_gib']} GiB, "
        f"Linux {host['kernel']}, Python {host['python']}"
    )


def git_commit() -> str:
    """Short commit of the working tree, with ``+dirty`` when it has uncommitted changes."""
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return (rev or "unknown") + ("+dirty" if dirty else "")


# --- output -------------------------------------------------------------------------------


def progress(message: str) -> None:
    """Progress goes to stderr, so that stdout carries only the JSON result lines."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    """One result as one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def latency_summary(lat_ms: Sequence[float]) -> dict[str, float]:
    """benchlib's latency fields (p50/p90/p99/min/max/mean in ms)."""
    return {
        "p50_ms": round(percentile(lat_ms, 50), 3),
        "p90_ms": round(percentile(lat_ms, 90), 3),
        "p99_ms": round(percentile(lat_ms, 99), 3),
        "min_ms": round(min(lat_ms), 3),
        "max_ms": round(max(lat_ms), 3),
        "mean_ms": round(statistics.fmean(lat_ms), 3),
    }
