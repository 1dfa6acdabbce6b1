"""Reading one field of a request header (a msgpack or JSON map), checked once.

The typed requests (:mod:`estream.wire.pdmessages`) are built from a header with these,
so that a field missing or of the wrong type is refused with :class:`InvalidArgument`
naming it, in the same words on every port. ``bool`` is never accepted where ``int`` is
asked for.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

from estream.wire import limits
from estream.wire.errors import InvalidArgument

Header = dict[str, Any]  # a frame's header: the request arguments / answer fields

streams_page_default: Final = 100  # PD_LIST_STREAMS, GET /v1/streams without a limit
streams_page_max: Final = 1000  # the most a caller may ask for in one page
stream_name_bytes_max: Final = 1024  # an ``after`` cursor longer than any name is refused
# The characters of a stream, cursor, group or Kafka topic name (each kind has its own length
# bound): letters, digits, '.', '_', '-', not starting with '.' or '-'.
NAME_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def require(header: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """Fetch a required header field of the given type, or raise :class:`InvalidArgument`.

    ``bool`` is never accepted where ``int`` is asked for.

    >>> require({"epoch": 3}, "epoch", int)
    3
    >>> require({"epoch": True}, "epoch", int)
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: field 'epoch' has the wrong type
    """
    if name not in header:
        raise InvalidArgument(f"missing field {name!r}", argument=name)
    value = header[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise InvalidArgument(f"field {name!r} has the wrong type", argument=name)
    return value


def optional(header: Mapping[str, Any], name: str, kind: type | tuple[type, ...],
             default: Any) -> Any:
    """Like :func:`require`, but ``default`` when the field is absent or None."""
    if header.get(name) is None:
        return default
    return require(header, name, kind)


def str_list(header: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """An optional list of strings (absent or None: empty)."""
    value = optional(header, name, list, [])
    if not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"field {name!r} must be a list of strings", argument=name)
    return tuple(value)


def optional_int(header: Mapping[str, Any], name: str) -> int | None:
    """An optional integer, None when absent or None."""
    value = header.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise InvalidArgument(f"field {name!r} must be an integer", argument=name)
    return value


def stream_id_field(header: Mapping[str, Any]) -> int:
    """A request's optional ``stream_id``: the incarnation of ``name`` it acts on (a name
    is reused once deleted); absent or 0, the stream by name alone (older clients)."""
    value: int = optional(header, "stream_id", int, 0)
    if value < 0:
        raise InvalidArgument("field 'stream_id' must be an integer >= 0", argument="stream_id")
    return value


def page_limit(value: object, *, default: int, maximum: int, argument: str = "limit") -> int:
    """A page size asked for: ``default`` when absent (None), else an integer in
    1..``maximum``; ``InvalidArgument`` naming ``argument`` otherwise.

    >>> page_limit(None, default=100, maximum=1000)
    100
    >>> page_limit(7, default=100, maximum=1000)
    7
    """
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise InvalidArgument(f"{argument} must be an integer from 1 to {maximum}, not "
                              f"{str(value)[:32]!r}", argument=argument)
    return value


def page_after(value: object, argument: str = "after") -> str:
    """A name cursor: "" (from the first) when absent, else a string of a sane length."""
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > stream_name_bytes_max:
        raise InvalidArgument(f"{argument} must be a stream name", argument=argument)
    return value


def window_args(args: Mapping[str, Any]) -> tuple[int | None, int | None, int]:
    """A request's window of a stream's ranges: ``"offset"`` or ``"index"`` (at most one;
    neither: the last ranges) and ``"limit"`` (1..``stream_ranges_per_answer_max``,
    absent: ``stream_ranges_per_answer_default``); ``InvalidArgument`` naming the field
    otherwise. Returns ``(offset, index, limit)``."""
    offset, index = args.get("offset"), args.get("index")
    for name, value in (("offset", offset), ("index", index)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 0 <= value < 2**63):
            raise InvalidArgument(f"{name} must be an integer from 0 to 2**63-1",
                                  argument=name)
    if offset is not None and index is not None:
        raise InvalidArgument("give offset or index, not both", argument="index")
    return offset, index, page_limit(args.get("limit"),
                                     default=limits.stream_ranges_per_answer_default,
                                     maximum=limits.stream_ranges_per_answer_max)


def field_names(cls: type) -> tuple[str, ...]:
    """A typed message's field names, in order: its ``WIRE_FIELDS`` row."""
    return tuple(f.name for f in fields(cls))


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
