"""The rows of chain3 on a cluster (``chain3.py --brokers 3``, ``run_all.py --only
cluster``): their cells, and the newest one's cell in RESULTS.md, where it sits beside the
single-broker chain3 rows. Kept apart from :mod:`results_md`, which writes them.

A cluster row carries the brokers and the replication its topics really had (read back from
the cluster), and the ratios to the single-broker run of the same variant when one ran in
the same command (``run_all.py`` runs both): what the replication protocol costs, on the
same machine, in one sitting.
"""

from __future__ import annotations

from typing import Any

from results_columns import median_cells

#: Which values of a cluster row say how it compares with the single broker (cluster over
#: single broker: wf/s below 1 is slower, p50 and p99 above 1 are slower).
VERSUS = ("vs 1 broker: wf/s", "vs 1 broker: p50", "vs 1 broker: p99")


def _times(cluster: float | None, single: float | None) -> str | None:
    if not cluster or not single:
        return None
    return f"{cluster / single:.2f}x"


def _cpu_cells(cpu: dict[str, float]) -> tuple[str, str | None]:
    """Processor / worker / every broker together / client, and each broker apart (the
    leaders of the partitions, and so the work, are spread over them)."""
    nodes = sorted((n for n in cpu if n.startswith("broker-")), key=lambda n: int(n[7:]))
    brokers: Any = round(sum(cpu[n] for n in nodes), 3) if nodes else cpu.get("broker", "-")
    together = (cpu.get("processor", "-"), cpu.get("worker", "-"), brokers, cpu.get("client", "-"))
    return " / ".join(str(x) for x in together), " / ".join(str(cpu[n]) for n in nodes) or None


def cluster_cells(result: dict[str, Any], params: str, single: dict[str, Any] | None) -> list[Any]:
    """The cells after date, commit and machine; ``single``: the same variant's
    single-broker result from the same run, or None."""
    med = result["median"]
    together, per_broker = _cpu_cells(med.get("cpu_ms_per_workflow_throughput", {}))
    theirs = (single or {}).get("median", {})
    keys = ("workflows_per_s", "p50_ms", "p99_ms")
    return [
        result["variant"],
        result["brokers"],
        result["replication_factor"],
        result["min_insync_replicas"],
        params,
        *median_cells(med),
        together,
        per_broker,
        ", ".join(str(theirs.get(k)) for k in keys) if theirs else None,
        *(_times(med.get(k), theirs.get(k)) for k in keys),
    ]


def cluster_shown(record: dict[str, Any]) -> str:
    """The newest cluster row in one cell: its numbers, and the ratios when it has them."""
    v = record["values"]
    text = (
        f"{v['wf/s']} wf/s, p50 {v['p50 ms']} ms, p99 {v['p99 ms']} ms on {v['brokers']} "
        f"brokers (replication factor {v['replication factor']}, min.insync.replicas "
        f"{v['min.insync.replicas']})"
    )
    ratios = [v.get(column) for column in VERSUS]
    if any(r in (None, "n/a") for r in ratios):
        return text + "; no single-broker run beside it"
    return text + f"; {' / '.join(str(r) for r in ratios)} the single broker's (same run)"
