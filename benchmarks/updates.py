"""Update round trip against start-to-outcome: how long a client waits for an update's
result, next to how long it waits for a start's answer, on the same engine.

    .venv/bin/python benchmarks/updates.py [--instances 20] [--n 300] [--partitions 8]

One processor (no worker: the workload has no activities) serves ``chain3.queried``, whose
update ``add`` adds its argument to a total and returns it in the turn that accepts it. The
benchmark starts ``--instances`` of them one at a time (each start waits for the
processor's ACCEPTED answer: start-to-outcome), then sends update ``add`` ``--n`` times, one
at a time, round robin over the instances (each waits for its result on command-outcomes),
checking every result. An update is a command and an answer like a start, plus the turn
that journals it (``UpdateAccepted`` and ``UpdateCompleted``) before the answer goes out;
a start's answer also waits for one batch, so "at most one turn more" is an update p50 of
at most 2x the start p50. Every run adds its row to ``benchmarks/results/updates.jsonl``
and writes RESULTS.md again.
"""

from __future__ import annotations

import sys
import time

import round_trips

from engine.client import Client


def _updates(client: Client, handles: list[str], n: int, offset: int) -> list[float]:
    """``n`` updates ``add 1`` round robin; each result is the instance's start value plus
    the updates it has taken so far."""
    lat_ms, taken = [], [0] * len(handles)
    for i in range(n):
        k = i % len(handles)
        t0 = time.perf_counter()
        value = client.update(handles[k], "add", 1, timeout=60)
        lat_ms.append((time.perf_counter() - t0) * 1000.0)
        taken[k] += 1
        if value != offset + k + taken[k]:
            raise RuntimeError(
                f"update add of {handles[k]} answered {value!r}, not {offset + k + taken[k]}"
            )
    return lat_ms


UPDATES = round_trips.Verb("updates", "update", "updates", _updates)


def main(argv: list[str] | None = None) -> int:
    parser = round_trips.parser(__doc__.splitlines()[0])
    parser.add_argument("--note", default="", help="what else ran on the machine meanwhile")
    args = parser.parse_args(argv)
    return round_trips.main(UPDATES, args, [args.note])


if __name__ == "__main__":
    sys.exit(main())
