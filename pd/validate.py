"""What PD checks before anything reaches Raft: sizes, ranges and list lengths of every
request and command field, so that bad input is refused with :class:`InvalidArgument`
naming the field and is never proposed, journaled or kept.

Two checks, one place each:

- :func:`check_request`: an RPC request's header, once where :class:`PdService` dispatches
  (before any handler): every top-level string within its field's length, every integer a
  signed 64-bit one (non-negative for offsets, indexes and counts), every list within its
  field's length and its items checked as the field's items. Maps (a heartbeat's load)
  are the handler's.
- :func:`check_command`: a catalog command, once where every proposal starts
  (:meth:`pd.shell.raft.RaftNode.start_proposal`: RPC, admin HTTP and PD's own rounds):
  the same rules over its fields (and those of its pack members), then its encoding
  within :data:`pd.commands.command_bytes_max`. It returns the encoding, proposed as is.

The catalog still checks what it applies (names' characters, replicas, epochs...): these
checks bound what a command may cost, whatever its kind; the catalog decides what it means.
Why before proposing: a command refused only when applied was already an entry on every
node's journal (a 900 KiB stream name was a 900 KiB entry three times over), and an integer
msgpack cannot encode (2**64) failed inside Raft's path instead of as the caller's error.

Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from estream.wire import limits
from estream.wire.errors import InvalidArgument
from pd.catalog import (
    expire_keys_max,
    object_key_chars_max,
    pack_members_max,
    server_id_chars_max,
    stream_name_chars_max,
    stream_type_chars_max,
)
from pd.commands import Command, command_bytes_max, encode_command
from pd.retention import cursor_name_chars_max

int64_min: Final = -(2**63)
int64_max: Final = 2**63 - 1
address_chars_max: Final = 256  # host:port, a URL
text_chars_max: Final = 1024  # any other string (digests, reasons...)
# A client's request id (the SDK's: 32 hex digits); PD keeps the latest 1,024 deletes' in
# its catalog and snapshots (pd/deleterequests.py), so each is short.
request_id_chars_max: Final = 64
list_items_max: Final = 1024  # any other list

# A string field's length limit, by field name (others: text_chars_max).
_CHARS: Final[Mapping[str, int]] = {
    "name": stream_name_chars_max,
    "cursor": cursor_name_chars_max,
    "server_id": server_id_chars_max,
    "node_id": server_id_chars_max,
    "type": stream_type_chars_max,
    "address": address_chars_max,
    "raft": address_chars_max,
    "rpc": address_chars_max,
    "http": address_chars_max,
    "object_key": object_key_chars_max,
    "replaces": object_key_chars_max,
    "request_id": request_id_chars_max,
}
_SERVER_LISTS: Final = ("hints", "placement", "next_replicas", "replicas", "expected", "exclude")
# A list field's length limit and the field name its items are checked as.
_LISTS: Final[Mapping[str, tuple[int, str]]] = {
    **{name: (limits.servers_in_list_max, "server_id") for name in _SERVER_LISTS},
    "object_keys": (expire_keys_max, "object_key"),
    "members": (pack_members_max, "member"),
    # PD_WRITERS_KEEPALIVE: [name, stream_id, epoch] per writer of one client
    "writers": (limits.keepalive_writers_max, "writer"),
}
# Integer fields that are offsets, indexes, sizes, counts or ids: never negative.
_NON_NEGATIVE: Final = frozenset({
    "stream_id", "range_index", "start", "end", "start_offset", "offset", "size_bytes",
    "replicas", "ack_count", "ensemble", "deadline_ms", "now_ms"})
uint64_max: Final = 2**64 - 1
_UNSIGNED_64: Final = frozenset({"checksum"})  # an object part's xxh3-64


def check_request(header: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidArgument` for a request field out of bounds (module docstring).

    >>> check_request({"name": "orders", "replicas": 3, "hints": ["rs-1"]})
    >>> check_request({"name": "x" * 201})
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: name: 201 characters, at most 200
    >>> check_request({"offset": 2**64})
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: offset: 18446744073709551616 is outside 0..2**63-1
    >>> check_request({"type": chr(0xD800)})
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: type: not Unicode text (a lone surrogate)
    """
    for name, value in header.items():
        if not isinstance(value, Mapping):
            _check(str(name), value)


def check_command(command: Command) -> bytes:
    """The encoding of ``command`` once its fields are within bounds (module docstring);
    raises :class:`InvalidArgument` naming the field (``command``: the whole, too large).

    >>> from pd.commands import TrimStream
    >>> len(check_command(TrimStream("orders", 10)))
    58
    >>> check_command(TrimStream("orders", -1))
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: start_offset: -1 is outside 0..2**63-1
    """
    _check_fields(command)
    data = encode_command(command)
    if len(data) > command_bytes_max:
        raise InvalidArgument(f"command: {len(data)} bytes encoded, at most {command_bytes_max}",
                              argument="command")
    return data


def _check_fields(record: Any) -> None:
    kind = type(record)
    names = _FIELDS.get(kind)
    if names is None:
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(record))
    for name in names:
        value = getattr(record, name)
        if type(value) is str:  # (the most common, as _check decides)
            if len(value) > _CHARS.get(name, text_chars_max) or not value.isascii():
                _check(name, value)
        else:
            _check(name, value)


_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass's field names, worked out once


def _check(name: str, value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        low, high, bounds = (
            (0, uint64_max, "0..2**64-1") if name in _UNSIGNED_64
            else (0, int64_max, "0..2**63-1") if name in _NON_NEGATIVE
            else (int64_min, int64_max, "-2**63..2**63-1"))
        if not low <= value <= high:
            shown = str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit value"
            raise InvalidArgument(f"{name}: {shown} is outside {bounds}", argument=name)
    elif isinstance(value, str):
        limit = _CHARS.get(name, text_chars_max)
        if len(value) > limit:
            raise InvalidArgument(f"{name}: {len(value)} characters, at most {limit}",
                                  argument=name)
        if not value.isascii():
            try:
                value.encode()
            except UnicodeEncodeError:  # (JSON's "\ud800" decodes to one)
                raise InvalidArgument(f"{name}: not Unicode text (a lone surrogate)",
                                      argument=name) from None
    elif isinstance(value, bytes):
        if len(value) > command_bytes_max:
            raise InvalidArgument(f"{name}: {len(value)} bytes, at most {command_bytes_max}",
                                  argument=name)
    elif isinstance(value, (list, tuple)):
        limit, item = _LISTS.get(name, (list_items_max, name))
        if len(value) > limit:
            raise InvalidArgument(f"{name}: {len(value)} items, at most {limit}", argument=name)
        for v in value:
            _check(item, v)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        _check_fields(value)  # a pack member, its object part
