"""A local Apache Kafka cluster of several brokers, for development and fault tests.

Production Kafka is a cluster: partitions have leaders that move, brokers restart one by
one, and writes wait for in-sync replicas. This runs ``size`` nodes of
:class:`engine.dev.local_kafka.LocalKafka` on 127.0.0.1, each its own JVM with its own ports
and data folder (``<data dir>/node-<id>``). Quorum layout: every node is both broker and
controller, so the KRaft controller quorum has ``size`` voters (3 of them tolerate one node
down, like the brokers with replication factor 3 and ``min.insync.replicas`` 2); the quorum
is static (``controller.quorum.voters``), every node formatted with the same cluster id.

Ports and the cluster id are chosen once and kept in ``cluster.json``, so a restarted
cluster (or node) is where it was. Standard library only, like the launcher.
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from engine.core.errors import LocalKafkaError
from engine.dev.local_kafka import (
    HOST,
    BrokerStatus,
    ClusterNode,
    LocalKafka,
    _free_port,
    _new_cluster_id,
    _progress,
    default_data_dir,
)

__all__ = ["CLUSTER_FILE", "LocalKafkaCluster", "is_cluster"]

CLUSTER_FILE = "cluster.json"


def is_cluster(data_dir: Path | str | None) -> bool:
    """Whether ``data_dir`` holds a local cluster (rather than a single broker)."""
    folder = Path(data_dir) if data_dir else default_data_dir()
    return (folder.expanduser() / CLUSTER_FILE).is_file()


class LocalKafkaCluster:
    """``size`` local brokers forming one cluster; ``nodes[i]`` is node id ``i + 1``. Without
    ``size``, the cluster already in ``data_dir`` (or a new one of 3)."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        size: int | None = None,
        *,
        cache_dir: Path | str | None = None,
        progress: Callable[[str], None] = _progress,
    ) -> None:
        self.data_dir = (Path(data_dir) if data_dir else default_data_dir()).expanduser().resolve()
        self.cache_dir = cache_dir
        self._progress = progress
        layout = self._layout(size)
        size = len(layout["nodes"])
        voters = ",".join(f"{n['id']}@{HOST}:{n['controller']}" for n in layout["nodes"])
        self.nodes = [
            LocalKafka(
                self.data_dir / f"node-{n['id']}",
                cache_dir=cache_dir,
                progress=progress,
                node=ClusterNode(
                    n["id"], n["broker"], n["controller"], voters, layout["cluster_id"], size
                ),
            )
            for n in layout["nodes"]
        ]

    def _layout(self, size: int | None) -> dict:  # type: ignore[type-arg]
        """The cluster's ports and id: read from ``cluster.json``, or chosen and written."""
        path = self.data_dir / CLUSTER_FILE
        if path.is_file():
            layout = json.loads(path.read_text(encoding="utf-8"))
            if size is not None and len(layout["nodes"]) != size:
                raise LocalKafkaError(
                    f"{self.data_dir} holds a cluster of {len(layout['nodes'])} brokers, not "
                    f"{size}; use --brokers {len(layout['nodes'])}, or 'dev kafka reset' first"
                )
            return layout  # type: ignore[no-any-return]
        size = 3 if size is None else size
        if size < 1:
            raise LocalKafkaError(f"a cluster needs at least one broker, not {size}")
        ports: set[int] = set()
        while len(ports) < 2 * size:
            ports.add(_free_port())
        chosen = sorted(ports)
        nodes = [
            {"id": i + 1, "broker": chosen[2 * i], "controller": chosen[2 * i + 1]}
            for i in range(size)
        ]
        layout = {"cluster_id": _new_cluster_id(), "nodes": nodes}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(layout, indent=2) + "\n", encoding="utf-8")
        return layout

    @property
    def bootstrap_servers(self) -> str:
        """Every node's ``host:port``, comma-separated (clients need only one to answer)."""
        return ",".join(f"{HOST}:{n.node.broker_port}" for n in self.nodes if n.node)

    def start(self, timeout: float = 180.0) -> str:
        """Start every node that is not running (all launched first: a node is ready only
        once the controller quorum has a majority) and return the bootstrap servers."""
        self.nodes[0].fetch()
        launched = [node for node in self.nodes if node.launch()]
        if launched:
            self._progress(
                f"Starting a cluster of {len(self.nodes)} brokers "
                f"({len(launched)} launched) in {self.data_dir}..."
            )
        try:
            for node in launched:
                node.await_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self.bootstrap_servers

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop every node at once (SIGTERM, SIGKILL after ``timeout``); whether any was
        running. At once, because a node stopped after the others would wait out its
        controlled shutdown for a controller quorum that is gone."""
        stopped: list[bool] = []
        threads = [
            threading.Thread(target=lambda n=node: stopped.append(n.stop(timeout)))
            for node in self.nodes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return any(stopped)

    def status(self) -> list[BrokerStatus]:
        return [node.status() for node in self.nodes]

    def reset(self) -> None:
        """Stop the cluster and delete its folder (nodes, ports, cluster id)."""
        for node in self.nodes:
            node.reset()
        (self.data_dir / CLUSTER_FILE).unlink(missing_ok=True)
        if self.data_dir.is_dir() and not any(self.data_dir.iterdir()):
            shutil.rmtree(self.data_dir)
