"""``list`` on the real broker: tags set at start and by workflow code are searched (every
``--tag`` must match), pages follow their tokens, and a list of many instances - the status
topic uncompacted, each instance on it several times - holds one page and one fold batch."""

from __future__ import annotations

import argparse
import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from engine.adapters.kafka.config import producer_config
from engine.adapters.status_scan import StatusFold, list_page_from_topic
from engine.cli import client_cmds
from engine.client import AsyncClient
from engine.codec import encode_message
from engine.config.settings import Settings
from engine.config.topics import topic_names
from engine.core.errors import InvalidPageTokenError
from engine.core.history import RuntimeStatus
from engine.core.messages import InstanceStatus
from engine.services.client.listing import InstanceFilter, PageCollector
from tests.engine_harness import RunningEngine, running_engine, wait_until

pytestmark = pytest.mark.kafka

TIMEOUT = 60.0


@pytest.fixture
def engine(kafka_bootstrap: str) -> Iterator[RunningEngine]:
    with running_engine(kafka_bootstrap, partitions=2) as running:
        yield running


def _cli(engine: RunningEngine, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    parser = argparse.ArgumentParser()
    client_cmds.register(parser.add_subparsers())
    flags = ("--bootstrap-servers", engine.bootstrap, "--namespace", engine.namespace)
    args = parser.parse_args([*argv, *flags])
    assert args.handler(args) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _listed(engine: RunningEngine, capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    out, _ = _cli(engine, capsys, "list", "--json", "--quiet", *argv)
    return sorted(s["instance_id"] for s in json.loads(out))


def test_list_finds_instances_by_their_tags_and_pages_them(
    engine: RunningEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    client = engine.client
    web = {"tags": {"customer": "c-42"}}
    a = client.start("t.tagged", web, instance_id="tag-a", tags={"team": "web"})
    b = client.start(
        "t.tagged", {"tags": {"customer": "c-7"}}, instance_id="tag-b", tags={"team": "web"}
    )
    c = client.start("t.tagged", {**web, "wait": True}, instance_id="tag-c")
    _cli(engine, capsys, "start", "t.tagged", "--input", "{}", "--id", "tag-d", "--tag", "team=ops")
    for done in (a, b, "tag-d"):
        assert client.wait_for_completion(done, timeout=TIMEOUT).status is RuntimeStatus.COMPLETED
    wait_until(lambda: (client.get(c) or _nothing()).tags == {"customer": "c-42"}, TIMEOUT)
    assert client.get(a).tags == {"team": "web", "customer": "c-42"}  # type: ignore[union-attr]

    assert _listed(engine, capsys, "--tag", "customer=c-42") == ["tag-a", "tag-c"]
    assert _listed(engine, capsys, "--tag", "customer=c-42", "--tag", "team=web") == ["tag-a"]
    assert _listed(engine, capsys, "--tag", "customer=c-42", "--status", "running") == ["tag-c"]
    assert _listed(engine, capsys, "--tag", "team=ops", "--name", "t.tagged") == ["tag-d"]
    assert _listed(engine, capsys, "--tag", "team=nobody") == []

    # newest first, one a page: the token printed on stderr leads to the next page
    seen: list[str] = []
    argv = ["list", "--tag", "team=web", "--limit", "1", "--quiet"]
    while True:
        out, err = _cli(engine, capsys, *argv)
        seen += [line.split()[0] for line in out.splitlines()]
        if "--page-token" not in err:
            break
        argv = [*argv[:6], "--page-token", err.split("--page-token", 1)[1].split()[0]]
    assert seen == ["tag-b", "tag-a"]  # b started after a

    page = client.list_page(tags={"customer": "c-42"}, limit=1)  # the client's live view
    assert [s.instance_id for s in page.items] == ["tag-c"] and page.next_page_token
    rest = client.list_page(tags={"customer": "c-42"}, limit=1, page_token=page.next_page_token)
    assert [s.instance_id for s in rest.items] == ["tag-a"] and rest.next_page_token is None
    with pytest.raises(InvalidPageTokenError, match="next_page_token"):
        client.list_page(page_token="not-a-token")

    async def ops_page() -> list[str]:  # AsyncClient without a live view: a topic scan
        async with AsyncClient(settings=engine.settings, read_status=False) as reader:
            page = await reader.list_page(tags={"team": "ops"})
        return [s.instance_id for s in page.items]

    assert asyncio.run(ops_page()) == ["tag-d"]
    client.raise_event(c, "go")
    assert client.wait_for_completion(c, timeout=TIMEOUT).output == {"customer": "c-42"}


def _nothing() -> InstanceStatus:
    return InstanceStatus("")


def test_a_list_of_many_instances_holds_one_page(
    kafka_bootstrap: str, admin: Any, tmp_path: Path
) -> None:
    """1,500 instances, each written three times and every tenth purged (a tombstone), as
    the status topic holds them before compaction; pages of 100 cover them exactly, and
    neither the fold nor the page ever holds more than its bound."""
    count, limit, batch = 1500, 100, 200
    settings = Settings(bootstrap_servers=kafka_bootstrap, namespace=f"list-{uuid.uuid4().hex[:8]}")
    topic = topic_names(settings.namespace).status
    new = NewTopic(
        topic, num_partitions=3, replication_factor=1, config={"cleanup.policy": "compact"}
    )
    admin.create_topics([new])[topic].result(TIMEOUT)
    producer = Producer(producer_config(kafka_bootstrap, client_id="list-test"))
    written = 0
    for step in (RuntimeStatus.PENDING, RuntimeStatus.RUNNING, RuntimeStatus.COMPLETED):
        for i in range(count):
            status = InstanceStatus(
                f"m-{i:05d}",
                "t.echo",
                status=step,
                created_ms=10_000 + i,
                tags={"shard": str(i % 3)},
            )
            producer.produce(topic, encode_message(status), status.instance_id.encode())
            producer.poll(0)
            written += 1
    for i in range(0, count, 10):
        producer.produce(topic, None, f"m-{i:05d}".encode())
        written += 1
    assert producer.flush(TIMEOUT) == 0

    try:
        wanted = InstanceFilter.of(tags={"shard": "0"}, status=RuntimeStatus.COMPLETED)
        seen: list[str] = []
        token = None
        while True:
            collector = PageCollector(wanted, limit, token)
            with StatusFold(tmp_path / f"fold-{len(seen)}", batch=batch) as fold:
                page = list_page_from_topic(settings, collector, fold=fold)
                assert fold.records == written
                assert fold.held_peak <= batch
            assert collector.offered == count - count // 10  # the latest status of each
            assert collector.held_peak <= limit + 1
            seen += [s.instance_id for s in page.items]
            token = page.next_page_token
            if token is None:
                break
        assert seen == [f"m-{i:05d}" for i in reversed(range(count)) if i % 3 == 0 and i % 10]
    finally:
        admin.delete_topics([topic])
