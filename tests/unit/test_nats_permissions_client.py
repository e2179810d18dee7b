"""How a client takes its NATS identity (shared.bus.connection.NatsAuth): from the environment or files,
never printing a password; the user it connects as decides its inbox prefix, the one its permissions let
it read."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.bus.connection import NatsAuth
from shared.errors import ConfigError
from tools.stack.supervisor import with_credentials


def test_credentials_come_from_the_environment() -> None:
    auth = NatsAuth.from_env(
        {"KAIROS_NATS_USER": "binder", "KAIROS_NATS_PASSWORD": "pw-1", "KAIROS_NATS_TLS_CA": "", "OTHER": "x"}
    )
    assert auth == NatsAuth(user="binder", password="pw-1")
    options = auth.options("nats://127.0.0.1:4222")
    assert options == {"user": "binder", "password": "pw-1", "inbox_prefix": "_INBOX.binder"}


def test_the_password_never_shows_in_the_repr() -> None:
    assert "pw-1" not in repr(NatsAuth(user="binder", password="pw-1"))


def test_a_password_file_is_read_at_connect(tmp_path: Path) -> None:
    secret = tmp_path / "binder.password"
    secret.write_text("from-file\n")
    auth = NatsAuth.from_env({"KAIROS_NATS_USER": "binder", "KAIROS_NATS_PASSWORD_FILE": str(secret)})
    assert auth.options("nats://h:1")["password"] == "from-file"


def test_an_unreadable_password_file_is_named_not_shown(tmp_path: Path) -> None:
    missing = tmp_path / "nope.password"
    with pytest.raises(ConfigError, match=rf"KAIROS_NATS_PASSWORD_FILE: cannot read {missing}"):
        NatsAuth(user="binder", password_file=str(missing)).options("nats://h:1")


def test_a_password_without_a_user_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"a password needs a user \(KAIROS_NATS_USER\)"):
        NatsAuth(password="pw").options("nats://h:1")


def test_the_url_s_user_is_the_identity_when_none_is_configured() -> None:
    url = with_credentials("nats://127.0.0.1:4222", "operator", "pw-2")
    assert url == "nats://operator:pw-2@127.0.0.1:4222"
    assert NatsAuth().identity(url) == "operator"
    # The URL's credentials also go as options: nats-py tries the servers a cluster announces with them.
    assert NatsAuth().options(url) == {
        "inbox_prefix": "_INBOX.operator",
        "user": "operator",
        "password": "pw-2",
    }
    assert NatsAuth(user="binder").identity(url) == "binder"
    assert NatsAuth().identity("nats://127.0.0.1:4222") is None
    assert NatsAuth().options("nats://127.0.0.1:4222") == {}


def test_a_missing_ca_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KAIROS_NATS_TLS_CA"):
        NatsAuth(tls_ca=str(tmp_path / "missing-ca.pem")).options("tls://h:1")
