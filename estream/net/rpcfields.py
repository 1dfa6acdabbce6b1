"""The RPC layer's shared vocabulary: headers, answers, handlers, and reading fields.

A request or answer header is a msgpack map (:data:`Header`); a handler turns a request's
``(header, payload)`` into an :data:`Answer`. :func:`require` and :func:`optional` read one
header field of an expected type or raise ``InvalidArgument`` naming it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from estream.wire.errors import EstreamError, InvalidArgument

if TYPE_CHECKING:
    import asyncio

Header = dict[str, Any]
Answer = tuple[Header | None, bytes]
Handler = Callable[[Header, bytes], Awaitable[Answer]]
# A quick handler: (the future to wait for, or None; what to answer once it is done).
QuickHandler = Callable[[Header, bytes], tuple["asyncio.Future[Any] | None", Callable[[], Answer]]]
# start_call's callback: (the answer's header, None) or (None, the error).
Done = Callable[[Header | None, EstreamError | None], None]


def require(header: Header, name: str, kind: type | tuple[type, ...]) -> Any:
    """Fetch a required header field of the given type, or raise :class:`InvalidArgument`.

    ``bool`` is never accepted where ``int`` is asked for.
    """
    if name not in header:
        raise InvalidArgument(f"missing field {name!r}", argument=name)
    value = header[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise InvalidArgument(f"field {name!r} has the wrong type", argument=name)
    return value


def optional(header: Header, name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """Like :func:`require`, but ``default`` when the field is absent or None."""
    if header.get(name) is None:
        return default
    return require(header, name, kind)


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


__all__ = ["Answer", "Done", "Handler", "Header", "QuickHandler", "optional", "require"]
