"""Regenerate the golden histories in ``tests/golden/histories/``.

Each file holds the histories (all instances, children included) of one run of a pattern
workflow, driven by the in-memory test harness in deterministic order. Failure stacks are
blanked so that the files do not depend on where the checkout lives.

Run after an intended change of the runtime's decisions, then review the diff:

    .venv/bin/python tests/golden/generate_histories.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "unit" / "runtime")]

from runtime_harness import Sim, strip_stacks  # noqa: E402
from runtime_patterns import APPROVALS, PATTERN_RUNS, patterns  # noqa: E402

from engine.runtime.jsonhistory import history_to_json  # noqa: E402


def record(key: str) -> dict[str, Any]:
    """Run one named pattern and return its golden document."""
    name, value = PATTERN_RUNS[key]
    sim = Sim(patterns)
    sim.start(name, value)
    if key in APPROVALS:
        sim.run(timers=False)
        sim.raise_event("wf-1", "approval", "approved")
    sim.run()
    return {
        "workflow": name,
        "input": value,
        "instances": {
            instance_id: history_to_json(strip_stacks(sim.history(instance_id)))
            for instance_id in sorted(sim.instances)
        },
    }


def main() -> None:
    out = HERE / "histories"
    out.mkdir(exist_ok=True)
    for key in PATTERN_RUNS:
        path = out / f"{key}.json"
        path.write_text(json.dumps(record(key), indent=1, sort_keys=True) + "\n")
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
