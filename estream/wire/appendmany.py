"""APPEND_MANY: many record batches to one range server in one request, one result each.

A client's writers whose batches go to the same range server in the same event-loop turn
share one request (``estream/net/appendsender.py``): the per-request costs (a frame each
way, a dispatch, a timer, a log write) are paid once for all of them. Each entry is an
APPEND of its own: checked, decided and logged as one, answered with its own end or its
own typed error; one bad entry never fails the others.

Request: header ``{"deferred": bool, "sizes": [n0, n1, ...], "server_id"?}``, payload the
batches one after another (entry ``i`` is the ``sizes[i]`` bytes after the ones before it).
Answer: ``{"results": [r0, r1, ...]}``, one per entry in request order, each the entry's
end (an int, as APPEND's ``"end"``) or ``{"error": {"code", "message", "fields"}}``.

Which queued batches share a request is :func:`group_entries`: in order, at most
``limits.append_many_entries_max`` entries and ``limits.append_many_bytes_max`` bytes
each; a group of one goes as a plain APPEND (the lone writer's path, unchanged).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from estream.wire import limits
from estream.wire.errors import EstreamError, InvalidArgument, MalformedFrame, from_wire

Result = int | EstreamError  # an entry's end, or why it was refused

SIZES_FIELD: Final = "sizes"
RESULTS_FIELD: Final = "results"


def encode_request(
    batches: Sequence[bytes | memoryview], deferred: bool, server_id: str | None
) -> tuple[dict[str, Any], bytes]:
    """The header and payload of an APPEND_MANY carrying ``batches`` in order."""
    header: dict[str, Any] = {"deferred": deferred, SIZES_FIELD: [len(b) for b in batches]}
    if server_id is not None:
        header["server_id"] = server_id
    return header, b"".join(batches)


def decode_request(header: dict[str, Any], payload: bytes) -> tuple[bool, list[bytes]]:
    """``(deferred, batches)`` of a request; :class:`InvalidArgument` naming the field for
    a request that is not well formed as a whole (then no entry is served). Each batch's
    own checks are the store's, per entry, as for APPEND.

    >>> decode_request({"deferred": False, "sizes": [2, 1]}, b"abc")
    (False, [b'ab', b'c'])
    """
    deferred = header.get("deferred", False)
    if type(deferred) is not bool:
        raise InvalidArgument(f"'deferred' must be a bool, not {deferred!r}"[:200],
                              argument="deferred")
    sizes = header.get(SIZES_FIELD)
    if not isinstance(sizes, list) or not sizes:
        raise InvalidArgument("'sizes' must be a non-empty list of batch sizes",
                              argument=SIZES_FIELD)
    if len(sizes) > limits.append_many_entries_max:
        raise InvalidArgument(
            f"{len(sizes)} entries in one APPEND_MANY: at most "
            f"{limits.append_many_entries_max}", argument=SIZES_FIELD)
    total = 0
    for size in sizes:
        if type(size) is not int or not 0 < size <= limits.batch_bytes_max:
            raise InvalidArgument(
                f"a size in 'sizes' must be 1..{limits.batch_bytes_max}, not {size!r}"[:200],
                argument=SIZES_FIELD)
        total += size
    if total != len(payload):
        raise InvalidArgument(
            f"'sizes' add up to {total} bytes, the payload is {len(payload)}",
            argument=SIZES_FIELD)
    batches, at = [], 0
    for size in sizes:
        batches.append(payload[at : at + size])
        at += size
    return deferred, batches


def encode_answer(results: Sequence[Result]) -> dict[str, Any]:
    """The answer header of an APPEND_MANY, one result per entry in request order."""
    return {RESULTS_FIELD: [r if isinstance(r, int) else {"error": r.to_wire()}
                            for r in results]}


def decode_answer(body: dict[str, Any], entries: int) -> list[Result]:
    """The ``entries`` results of an answer; :class:`MalformedFrame` when it does not hold
    one per entry (each entry then fails with it). A result that is neither an int nor an
    error is :class:`MalformedFrame` for that entry alone."""
    results = body.get(RESULTS_FIELD)
    if not isinstance(results, list) or len(results) != entries:
        raise MalformedFrame(f"an APPEND_MANY answer of {entries} entries has results "
                             f"{str(results)[:100]}")
    return [_result(r) for r in results]


def _result(raw: object) -> Result:
    if type(raw) is int:
        return raw
    if isinstance(raw, dict) and "error" in raw:
        return from_wire(raw["error"])
    return MalformedFrame(f"an APPEND_MANY result is {str(raw)[:100]}, not an end or an error")


def group_entries(
    sizes: Sequence[int],
    entries_max: int = limits.append_many_entries_max,
    bytes_max: int = limits.append_many_bytes_max,
) -> list[range]:
    """Split queued batches (their ``sizes``, in send order) into consecutive requests:
    each at most ``entries_max`` entries and ``bytes_max`` bytes; a batch larger than
    ``bytes_max`` on its own. A group of one is sent as a plain APPEND.

    >>> group_entries([10, 10, 10], entries_max=2, bytes_max=100)
    [range(0, 2), range(2, 3)]
    >>> group_entries([60, 60, 200, 5], entries_max=8, bytes_max=100)
    [range(0, 1), range(1, 2), range(2, 3), range(3, 4)]
    >>> group_entries([])
    []
    """
    groups: list[range] = []
    start, count, used = 0, 0, 0
    for i, size in enumerate(sizes):
        if count and (count == entries_max or used + size > bytes_max):
            groups.append(range(start, i))
            start, count, used = i, 0, 0
        count += 1
        used += size
    if count:
        groups.append(range(start, len(sizes)))
    return groups


__all__ = [
    "RESULTS_FIELD",
    "SIZES_FIELD",
    "Result",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
    "group_entries",
]
