"""The local 3-broker cluster's layout, without starting it: three nodes on 127.0.0.1, each
a broker and a controller with ports and a folder of its own, the layout kept in the data
folder so that ``status``, ``stop`` and ``reset`` find the cluster by themselves, and the
replication a cluster gives Kafka's own topics."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cli.main import main
from engine.dev.local_cluster import LocalKafkaCluster, is_cluster
from engine.dev.local_kafka import HOST, LocalKafkaError, _server_properties


def test_a_cluster_of_three_has_a_port_pair_and_a_folder_per_node(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path / "c", 3)
    nodes = [n.node for n in cluster.nodes]
    assert [n.node_id for n in nodes if n] == [1, 2, 3]
    ports = [p for n in nodes if n for p in (n.broker_port, n.controller_port)]
    assert len(set(ports)) == 6
    assert [n.data_dir.name for n in cluster.nodes] == ["node-1", "node-2", "node-3"]
    assert all(server.startswith(f"{HOST}:") for server in cluster.bootstrap_servers.split(","))
    assert is_cluster(tmp_path / "c")
    again = LocalKafkaCluster(tmp_path / "c")  # read back from cluster.json
    assert again.bootstrap_servers == cluster.bootstrap_servers


def test_every_node_is_broker_and_controller_of_a_quorum_of_three(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path / "c", 3)
    node = cluster.nodes[1].node
    assert node is not None
    text = _server_properties(cluster.nodes[1].data_dir, node.broker_port, node.controller_port,
                              node=node)  # fmt: skip
    properties = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert properties["process.roles"] == "broker,controller"
    assert properties["node.id"] == "2"
    assert len(properties["controller.quorum.voters"].split(",")) == 3
    assert properties["listeners"].count(f"//{HOST}:") == 2
    for key in ("default.replication.factor", "transaction.state.log.replication.factor"):
        assert properties[key] == "3"
    assert properties["min.insync.replicas"] == properties["transaction.state.log.min.isr"] == "2"


def test_the_cli_finds_a_cluster_in_its_folder_and_refuses_a_port(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "c"
    LocalKafkaCluster(folder, 3)
    assert main(["dev", "kafka", "status", "--data-dir", str(folder)]) == 3  # not running
    out = capsys.readouterr().out
    assert out.count("broker:    stopped") == 3
    assert all(f"{folder / f'node-{i}'}" in out for i in (1, 2, 3)), out
    assert main(["dev", "kafka", "start", "--brokers", "3", "--port", "9092",
                 "--data-dir", str(folder)]) == 1  # fmt: skip
    assert "--port is for a single broker" in capsys.readouterr().err
    with pytest.raises(LocalKafkaError, match="--brokers 3"):
        LocalKafkaCluster(folder, 5)
