"""Connecting to NATS and declaring the JetStream streams and KV buckets Kairos needs.

`connect()` returns a `Bus`: the client, its JetStream context and the four KV stores. Declaring is
idempotent, so every service declares what it uses at start-up and the first one to run creates it;
under authorization only the identities allowed to (`shared.security.permissions.declares`: the state
service, the local stack's admin) declare, and the others wait until the streams and buckets exist.

Who we are and how we trust the server is a `NatsAuth`, read from the environment by default
(`KAIROS_NATS_USER`, `KAIROS_NATS_PASSWORD` or `KAIROS_NATS_PASSWORD_FILE`, `KAIROS_NATS_CREDS`,
`KAIROS_NATS_NKEY_SEED_FILE`, `KAIROS_NATS_TLS_CA`/`_CERT`/`_KEY`), never from command-line arguments,
which `ps` shows to everyone. URLs reach log lines and errors only through `redact_url`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import AuthorizationError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServiceUnavailableError

from shared.bus.kv import KvStore
from shared.bus.operations import counting
from shared.contracts import subjects as s
from shared.errors import ConfigError, TemporaryError
from shared.security.permissions import declares, inbox_prefix
from shared.security.redact import redact_url

log = logging.getLogger("kairos.bus")


@dataclass
class Bus:
    nc: Client
    js: JetStreamContext
    state: KvStore
    ledger: KvStore
    leases: KvStore
    usage: KvStore
    """The queues' usage ledgers (time-based fair share), one key per shard."""

    async def follow(
        self, subject: str, stream: str, cb: Callable[[Msg], Awaitable[None]]
    ) -> JetStreamContext.PushSubscription:
        """Every message stored on `subject` in `stream` from now on, through an ordered consumer: a message
        stored while this connection or nats-server was away is delivered once it is back (the consumer
        resumes after the last one delivered), and nothing needs acknowledging."""
        return await self.js.subscribe(
            subject,
            stream=stream,
            ordered_consumer=True,
            # The consumer notices a lost server by two missed heartbeats and is made again after the last
            # message delivered: at 1 s that takes about 2 s after a restart (nats-py's default 5 s: 10 s).
            idle_heartbeat=FOLLOW_HEARTBEAT_S,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
            cb=cb,
        )

    async def close(self) -> None:
        if not self.nc.is_closed:
            await self.nc.drain()


FOLLOW_HEARTBEAT_S = 1.0
"""The idle heartbeat of `Bus.follow`'s ordered consumers."""


async def _stream(js: JetStreamContext, config: StreamConfig, replicas: int | None) -> None:
    """Create the stream with `replicas` (None: 1), or update an existing one to `config` with the replicas
    `existing_replicas` gives it."""
    try:
        await js.add_stream(replace(config, num_replicas=replicas or 1))
    except BadRequestError:  # it exists with another configuration, or `replicas` cannot be had
        current = await _replicas_of(js, str(config.name))
        if current is None:
            raise
        kept = existing_replicas(str(config.name), replicas, current)
        await js.update_stream(replace(config, num_replicas=kept))


async def _bucket(js: JetStreamContext, config: KeyValueConfig, replicas: int | None) -> None:
    """Create the KV bucket with `replicas` (None: 1), or give an existing one the replicas
    `existing_replicas` says, its own configuration otherwise kept."""
    stream = f"KV_{config.bucket}"
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        await js.create_key_value(replace(config, replicas=replicas or 1))
        return
    current = info.config.num_replicas or 1
    kept = existing_replicas(stream, replicas, current)
    if kept != current:
        await js.update_stream(replace(info.config, num_replicas=kept))


async def _replicas_of(js: JetStreamContext, stream: str) -> int | None:
    """The stream's replicas; None when it does not exist."""
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        return None
    return info.config.num_replicas or 1


