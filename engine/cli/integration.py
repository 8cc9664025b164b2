"""The processor's Kafka integration flags, and the checks before it runs them.

Published-to and trigger topics belong to the user: a running engine never creates them (a
typo would otherwise become a new topic), so ``run processor`` refuses to start while one is
missing, and a trigger must name a registered workflow. ``topics apply --spec FILE`` creates
the ones a spec declares under ``[user-topics]``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from engine.adapters.kafka import admin as kafka_admin
from engine.adapters.kafka.triggers import TriggerBridge
from engine.config.settings import Settings
from engine.config.triggers import parse_trigger_flag
from engine.core.errors import ConfigurationError, TriggerError
from engine.runtime.registry import Registry
from engine.services.triggers import check_workflows

log = logging.getLogger("engine.triggers")


def with_integration_flags(
    settings: Settings, triggers: Sequence[str], publish_topics: Sequence[str]
) -> Settings:
    """The settings plus the ``--trigger`` and ``--publish-topic`` flags."""
    if not triggers and not publish_topics:
        return settings
    added = tuple(parse_trigger_flag(t) for t in triggers)
    doubled = {t.topic for t in added} & {t.topic for t in settings.triggers}
    if doubled:
        raise TriggerError(
            f"topic(s) {', '.join(sorted(doubled))} have a trigger in the config file and "
            f"a --trigger flag; keep one"
        )
    topics = tuple(dict.fromkeys([*settings.publish_topics, *publish_topics]))
    return replace(settings, triggers=settings.triggers + added, publish_topics=topics)


def check_integration_topics(settings: Settings, registry: Registry) -> None:
    """Stop with the reason when a trigger names an unknown workflow, or a declared publish
    or trigger topic does not exist on the cluster."""
    check_workflows(settings.triggers, registry)
    wanted = sorted({*settings.publish_topics, *(t.topic for t in settings.triggers)})
    if not wanted:
        return
    found = kafka_admin.existing_topics(settings, wanted, settings.connect_timeout_s)
    missing = [t for t in wanted if t not in found]
    if missing:
        raise ConfigurationError(
            f"topic(s) {', '.join(missing)} (publish_topics or triggers) do not exist; the "
            f"engine never creates user topics on its own: declare them under [user-topics] "
            f"in a topics spec and run 'turnstile topics apply --spec FILE', create them "
            f"otherwise (kafka-topics.sh --create, your platform's tooling), or fix the name"
        )


@contextmanager
def trigger_bridge(settings: Settings, stop: threading.Event) -> Iterator[None]:
    """Run the trigger bridge beside the processor while the block runs (nothing without
    triggers). A bridge that fails for good stops the process: a replica that silently
    stopped bridging would leave business records unread."""
    if not settings.triggers:
        yield
        return
    bridge = TriggerBridge(settings)

    def run() -> None:
        try:
            bridge.run(stop)
        except BaseException:
            log.exception("the trigger bridge failed; stopping the processor")
            stop.set()
            raise

    thread = threading.Thread(target=run, name="triggers", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)
