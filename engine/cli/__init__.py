"""The command line: the composition root, the only place that wires adapters to services.

Each command module exposes ``register(subparsers: SubParsers) -> None`` and is listed in
``engine.cli.main.COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
from typing import TypeAlias

# argparse's sub-parser action is generic only for type checkers, hence the string alias.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