def existing_replicas(stream: str, configured: int | None, current: int) -> int:
    """The replicas an existing stream (a bucket's too) is given: `configured` when it is more than
    `current`, as for a bucket made at 1 before the cluster grew or by a version that kept what existed.
    Fewer are logged and not applied: one replica started with a stale setting would otherwise take copies
    from every other replica's streams; shrinking is the operator's to do (`nats stream edit`). None (a
    client that does not know the cluster: a test, the bench) keeps `current`."""
    if configured is None or configured == current:
        return current
    if configured < current:
        log.warning(
            "stream %s has %d replicas, more than %s=%d: kept at %d",
            stream,
            current,
            ENV_REPLICAS,
            configured,
            current,
        )
        return current
    log.info("stream %s: replicas raised from %d to %d (%s)", stream, current, configured, ENV_REPLICAS)
    return configured


def _work_queue(name: str, wildcard: str) -> StreamConfig:
    """A stream on disk whose every message one consumer takes (work items, proposals)."""
    return StreamConfig(
        name=name, subjects=[wildcard], retention=RetentionPolicy.WORK_QUEUE, storage=StorageType.FILE
    )


_STREAMS = (
    _work_queue(s.WORK_STREAM, s.WORK_WILDCARD),
    _work_queue(s.PROPOSAL_STREAM, s.PROPOSAL_WILDCARD),
    StreamConfig(
        name=s.EVENTS_STREAM,
        subjects=[s.EVENTS_WILDCARD],
        retention=RetentionPolicy.LIMITS,
        max_age=24 * 3600.0,
        max_msgs=1_000_000,
        storage=StorageType.FILE,
    ),
    StreamConfig(
        name=s.OUTCOME_STREAM,
        subjects=[s.OUTCOMES_WILDCARD],
        retention=RetentionPolicy.LIMITS,
        max_age=s.OUTCOME_MAX_AGE_S,
        storage=StorageType.FILE,
        # A binder that publishes an outcome again (its ack was lost) gives it the same id: stored once.
        duplicate_window=120.0,
    ),
)
_STATE = KeyValueConfig(bucket=s.STATE_BUCKET, history=1, storage=StorageType.FILE)
_LEDGER = KeyValueConfig(bucket=s.LEDGER_BUCKET, history=1, storage=StorageType.FILE)
_LEASES = KeyValueConfig(bucket=s.LEASE_BUCKET, history=1, ttl=s.LEASE_TTL_S, storage=StorageType.FILE)
_USAGE = KeyValueConfig(bucket=s.USAGE_BUCKET, history=1, storage=StorageType.FILE)
_BUCKETS = (_STATE, _LEDGER, _LEASES, _USAGE)


async def declare(js: JetStreamContext, replicas: int | None = None, timeout: float = 30.0) -> None:
    """Create (or update) the streams and KV buckets; safe to run from every replica. `replicas`: each
    one's copies on a JetStream cluster (None: 1 for a new one, an existing one keeps its own; see
    `existing_replicas`). A cluster just started has no meta leader yet and refuses for a few seconds
    ("no suitable peers for placement"): retried until `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    for config in _STREAMS:
        await _retried(f"stream {config.name}", replicas, deadline, partial(_stream, js, config, replicas))
    for bucket in _BUCKETS:
        await _retried(
            f"KV bucket {bucket.bucket}", replicas, deadline, partial(_bucket, js, bucket, replicas)
        )


async def _retried(
    what: str, replicas: int | None, deadline: float, attempt: Callable[[], Awaitable[None]]
) -> None:
    while True:
        try:
            await attempt()
        except (NatsTimeoutError, APIError) as exc:
            if not _not_ready(exc) or asyncio.get_running_loop().time() > deadline:
                setting = f" with {REPLICAS_FIELD}={replicas}" if replicas is not None else ""
                raise ConfigError(f"cannot declare {what}{setting}: {exc}") from exc
            await asyncio.sleep(0.5)
        else:
            return


def _not_ready(exc: Exception) -> bool:
    """JetStream's answers while a cluster elects its leaders (or none at all, a timeout)."""
    if isinstance(exc, NatsTimeoutError | ServiceUnavailableError):
        return True
    text = str(exc).lower()
    return (
        "no suitable peers" in text or "temporarily unavailable" in text or "insufficient resources" in text
    )


REPLICAS_FIELD = "nats_replicas"
"""The setting that names the streams' and buckets' replica count in errors (env KAIROS_NATS_REPLICAS)."""
ENV_REPLICAS = "KAIROS_NATS_REPLICAS"


