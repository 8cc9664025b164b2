"""``dev`` commands: tools for working on the engine, starting with a local Kafka broker."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.cli import SubParsers
from engine.core.errors import LocalKafkaError
from engine.dev.local_cluster import LocalKafkaCluster, is_cluster
from engine.dev.local_kafka import KAFKA_VERSION, LocalKafka


def register(subparsers: SubParsers) -> None:
    """Add ``dev`` and its sub-commands."""
    dev = subparsers.add_parser("dev", help="development tools (local Kafka broker)")
    dev.set_defaults(help_parser=dev)
    groups = dev.add_subparsers(title="dev commands", metavar="COMMAND")
    _register_kafka(groups)


def _register_kafka(subparsers: SubParsers) -> None:
    kafka = subparsers.add_parser(
        "kafka",
        help=f"run a local single-node Apache Kafka {KAFKA_VERSION} (needs Java and Maven)",
        description="A real Kafka broker on 127.0.0.1 for development and tests, run from "
        "the Apache Kafka jars on Maven Central (fetched once into a cache).",
    )
    kafka.set_defaults(help_parser=kafka)
    commands = kafka.add_subparsers(title="kafka commands", metavar="COMMAND")

    start = commands.add_parser(
        "start", help="start the broker (if needed) and print its bootstrap servers"
    )
    _add_common(start)
    start.add_argument("--fresh", action="store_true", help="wipe the data folder first")
    start.add_argument("--port", type=int, help="broker port (default: a free port, kept)")
    start.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="run a cluster of this many brokers, each also a controller (quorum of N); "
        "3 gives topics replication factor 3 with min.insync.replicas 2 (default 1)",
    )
    start.add_argument(
        "--timeout", type=float, default=90.0, help="seconds to wait for readiness (90)"
    )
    start.set_defaults(handler=_start)

    stop = commands.add_parser("stop", help="stop the broker (SIGTERM, then SIGKILL)")
    _add_common(stop)
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds before SIGKILL (30)")
    stop.set_defaults(handler=_stop)

    status = commands.add_parser("status", help="show whether the broker runs, and where")
    _add_common(status)
    status.set_defaults(handler=_status)

    fetch = commands.add_parser("fetch", help="download the Kafka jars with Maven (once)")
    _add_common(fetch)
    fetch.set_defaults(handler=_fetch)

    reset = commands.add_parser("reset", help="stop the broker and delete its data folder")
    _add_common(reset)
    reset.set_defaults(handler=_reset)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="broker data folder (default: $TURNSTILE_KAFKA_DIR or ~/.cache/turnstile/broker)",
    )


def _broker(args: argparse.Namespace) -> LocalKafka:
    return LocalKafka(args.data_dir, port=getattr(args, "port", None))


def _cluster(args: argparse.Namespace) -> LocalKafkaCluster | None:
    """The cluster in the data folder (or the one ``--brokers N`` asks for), else None."""
    brokers = getattr(args, "brokers", 1)
    if brokers > 1 or is_cluster(args.data_dir):
        if getattr(args, "port", None):
            raise LocalKafkaError("--port is for a single broker; a cluster picks its ports")
        return LocalKafkaCluster(args.data_dir, brokers if brokers > 1 else None)
    return None


def _start(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if cluster is not None:
        if args.fresh:
            cluster.reset()
            cluster = LocalKafkaCluster(args.data_dir, len(cluster.nodes))
        print(cluster.start(timeout=max(args.timeout, 180.0)), flush=True)
        return 0
    print(_broker(args).start(timeout=args.timeout, fresh=args.fresh), flush=True)
    return 0


def _stop(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    stopped = cluster.stop(args.timeout) if cluster else _broker(args).stop(timeout=args.timeout)
    if not stopped:
        print("Kafka is not running.")
    return 0


def _status(args: argparse.Namespace) -> int:
    """Exit 0 when running, 3 when stopped (like ``systemctl status``), for scripts."""
    cluster = _cluster(args)
    statuses = cluster.status() if cluster else [_broker(args).status()]
    print("\n\n".join(status.describe() for status in statuses))
    return 0 if all(status.running for status in statuses) else 3


def _fetch(args: argparse.Namespace) -> int:
    print(_broker(args).fetch())
    return 0


def _reset(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if cluster is not None:
        cluster.reset()
    else:
        _broker(args).reset()
    return 0
