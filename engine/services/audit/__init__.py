"""Replay and audit: the history topic as a trustworthy, exportable record.

Pure logic (no Kafka): the Kafka side lives in :mod:`engine.adapters.kafka.history`, the
commands in :mod:`engine.cli.history_cmds` and :mod:`engine.cli.audit_cmds`.

- :mod:`.timeline`: an instance's events as lines for people and as JSON;
- :mod:`.chain`: hash-chain verification over raw records, naming the first broken link;
- :mod:`.replay`: re-execute current workflow code against recorded histories;
- :mod:`.state`: rebuild each instance's state from history and compare it with the
  processor's tables and the status topic.
"""

from engine.services.audit.chain import ChainBreak, ChainResult, ChainVerifier
from engine.services.audit.records import EventFilter, RawRecord, ReadProgress
from engine.services.audit.replay import ReplayChecker, ReplayReport, ReplayResult
from engine.services.audit.state import (
    AuditReport,
    Difference,
    InstanceFold,
    ProcessorTables,
    compare,
    confirmed,
    fold_histories,
)

__all__ = [
    "AuditReport",
    "ChainBreak",
    "ChainResult",
    "ChainVerifier",
    "Difference",
    "EventFilter",
    "InstanceFold",
    "ProcessorTables",
    "RawRecord",
    "ReadProgress",
    "ReplayChecker",
    "ReplayReport",
    "ReplayResult",
    "compare",
    "confirmed",
    "fold_histories",
]
