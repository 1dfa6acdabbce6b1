"""The Raft port's message encoding: pysyncobj's TCP connection, authenticated and
encrypted with AES-256-GCM instead of its zlib + Fernet.

pysyncobj 0.3.17 sends every message as ``zlib.compress(pickle)`` (level 3) encrypted with
Fernet (AES-CBC, HMAC-SHA256 and base64, with a key derived from ``--password``); each
message a commit waits for (the leader's entries, a follower's acknowledgement) paid that
several times over, sending and receiving. :class:`RaftConnection` (every connection
pysyncobj opens or accepts in this process) replaces only the encoding of a message; the
handshake is pysyncobj's: each side of a new connection sends the other a random 32-byte
key (the key its peer sends it messages under), then the connecting side sends its Raft
address.

A frame is a 4-byte length (native order, as pysyncobj's) and a body whose first byte is
its kind:

- ``KIND_PLAIN`` (no password): the message;
- ``KIND_HELLO``: a direction's first message, before its session key exists (the
  handshake's random key): a random 12-byte nonce, then the message sealed with AES-GCM
  under the *master key*, PBKDF2-HMAC-SHA256 of the password (100,000 iterations, as
  pysyncobj's);
- ``KIND_SESSION``: every later message, sealed under the direction's *session key*,
  HMAC-SHA256(master key, the receiver's random key), with the message's number on that
  direction as the nonce (not sent: both sides count). A fresh random key per connection
  and direction makes every (key, nonce) pair unique; a message replayed, reordered,
  dropped or moved to another connection fails authentication and the receiver drops the
  connection, as it does on anything it cannot decode.

A message is one flags byte (bit 0: zlib-compressed, only for messages of at least
:data:`compress_at` bytes where that helps) and its pickle (protocol 5), unpickled with
:func:`primitive_loads` (primitives only) even when authenticated. The kind byte is
authenticated too (AES-GCM's associated data).

Receiving (:class:`RaftInbox`, one per connection): bytes are appended to one
``bytearray`` and each frame is cut from its front once whole, so a frame costs time
linear in its size however slowly it arrives (pysyncobj re-concatenated its whole
``bytes`` buffer on every read: a 64 MiB frame trickled in cost the leader tens of seconds of
CPU). Until a frame on the connection has been opened (for the accepting side, the
connecting side's ``KIND_HELLO``, proof that the peer holds the password), a frame may
announce at most :data:`hello_bytes_max`, at most :data:`unproven_bytes_max` may wait in
the buffer and the proof must come within :data:`hello_s_max`; otherwise the connection
is closed before anything more is read. A proven peer's frames are bounded by
:data:`frame_bytes_max`.

Every PD node of a cluster must use this encoding: pysyncobj's own (earlier versions of
PD) and this one do not understand each other, so a node of the other kind is cut off.
Upgrade one node at a time (a rolling restart): with three nodes, the majority stays
with the old ones after the first and moves to the new ones with the second (one
election).

Side effects: none beyond pysyncobj's sockets (installing :class:`RaftConnection` replaces
pysyncobj's module-level names: :func:`pd.shell.raftpatch.install` does it).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import io
import os
import pickle
import socket
import struct
import time
import zlib
from typing import Any, Final

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pysyncobj.tcp_connection import TcpConnection

KIND_PLAIN: Final = 0
KIND_HELLO: Final = 1
KIND_SESSION: Final = 2
_HELLO_AD: Final = bytes([KIND_HELLO])
_SESSION_AD: Final = bytes([KIND_SESSION])
_FLAG_ZLIB: Final = 1
compress_at: Final = 64 * 1024  # smaller messages go as they are (zlib costs more than it saves)
# A frame announcing more is refused at once, before its body is read or authenticated: the
# largest real message (a batch of entries, a snapshot chunk) is far smaller.
frame_bytes_max: Final = 64 * 1024 * 1024
# Before a peer proved the password, its first frame (the handshake's random key, about
# 100 bytes sealed; an address or a utility message without a password) may announce at
# most this much, and at most unproven_bytes_max may wait to be read, for hello_s_max.
hello_bytes_max: Final = 4 * 1024
unproven_bytes_max: Final = 16 * 1024
hello_s_max: Final = 10.0
_SALT: Final = b"estream-pd-raft-v2"
_SESSION_LABEL: Final = b"estream-pd-raft-session"
_LENGTH: Final = struct.Struct("i")  # pysyncobj's frame prefix

# Raft messages hold only primitives (pysyncobj's dicts, lists, tuples, bytes and strings);
# pickle protocol 2 (pysyncobj's journal commands) names bytes by `_codecs.encode`.
_PICKLE_GLOBALS_ALLOWED: Final = frozenset({
    (module, name)
    for module in ("_codecs", "builtins", "__builtin__")  # protocol 2 names Python 2's
    for name in ("encode", "set", "frozenset", "bytearray")
    if (module == "_codecs") == (name == "encode")
})


class _PrimitiveUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PICKLE_GLOBALS_ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle global {module}.{name}")
        return super().find_class(module, name)


def primitive_loads(data: bytes | bytearray | memoryview | str) -> Any:
    """``pickle.loads`` refusing every global but the few primitives Raft messages use:
    an unrestricted unpickler would run code chosen by anyone who reaches the port."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _PrimitiveUnpickler(io.BytesIO(raw)).load()