def server_urls(url: str) -> list[str]:
    """`KAIROS_NATS_URL` may list several servers, comma-separated (a cluster's): nats-py takes them as a
    list, and reconnects to another when its server dies."""
    return [one.strip() for one in url.split(",") if one.strip()]


async def _log_error(exc: Exception) -> None:
    # nats-py's default callback prints a traceback per failed attempt; one line is enough. The server's
    # permission violations arrive here too ("nats: permissions violation for publish to ...").
    log.warning("nats: %s", redact_url(str(exc)))


ENV_USER = "KAIROS_NATS_USER"
ENV_PASSWORD = "KAIROS_NATS_PASSWORD"  # the names of variables, not secrets
ENV_PASSWORD_FILE = "KAIROS_NATS_PASSWORD_FILE"
ENV_CREDS = "KAIROS_NATS_CREDS"
ENV_NKEY_SEED_FILE = "KAIROS_NATS_NKEY_SEED_FILE"
ENV_TLS_CA = "KAIROS_NATS_TLS_CA"
ENV_TLS_CERT = "KAIROS_NATS_TLS_CERT"
ENV_TLS_KEY = "KAIROS_NATS_TLS_KEY"
ENV_NAMES = (
    ENV_USER,
    ENV_PASSWORD,
    ENV_PASSWORD_FILE,
    ENV_CREDS,
    ENV_NKEY_SEED_FILE,
    ENV_TLS_CA,
    ENV_TLS_CERT,
    ENV_TLS_KEY,
)


