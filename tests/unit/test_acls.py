"""The ACL list the docs print is the one the engine's roles are tested with."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli.main import main
from engine.config.acls import ROLES, Acl, kafka_acls_commands, required_acls

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "security-and-clusters.md"


def _docs_acl_block() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("```text\n# processor\n") + len("```text\n")
    return text[start : text.index("```", start)]


def test_the_docs_list_exactly_what_topics_acls_prints_for_every_role(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = []
    for role in ROLES:
        argv = ["topics", "acls", role, "--principal", f"User:turnstile-{role}"]
        assert main([*argv, "--namespace", "turnstile"]) == 0
        lines += [f"# {role}", *capsys.readouterr().out.splitlines()]
        assert lines[-1] == kafka_acls_commands("turnstile", role, f"User:turnstile-{role}")[-1]
    assert _docs_acl_block() == "\n".join(lines) + "\n"


def test_kafka_acls_arguments_use_the_tools_spelling() -> None:
    acl = Acl("topic", "ns.", "DESCRIBE_CONFIGS", prefixed=True)
    assert acl.kafka_acls_args("User:x") == (
        "--allow-principal User:x --operation DescribeConfigs --topic ns. "
        "--resource-pattern-type prefixed"
    )


def test_no_role_may_create_topics_or_read_the_history() -> None:
    for role in ROLES:
        acls = required_acls("ns", role)
        assert not [a for a in acls if a.operation in ("CREATE", "ALTER", "ALTER_CONFIGS")]
        assert not [a for a in acls if a.name == "ns.history" and a.operation == "READ"]
        prefixed = [a for a in acls if a.prefixed and a.resource == "topic"]
        wide = {a.operation for a in prefixed if a.name == "ns."}
        assert wide == {"DESCRIBE", "DESCRIBE_CONFIGS"}
        # beyond describing, a prefix grants only the task queues (ns.activity-tasks[.Q])
        assert {a.name for a in prefixed if a.name != "ns."} <= {"ns.activity-tasks"}


def test_an_unknown_role_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="processor, worker, client"):
        required_acls("ns", "admin")


def test_a_processor_that_publishes_and_runs_triggers_gets_exactly_those_rights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = required_acls("ns", "processor")
    both = required_acls("ns", "processor", publish_topics=["shipments"], trigger_topics=["orders"])
    assert [a for a in both if a not in plain] == [
        Acl("topic", "shipments", "WRITE"),
        Acl("topic", "orders", "READ"),
        Acl("group", "ns.triggers", "READ"),
        Acl("topic", "ns.commands", "WRITE"),
    ]
    assert required_acls("ns", "worker", publish_topics=["shipments"]) == required_acls(
        "ns", "worker"
    )
    config = tmp_path / "turnstile.toml"
    config.write_text(
        'namespace = "ns"\n[publish]\ntopics = ["shipments"]\n'
        '[[triggers]]\ntopic = "orders"\nworkflow = "ship"\n'
    )
    argv = ["topics", "acls", "processor", "--principal", "User:p", "--config", str(config)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "--operation Write --topic shipments" in printed
    assert "--operation Read --topic orders" in printed
    assert "--operation Read --group ns.triggers" in printed
