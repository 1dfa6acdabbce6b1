"""The Raft port's encoding (pd/shell/raftwire.py): pysyncobj's handshake over AES-GCM
session keys; forged, replayed, reordered or foreign messages are refused."""

from __future__ import annotations

import os
import pickle
import struct

import pytest
from cryptography.exceptions import InvalidTag

from pd.shell.raftwire import (
    KIND_HELLO,
    KIND_PLAIN,
    KIND_SESSION,
    FrameRefused,
    RaftCipher,
    RaftConnection,
    RaftInbox,
    compress_at,
    frame_bytes_max,
    hello_bytes_max,
    hello_s_max,
    unproven_bytes_max,
)

REFUSED = (InvalidTag, ValueError)
CIPHER = RaftCipher("the-cluster-secret")  # one PBKDF2 for the module


def _conn(cipher: RaftCipher | None = CIPHER) -> RaftConnection:
    conn = RaftConnection(None)  # no socket: seal and open only
    conn.encryptor = cipher
    return conn


def _handshake() -> tuple[RaftConnection, RaftConnection]:
    """pysyncobj's handshake, message by message: the connecting side sends its random
    key, the accepting side answers with its own, the connecting side its address."""
    out, inc = _conn(), _conn()
    out.recvRandKey = os.urandom(32)
    hello = out.seal(out.recvRandKey)
    assert hello[0] == KIND_HELLO
    inc.sendRandKey = inc.open(hello)
    inc.recvRandKey = os.urandom(32)
    answer = inc.seal(inc.recvRandKey)
    assert answer[0] == KIND_SESSION
    out.sendRandKey = out.open(answer)
    assert inc.open(out.seal("127.0.0.1:4000")) == "127.0.0.1:4000"
    return out, inc


def test_messages_go_both_ways_after_the_handshake() -> None:
    out, inc = _handshake()
    message = {"type": "append_entries", "term": 3, "commit_index": 9,
               "entries": [(b"\x01cmd", 10, 3)], "prevLogIdx": 9, "prevLogTerm": 3}
    for _ in range(3):
        assert inc.open(out.seal(message)) == message
        assert out.open(inc.seal({"type": "next_node_idx", "next_node_idx": 11})) == {
            "type": "next_node_idx", "next_node_idx": 11}


def test_a_replayed_reordered_or_altered_message_is_refused() -> None:
    out, inc = _handshake()
    first, second = out.seal({"n": 1}), out.seal({"n": 2})
    with pytest.raises(REFUSED):
        inc.open(second)  # before the first
    assert inc.open(first) == {"n": 1}
    with pytest.raises(REFUSED):
        inc.open(first)  # again
    assert inc.open(second) == {"n": 2}
    third = bytearray(out.seal({"n": 3}))
    third[-1] ^= 1
    with pytest.raises(REFUSED):
        inc.open(bytes(third))


def test_a_message_of_another_connection_is_refused() -> None:
    out, _ = _handshake()
    _, other = _handshake()
    with pytest.raises(REFUSED):
        other.open(out.seal({"n": 1}))


def test_another_password_or_no_password_is_refused() -> None:
    out = _conn()
    out.recvRandKey = os.urandom(32)
    hello = out.seal(out.recvRandKey)
    with pytest.raises(REFUSED):
        _conn(RaftCipher("another-secret")).open(hello)
    with pytest.raises(REFUSED):
        _conn(None).open(hello)
    plain = _conn(None).seal({"n": 1})
    assert plain[0] == KIND_PLAIN and _conn(None).open(plain) == {"n": 1}
    with pytest.raises(REFUSED):
        _conn().open(plain)  # a password: no unencrypted message


def test_each_kind_only_when_expected() -> None:
    out, inc = _handshake()
    hello = _conn().seal(b"k" * 32)  # a first message, once the session exists
    with pytest.raises(ValueError, match="not expected"):
        inc.open(hello)
    fresh = _conn()
    with pytest.raises(ValueError, match="not expected"):
        fresh.open(out.seal({"n": 1}))  # a session message before the handshake