@dataclass(frozen=True)
class NatsAuth:
    """How a client proves who it is (a user and password, a credentials file, an nkey seed file) and
    how it trusts the server (a CA file; a client certificate for mutual TLS). Empty: no authentication,
    plain TCP unless the URL says `tls://`."""

    user: str | None = None
    password: str | None = field(default=None, repr=False)
    password_file: str | None = None
    credentials: str | None = None
    """A NATS credentials file (JWT and nkey seed, the decentralised model)."""
    nkey_seed_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NatsAuth:
        env = os.environ if env is None else env
        return cls(
            user=env.get(ENV_USER) or None,
            password=env.get(ENV_PASSWORD) or None,
            password_file=env.get(ENV_PASSWORD_FILE) or None,
            credentials=env.get(ENV_CREDS) or None,
            nkey_seed_file=env.get(ENV_NKEY_SEED_FILE) or None,
            tls_ca=env.get(ENV_TLS_CA) or None,
            tls_cert=env.get(ENV_TLS_CERT) or None,
            tls_key=env.get(ENV_TLS_KEY) or None,
        )

    def identity(self, url: str) -> str | None:
        """The user this client connects as: the configured one, else the URL's."""
        if self.user:
            return self.user
        user = urlsplit(_with_scheme(url.split(",", maxsplit=1)[0].strip())).username
        return unquote(user) if user else None

    def options(self, url: str) -> dict[str, Any]:
        """`nats.connect` keyword arguments; errors name the variable or file, never a secret."""
        options: dict[str, Any] = {}
        password = self.password
        if self.password_file:
            try:
                password = Path(self.password_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(
                    f"{ENV_PASSWORD_FILE}: cannot read {self.password_file} ({exc.strerror or exc})"
                ) from exc
        if self.user:
            options["user"] = self.user
        if password:
            if not self.user:
                raise ConfigError(f"{ENV_PASSWORD}: a password needs a user ({ENV_USER})")
            options["password"] = password
        elif not self.user:
            # Credentials written in the URL (the local stack's `admin`, the CLI's `operator`) also go as
            # options: nats-py tries the servers a cluster announces too, and those carry no credentials.
            first = urlsplit(_with_scheme(url.split(",", maxsplit=1)[0].strip()))
            if first.username and first.password:
                options["user"] = unquote(first.username)
                options["password"] = unquote(first.password)
        if self.credentials:
            options["user_credentials"] = self.credentials
        if self.nkey_seed_file:
            options["nkeys_seed"] = self.nkey_seed_file
        if self.tls_ca or self.tls_cert:
            options["tls"] = self._tls_context()
        identity = self.identity(url)
        if identity:
            # Replies to this client come to its own prefix, the one its permissions let it read.
            options["inbox_prefix"] = inbox_prefix(identity)
        return options

    def _tls_context(self) -> ssl.SSLContext:
        try:
            context = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                context.load_cert_chain(self.tls_cert, self.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{ENV_TLS_CA}/{ENV_TLS_CERT}/{ENV_TLS_KEY}: cannot load {self.tls_ca}, {self.tls_cert}: {exc}"
            ) from exc
        return context


def _with_scheme(url: str) -> str:
    return url if "://" in url else f"nats://{url}"


async def _wait_declared(js: JetStreamContext, deadline: float) -> None:
    """Until the streams and buckets exist (an identity that may not declare them waits for one that may)."""
    missing = [str(c.name) for c in _STREAMS] + [f"KV_{c.bucket}" for c in _BUCKETS]
    while missing:
        try:
            await js.stream_info(missing[0])
            missing.pop(0)
            continue
        except Exception as exc:  # not found, or no answer yet: both mean wait
            if asyncio.get_running_loop().time() > deadline:
                raise TemporaryError(
                    f"stream {missing[0]} does not exist (waited for the state service to declare it): {exc}"
                ) from exc
        await asyncio.sleep(0.5)


async def connect(
    url: str,
    name: str,
    credentials: str | None = None,
    timeout: float = 10.0,
    auth: NatsAuth | None = None,
    declared_timeout: float = 60.0,
    replicas: int | None = None,
) -> Bus:
    """Connect (retrying until `timeout`), declare streams and buckets (or, without the right to, wait up
    to `declared_timeout` for them), open the KV stores. `auth` defaults to `NatsAuth.from_env()`;
    `credentials` (a credentials file, the runner's `--credentials`) is added to it. `url` may list several
    servers, comma-separated; `replicas` is what `declare` creates streams and buckets with."""
    auth = NatsAuth.from_env() if auth is None else auth
    if credentials:
        auth = replace(auth, credentials=credentials)
    options = {"reconnect_time_wait": 0.5, **auth.options(url)}
    deadline = asyncio.get_running_loop().time() + timeout
    last: Exception | None = None
    nc: Client | None = None
    while nc is None and asyncio.get_running_loop().time() < deadline:
        client = Client()
        try:
            # The first connection must fail fast (this loop retries until `timeout`); once connected,
            # the client reconnects forever on its own.
            await asyncio.wait_for(
                client.connect(
                    server_urls(url),
                    name=name,
                    connect_timeout=2,
                    max_reconnect_attempts=-1,
                    allow_reconnect=False,
                    error_cb=_log_error,
                    **options,
                ),
                3.0,
            )
            client.options["allow_reconnect"] = True
            nc = client
        except Exception as exc:  # noqa: BLE001 -- translated below
            last = exc
            # A refused attempt leaves its socket open inside nats-py: close it.
            with contextlib.suppress(Exception):
                # Bounded: after a failed TLS handshake nats-py's close can wait forever.
                await asyncio.wait_for(client.close(), 1.0)
            refused = "authorization violation" in str(exc).lower()  # how nats-py reports it while connecting
            if refused or isinstance(exc, AuthorizationError | ssl.SSLCertVerificationError):
                break  # wrong credentials or an untrusted server stay so: say it now, not after `timeout`
            await asyncio.sleep(0.2)
    if nc is None:
        raise TemporaryError(f"cannot connect to NATS at {redact_url(url)}: {redact_url(str(last))}")
    # Every message this client sends is counted by what it is for (`shared.bus.operations`).
    nc.publish = counting(nc.publish)  # type: ignore[method-assign,assignment]
    js = nc.jetstream()
    create = declares(auth.identity(url))
    try:
        if create:
            await declare(js, replicas, declared_timeout)
        else:
            await _wait_declared(js, asyncio.get_running_loop().time() + declared_timeout)
        state, ledger, leases, usage = [KvStore(await js.key_value(c.bucket)) for c in _BUCKETS]
    except BaseException:
        await nc.close()
        raise
    return Bus(nc, js, state, ledger, leases, usage)
