"""The RPC layer's shared vocabulary: headers, answers, handlers, and reading fields.

A request or answer header is a msgpack map (:data:`Header`); a handler turns a request's
``(header, payload)`` into an :data:`Answer`. :func:`require` and :func:`optional` (the typed
requests' own, ``estream/wire/fields.py``) read one header field of an expected type or raise
``InvalidArgument`` naming it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

from estream.wire.errors import EstreamError
from estream.wire.fields import Header, optional, require

if TYPE_CHECKING:
    import asyncio

Answer = tuple[Header | None, bytes]
Handler = Callable[[Header, bytes], Awaitable[Answer]]
# A quick handler: (the future to wait for, or None; what to answer once it is done).
QuickHandler = Callable[[Header, bytes], tuple["asyncio.Future[Any] | None", Callable[[], Answer]]]
# Where the server puts the connection's roles (a set of estream/wire/roles.py names) in the
# request header of the opcodes that need them (RpcServer's ``roles_to``).
ROLES_FIELD: Final = "connection_roles"
# start_call's callback: (the answer's header, None) or (None, the error).
Done = Callable[[Header | None, EstreamError | None], None]


class Started(Protocol):
    """A request started by ``start_call`` (or a writer's APPEND or CONFIRM on it)."""

    def abandon(self, error: EstreamError, /) -> None:
        """Fail it now with ``error`` (its callback, once) and drop its references (its
        deadline costs nothing more); a late answer is ignored. Nothing if it was answered
        already."""


__all__ = ["ROLES_FIELD", "Answer", "Done", "Handler", "Header", "QuickHandler", "Started",
           "optional", "require"]
