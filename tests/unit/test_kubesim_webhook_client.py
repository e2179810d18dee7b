"""How kubesim's review client reads one reply (tools.kubesim.webhook_client._Reply, sans I/O over
httptools' parser): the same reply however the socket splits it, a body ended by the connection only where
the reply gave no length, and anything else fed to it either read or refused with ValueError."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.kubesim.webhook_client import _MAX_HEAD, _Reply

BODY = b'{"response":{"allowed":true,"patch":"W10="}}'
LENGTH = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
CHUNKED = (
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n" % (10, BODY[:10], len(BODY) - 10, BODY[10:])
    + b"0\r\nX-Trailer: t\r\n\r\n"
)


def _read(pieces: list[bytes]) -> tuple[int, bool, bytes]:
    reply = _Reply()
    for piece in pieces:
        if reply.feed(piece):
            return reply.result()
    assert reply.ended(), "the reply is not complete when the connection ends"
    return reply.result()


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(cut % (len(data) + 1) for cut in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(LENGTH, (200, True, BODY), id="Content-Length"),
        pytest.param(CHUNKED, (201, True, BODY), id="chunked with an extension and a trailer"),
        pytest.param(
            LENGTH.replace(b"OK\r\n", b"OK\r\nConnection: close\r\n"), (200, False, BODY), id="close"
        ),
        pytest.param(
            b"HTTP/1.0 200 OK\r\n\r\n" + BODY, (200, False, BODY), id="HTTP/1.0 ended by the connection"
        ),
        pytest.param(b"HTTP/1.1 204 No Content\r\n\r\n", (204, True, b""), id="no content"),
    ],
)
@given(cuts=st.lists(st.integers(min_value=0), max_size=8))
def test_a_reply_reads_the_same_however_the_socket_splits_it(
    raw: bytes, expected: tuple[int, bool, bytes], cuts: list[int]
) -> None:
    assert _read(_split(raw, cuts)) == expected


@given(cuts=st.lists(st.integers(min_value=0, max_value=len(LENGTH) - 1), max_size=8))
def test_bytes_that_arrive_with_the_end_of_a_reply_keep_its_connection_from_reuse(cuts: list[int]) -> None:
    # Only bytes read together with the reply's end can be seen: a read that ends exactly where the reply
    # ends completes it, and what the server sends later is found by the next review on that connection.
    pieces = _split(LENGTH, cuts)
    pieces[-1] += b"HTTP/1.1 200"
    assert _read(pieces) == (200, False, BODY)


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(LENGTH[:-1], id="body shorter than its Content-Length"),
        pytest.param(CHUNKED[:-5], id="chunks without the last"),
        pytest.param(LENGTH[:20], id="within the head"),
    ],
)
def test_a_reply_cut_by_the_end_of_the_connection_is_not_complete(cut: bytes) -> None:
    reply = _Reply()
    assert not reply.feed(cut)
    assert not reply.ended()


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        pytest.param(b"RTSP/1.0 200 OK\r\n\r\n", "not an HTTP/1.1 reply", id="RTSP"),
        pytest.param(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
            "switched",
            id="upgrade",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            "Content-Length",
            id="two lengths",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 16777217\r\n\r\n",
            "Content-Length",
            id="one byte over the limit",
        ),
        pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"a" * _MAX_HEAD, "longer than", id="head past the limit"),
    ],
)
def test_a_reply_that_is_not_http_or_passes_a_limit_is_refused_naming_the_problem(
    raw: bytes, why: str
) -> None:
    pieces = [raw[i : i + _MAX_HEAD // 2] for i in range(0, len(raw), _MAX_HEAD // 2)]
    with pytest.raises(ValueError, match=why):
        _read(pieces)


@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(min_value=0), max_size=4))
def test_any_bytes_are_read_as_a_reply_or_refused_with_a_value_error(data: bytes, cuts: list[int]) -> None:
    reply = _Reply()
    try:
        for piece in _split(b"HTTP/1.1 " + data, cuts):
            if reply.feed(piece):
                status, _, body = reply.result()
                assert 100 <= status <= 999
                assert isinstance(body, bytes)
                return
    except ValueError:
        return
