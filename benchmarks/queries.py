"""Query round trip against start-to-outcome: how long a client waits for a query's answer,
next to how long it waits for a start's answer, on the same engine.

    .venv/bin/python benchmarks/queries.py [--instances 20] [--n 300] [--partitions 8]

One processor (no worker: the workload has no activities) serves ``chain3.queried``, which
sets a query handler and waits for an event. The benchmark starts ``--instances`` of them
one at a time (each start waits for the processor's ACCEPTED answer: start-to-outcome),
then asks query ``x`` ``--n`` times, one at a time, round robin over the instances (each
query waits for its answer on command-outcomes), checking every answer. Target: a query's
p50 at most 2x the p50 of a start-to-outcome (both are one command and one answer; a query
writes no history, so it should not cost more than a start). Every run adds its row to
``benchmarks/results/queries.jsonl`` and writes RESULTS.md again.
"""

from __future__ import annotations

import sys
import time

import round_trips

from engine.client import Client


def _queries(client: Client, handles: list[str], n: int, offset: int) -> list[float]:
    lat_ms = []
    for i in range(n):
        k = i % len(handles)
        t0 = time.perf_counter()
        value = client.query(handles[k], "x", timeout=60)
        lat_ms.append((time.perf_counter() - t0) * 1000.0)
        if value != offset + k:
            raise RuntimeError(f"query x of {handles[k]} answered {value!r}, not {offset + k}")
    return lat_ms


QUERIES = round_trips.Verb("queries", "query", "queries", _queries)


def main(argv: list[str] | None = None) -> int:
    args = round_trips.parser(__doc__.splitlines()[0]).parse_args(argv)
    return round_trips.main(QUERIES, args, [])


if __name__ == "__main__":
    sys.exit(main())
