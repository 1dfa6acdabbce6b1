"""The latest deletes' request ids, so that a retried delete never deletes another
incarnation of its stream (issue 27: names are deleted and reused).

A client retries a delete whose outcome it does not know (a timeout, the leader lost
after the commit) with the request id of its first attempt. The delete may have landed,
and the name may since name a new stream (someone created it again): the retry must
answer the stream it deleted, not delete the new one, nor answer ``StreamNotFound`` for a
delete that happened. The catalog remembers each delete's request id with the name and
the id of the stream it deleted: at most ``limits.delete_requests_max``, the oldest
forgotten first (a retry comes within seconds; a thousand deletes later it is not one),
kept in snapshots. A dict replaced on every change (never changed in place), so that a
view shares it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from estream.wire import limits

DeleteRequests = Mapping[str, tuple[str, int]]  # request id -> (name, stream id), oldest first


def deleted_by(requests: DeleteRequests, request_id: str, name: str) -> int:
    """The id of the stream of ``name`` the delete ``request_id`` deleted (a retry of a
    delete that landed); 0: none (no request id, or not a delete of ``name`` remembered).

    >>> deleted_by({"r1": ("orders", 7)}, "r1", "orders"), deleted_by({}, "r1", "orders")
    (7, 0)
    >>> deleted_by({"r1": ("orders", 7)}, "r1", "other"), deleted_by({"": ("a", 1)}, "", "a")
    (0, 0)
    """
    if not request_id:
        return 0
    found = requests.get(request_id)
    return found[1] if found is not None and found[0] == name else 0


def remember(requests: DeleteRequests, request_id: str, name: str, stream_id: int
             ) -> DeleteRequests:
    """``requests`` and the delete ``request_id`` of stream ``stream_id`` named ``name``
    (a new dict), at most ``limits.delete_requests_max`` (the oldest dropped); without a
    request id, ``requests`` itself (nothing to remember).

    >>> remember({"a": ("x", 1)}, "b", "y", 2), remember({}, "", "y", 2)
    ({'a': ('x', 1), 'b': ('y', 2)}, {})
    """
    if not request_id:
        return requests
    kept = dict(requests)
    kept.pop(request_id, None)
    kept[request_id] = (name, stream_id)
    while len(kept) > limits.delete_requests_max:
        del kept[next(iter(kept))]
    return kept


def requests_to_wire(requests: DeleteRequests) -> list[list[Any]]:
    """A snapshot's ``delete_requests``: ``[request id, name, stream id]``, oldest first."""
    return [[request_id, name, sid] for request_id, (name, sid) in requests.items()]


def requests_from_wire(rows: Any) -> dict[str, tuple[str, int]]:
    """What :func:`requests_to_wire` wrote (absent in older snapshots: pass ``()``)."""
    return {str(request_id): (str(name), int(sid)) for request_id, name, sid in rows}