class FrameRefused(ValueError):
    """A peer sent what the Raft port does not accept (the connection is closed)."""


class RaftInbox:
    """One connection's received bytes, cut into frame bodies (pure: no I/O).

    Appending is amortized O(bytes) (a ``bytearray``), and so is taking a frame (``del``
    from the front of a ``bytearray`` moves its start, not its content): a frame costs
    O(its size) however it is split into reads. :meth:`feed` and :meth:`take` raise
    :class:`FrameRefused` on a frame announcing more than allowed, or, before the peer is
    :attr:`proven` (set by the connection once it opened a frame), on more than
    :data:`unproven_bytes_max` waiting or bytes arriving :data:`hello_s_max` after
    :meth:`clear` (the connection's start; times in seconds of the caller's clock).
    """

    def __init__(self, now_s: float = 0.0) -> None:
        self._buffer = bytearray()
        self.proven = False
        self._started_s = now_s

    def __len__(self) -> int:
        return len(self._buffer)

    def clear(self, now_s: float = 0.0) -> None:
        self._buffer = bytearray()
        self.proven = False
        self._started_s = now_s

    def _announced(self) -> int | None:
        if len(self._buffer) < _LENGTH.size:
            return None
        (size,) = _LENGTH.unpack_from(self._buffer)
        limit = frame_bytes_max if self.proven else hello_bytes_max
        if not 0 <= size <= limit:  # a peer without the key can announce anything
            raise FrameRefused(f"a frame of {size} bytes (at most {limit} now)")
        return int(size)

    def feed(self, data: bytes, now_s: float = 0.0) -> None:
        if not self.proven and now_s - self._started_s > hello_s_max:
            raise FrameRefused(f"no proof of the password within {hello_s_max} s")
        self._buffer += data
        if not self.proven and len(self._buffer) > unproven_bytes_max:
            raise FrameRefused(f"{len(self._buffer)} bytes before the peer proved the password")
        self._announced()

    def take(self) -> bytes | None:
        """The next whole frame's body, or None until it is whole."""
        size = self._announced()
        if size is None or len(self._buffer) - _LENGTH.size < size:
            return None
        end = _LENGTH.size + size
        body = bytes(self._buffer[_LENGTH.size:end])
        del self._buffer[:end]
        return body


class RaftCipher:
    """The keys of one password: the master key (first messages) and, per random key a
    connection's receiver chose, a session key. pysyncobj calls it as its
    ``getEncryptor`` and hands it to every connection as ``encryptor``."""

    def __init__(self, password: str | bytes) -> None:
        secret = password.encode("utf-8") if isinstance(password, str) else password
        self._master_key = hashlib.pbkdf2_hmac("sha256", secret, _SALT, 100_000, 32)
        self.master = AESGCM(self._master_key)

    def session(self, rand_key: bytes) -> AESGCM:
        if not isinstance(rand_key, bytes) or len(rand_key) < 16:
            raise ValueError("a session needs the peer's random key")
        return AESGCM(hmac.digest(self._master_key, _SESSION_LABEL + rand_key, "sha256"))


def _nonce(number: int) -> bytes:
    return number.to_bytes(12, "little")