def test_large_messages_are_compressed_small_ones_not() -> None:
    out, inc = _handshake()
    big = {"type": "append_entries", "entries": [(b"x" * compress_at, 1, 1)]}
    sealed = out.seal(big)
    assert len(sealed) < compress_at // 10
    assert inc.open(sealed) == big
    small = {"type": "next_node_idx", "next_node_idx": 5}
    assert len(out.seal(small)) > len(pickle.dumps(small, 5))  # as is, plus the tag


def test_an_authenticated_message_still_unpickles_primitives_only() -> None:
    out, inc = _handshake()

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (print, ("owned",))

    sealed = out.seal({"type": "append_entries", "entries": [Evil()]})
    with pytest.raises(pickle.UnpicklingError):
        inc.open(sealed)


def _framed(body: bytes) -> bytes:
    return struct.pack("i", len(body)) + body  # pysyncobj's prefix


@pytest.mark.parametrize("size", [-1, frame_bytes_max + 1, 2**31 - 1])
def test_a_frame_announcing_too_much_drops_the_connection_before_its_body(size: int) -> None:
    conn = _conn()
    conn._inbox.proven = True
    dropped: list[bool] = []
    conn.disconnect = lambda: dropped.append(True)
    conn._inbox._buffer += struct.pack("i", size) + b"x" * 16
    assert conn._TcpConnection__processParseMessage() is None
    assert dropped == [True]


@pytest.mark.parametrize("size", [hello_bytes_max + 1, frame_bytes_max, 2**31 - 1, -1])
def test_before_the_password_is_proven_only_a_small_frame_is_accepted(size: int) -> None:
    inbox = RaftInbox()
    with pytest.raises(FrameRefused):
        inbox.feed(struct.pack("i", size))  # refused on its 4-byte announcement


def test_before_the_password_is_proven_only_a_few_kib_may_wait() -> None:
    inbox = RaftInbox()
    hello = b"h" * 100
    inbox.feed(_framed(hello))
    with pytest.raises(FrameRefused):
        inbox.feed(b"\0" * unproven_bytes_max)  # more behind the unopened hello


def test_a_peer_must_prove_the_password_in_time() -> None:
    slow = RaftInbox(now_s=100.0)
    slow.feed(b"\4\0", now_s=100.0 + hello_s_max)  # half an announcement, in time
    with pytest.raises(FrameRefused):
        slow.feed(b"\0\0", now_s=100.0 + hello_s_max + 0.1)
    proven = RaftInbox(now_s=100.0)
    proven.feed(_framed(b"hello"), now_s=100.0)
    assert proven.take() == b"hello"
    proven.proven = True
    proven.feed(_framed(b"later"), now_s=100.0 + 10 * hello_s_max)  # no deadline once proven
    assert proven.take() == b"later"


def test_a_proven_peer_may_send_large_frames_cut_into_any_reads() -> None:
    inbox = RaftInbox()
    inbox.feed(_framed(b"hello"))
    assert inbox.take() == b"hello"
    inbox.proven = True
    big = os.urandom(3 * 1024 * 1024)
    stream = _framed(big) + _framed(b"next") + _framed(b"")
    for at in range(0, len(stream) - 7, 7919):  # reads of odd sizes, one frame across many
        inbox.feed(stream[at:at + 7919])
        if at + 7919 < len(big) + 4:
            assert inbox.take() is None
    assert inbox.take() == big
    assert inbox.take() == b"next"
    assert inbox.take() == b""
    assert inbox.take() is None and len(inbox) == 0


def test_a_connection_proves_the_password_by_its_first_opened_frame() -> None:
    out = _conn()
    out.recvRandKey = os.urandom(32)
    inc = _conn()
    assert not inc._inbox.proven
    inc._inbox.feed(_framed(out.seal(out.recvRandKey)))
    assert inc._TcpConnection__processParseMessage() == out.recvRandKey
    assert inc._inbox.proven
    inc._inbox.feed(struct.pack("i", hello_bytes_max * 4))  # now allowed: a proven peer
    assert inc._TcpConnection__processParseMessage() is None


def test_a_forged_hello_does_not_prove_anything() -> None:
    inc = _conn()
    dropped: list[bool] = []
    inc.disconnect = lambda: dropped.append(True)
    forged = _conn(RaftCipher("a guess")).seal(os.urandom(32))
    inc._inbox.feed(_framed(forged))
    assert inc._TcpConnection__processParseMessage() is None
    assert dropped == [True] and not inc._inbox.proven
