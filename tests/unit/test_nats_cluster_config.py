"""The local NATS cluster's configuration (`tools.stack.nats_server.NatsCluster`) and the client side of a
cluster: comma-separated server lists and the replica setting. No server runs: `nats-server -t` checks
each node's file."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from shared.bus.connection import existing_replicas, server_urls
from shared.bus.service import parse_config
from shared.errors import ConfigError
from shared.security.nats_config import authorization
from tools.stack.nats_server import NatsCluster, server_binary, write_private
from tools.stack.supervisor import cluster_replicas, with_credentials


def cluster(tmp_path: Path) -> NatsCluster:
    return NatsCluster(
        tmp_path,
        [],
        client_ports=[14001, 14002, 14003],
        route_ports=[16001, 16002, 16003],
        authorization=authorization({"state": "s3cret"}),
        route_password="r0ute-pw",
    )


def test_each_node_names_itself_and_routes_to_the_others_with_the_route_password(tmp_path: Path) -> None:
    text = cluster(tmp_path).config_text(1)
    assert 'server_name: "kairos-1"' in text
    assert 'listen: "127.0.0.1:16002"' in text
    assert '"nats://route:r0ute-pw@127.0.0.1:16001"' in text
    assert '"nats://route:r0ute-pw@127.0.0.1:16003"' in text
    assert '16002"\n' not in text.split("routes:")[1]  # no route to itself
    assert 'user: "route"' in text
    assert 'password: "r0ute-pw"' in text
    assert "authorization {\n  users:" in text  # the clients' identities as on one server


@pytest.mark.parametrize("index", [0, 1, 2])
def test_nats_server_accepts_each_nodes_configuration(tmp_path: Path, index: int) -> None:
    path = tmp_path / f"nats-{index}.conf"
    write_private(path, cluster(tmp_path).config_text(index))
    assert path.stat().st_mode & 0o777 == 0o600
    done = subprocess.run(
        [server_binary(), "-c", str(path), "-t"], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr


def test_a_cluster_url_lists_every_server_with_the_credentials_on_each() -> None:
    url = "nats://127.0.0.1:1,nats://127.0.0.1:2"
    assert with_credentials(url, "admin", "pw") == "nats://admin:pw@127.0.0.1:1,nats://admin:pw@127.0.0.1:2"
    assert server_urls(url + ", ") == ["nats://127.0.0.1:1", "nats://127.0.0.1:2"]
    assert server_urls("nats://127.0.0.1:4222") == ["nats://127.0.0.1:4222"]


def test_replicas_follow_the_cluster_up_to_five() -> None:
    assert [cluster_replicas(n) for n in (3, 5, 7)] == [3, 5, 5]


def test_the_replica_setting_is_validated_naming_its_field() -> None:
    assert parse_config("state", ["--nats-replicas", "3"]).nats_replicas == 3
    assert parse_config("state", []).nats_replicas is None
    with pytest.raises(ConfigError, match=r"\$\.nats_replicas"):
        parse_config("state", ["--nats-replicas", "6"])


@pytest.mark.parametrize(
    ("configured", "current", "kept"),
    [
        (3, 1, 3),  # made before the cluster grew: raised
        (3, 3, 3),
        (None, 3, 3),  # a client that does not know the cluster
        (None, 1, 1),
        (1, 3, 3),  # never lowered
    ],
)
def test_an_existing_stream_is_raised_to_the_setting_and_never_lowered(
    configured: int | None, current: int, kept: int
) -> None:
    assert existing_replicas("KV_kairos_state", configured, current) == kept


def test_a_setting_below_a_streams_replicas_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kairos.bus"):
        existing_replicas("KAIROS_WORK", 1, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "stream KAIROS_WORK has 3 replicas, more than KAIROS_NATS_REPLICAS=1: kept at 3"
    ]