class RaftConnection(TcpConnection):  # type: ignore[misc]
    """pysyncobj's connection with the encoding above (see the module docstring).
    ``sendRandKey`` / ``recvRandKey`` (pysyncobj's handshake keys) select the session
    keys; a new handshake (a reconnection) starts both directions' counts afresh."""

    _TcpConnection__writeBuffer: bytes  # pysyncobj's send buffer (name-mangled)
    _TcpConnection__socket: socket.socket | None
    _TcpConnection__recvBufferSize: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inbox = RaftInbox(time.monotonic())
        self._send_for: bytes | None = None
        self._send_aead: AESGCM | None = None
        self._sent = 0
        self._recv_for: bytes | None = None
        self._recv_aead: AESGCM | None = None
        self._received = 0
        super().__init__(*args, **kwargs)

    def send(self, message: Any) -> None:
        body = self.seal(message)
        self._TcpConnection__writeBuffer += _LENGTH.pack(len(body)) + body
        self._TcpConnection__trySendBuffer()

    def seal(self, message: Any) -> bytes:
        """One message's frame body (without the length prefix)."""
        inner = pickle.dumps(message, 5)
        flags = 0
        if len(inner) >= compress_at:
            packed = zlib.compress(inner, 3)
            if len(packed) < len(inner):
                inner, flags = packed, _FLAG_ZLIB
        plain = bytes([flags]) + inner
        cipher: RaftCipher | None = self.encryptor
        if cipher is None:
            return bytes([KIND_PLAIN]) + plain
        key = self.sendRandKey
        if not key:
            nonce = os.urandom(12)
            return _HELLO_AD + nonce + cipher.master.encrypt(nonce, plain, _HELLO_AD)
        if key != self._send_for or self._send_aead is None:
            self._send_for, self._send_aead, self._sent = key, cipher.session(key), 0
        nonce = _nonce(self._sent)
        self._sent += 1
        return _SESSION_AD + self._send_aead.encrypt(nonce, plain, _SESSION_AD)

    def open(self, body: bytes) -> Any:
        """The message in a frame body; raises on anything not sealed as expected."""
        if not body:
            raise ValueError("an empty frame")
        kind = body[0]
        cipher: RaftCipher | None = self.encryptor
        if cipher is None:
            if kind != KIND_PLAIN:
                raise ValueError("an encrypted message, and no password")
            plain = memoryview(body)[1:]
        elif kind == KIND_HELLO and not self.recvRandKey:
            plain = memoryview(cipher.master.decrypt(body[1:13], body[13:], _HELLO_AD))
        elif kind == KIND_SESSION and self.recvRandKey:
            key = self.recvRandKey
            if key != self._recv_for or self._recv_aead is None:
                self._recv_for, self._recv_aead, self._received = key, cipher.session(key), 0
            plain = memoryview(self._recv_aead.decrypt(
                _nonce(self._received), body[1:], _SESSION_AD))
            self._received += 1
        else:
            raise ValueError(f"a message of kind {kind} is not expected now")
        flags = plain[0]
        if flags == _FLAG_ZLIB:
            return primitive_loads(zlib.decompress(plain[1:]))
        if flags:
            raise ValueError(f"unknown message flags {flags}")
        return primitive_loads(plain[1:])

    def connect(self, host: str, port: int) -> bool:
        self._inbox.clear(time.monotonic())
        return bool(super().connect(host, port))

    def disconnect(self) -> None:
        self._inbox.clear(time.monotonic())
        super().disconnect()

    # pysyncobj's reader calls this (name-mangled) until it returns False: one recv.
    def _TcpConnection__processRead(self) -> bool:  # noqa: N802
        sock = self._TcpConnection__socket
        if sock is None:
            return False
        try:
            incoming = sock.recv(self._TcpConnection__recvBufferSize)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self.disconnect()
            return False
        if not incoming or sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return False
        try:
            self._inbox.feed(incoming, time.monotonic())
        except FrameRefused:
            self.disconnect()
            return False
        return True

    # pysyncobj's reader calls this (name-mangled) for each complete frame in its buffer.
    def _TcpConnection__processParseMessage(self) -> Any:  # noqa: N802
        try:
            body = self._inbox.take()
            if body is None:
                return None
            message = self.open(body)
        except Exception:  # too large, forged, damaged, replayed or foreign: drop it
            self.disconnect()
            return None
        self._inbox.proven = True
        return message
