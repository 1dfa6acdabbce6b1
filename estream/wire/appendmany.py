"""APPEND_MANY: many record batches (and confirms) to one range server in one request.

A client's writers whose batches go to the same range server in the same event-loop turn
share one request (``estream/net/appendsender.py``): a frame each way, a dispatch and a
log write's fsync wait are paid once. Each entry is an APPEND (or an idle writer's
CONFIRM) of its own: checked, decided, logged and answered alone; one bad entry never
fails the others; so is each confirm hint (a CONFIRM with ``durable=False``: raised in
memory, nothing logged, ``estream/core/confirmhint.py``). The header (``sizes``,
``confirms``, ``hints``, ``deferred``) and the answer (``results``, ``confirmed``,
``hinted``): docs/PROTOCOL.md. :func:`group_entries` decides which queued
batches share a request: in order, at most ``limits.append_many_entries_max`` entries and
``limits.append_many_bytes_max`` bytes; a group of one goes as a plain APPEND.

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
CONFIRMS_FIELD: Final = "confirms"
CONFIRMED_FIELD: Final = "confirmed"
HINTS_FIELD: Final = "hints"  # confirm hints: CONFIRMs with durable=False
HINTED_FIELD: Final = "hinted"
BATCH_FIELD: Final = "batch"  # APPEND's batch index (a striped range's: ARCHITECTURE 10)
BATCHES_FIELD: Final = "batches"  # APPEND_MANY's, one per batch (null: none)
_INDEX_MAX: Final = 2**63 - 1


Confirm = tuple[int, int, int, int]  # stream_id, range_index, epoch, confirm


def encode_request(
    batches: Sequence[bytes | memoryview], deferred: bool, server_id: str | None,
    confirms: Sequence[Confirm] = (), indexes: Sequence[int | None] | None = None,
    hints: Sequence[Confirm] = (),
) -> tuple[dict[str, Any], list[bytes | memoryview]]:
    """The header and payload of an APPEND_MANY carrying ``batches``, ``confirms`` and
    confirm ``hints`` in order; ``indexes``: each batch's index in its striped range (None:
    not striped), sent only when one is given. The payload is the batches as they are, one
    after another: a list of buffers that ``encode_frame`` writes without joining them
    (joined, it is the bytes :func:`decode_request` takes)."""
    header: dict[str, Any] = {"deferred": deferred, SIZES_FIELD: [len(b) for b in batches]}
    if indexes is not None and any(i is not None for i in indexes):
        header[BATCHES_FIELD] = list(indexes)
    if confirms:
        header[CONFIRMS_FIELD] = [list(c) for c in confirms]
    if hints:
        header[HINTS_FIELD] = [list(c) for c in hints]
    if server_id is not None:
        header["server_id"] = server_id
    return header, list(batches)


def decode_request(
    header: dict[str, Any], payload: bytes
) -> tuple[bool, list[bytes], list[Confirm], list[Confirm]]:
    """``(deferred, batches, confirms, hints)`` of a request; :class:`InvalidArgument`
    naming the field for a request that is not well formed as a whole (then no entry is
    served). Each batch's own checks are the store's, per entry, as for APPEND; so are the
    bounds of each confirm's and hint's numbers (as for CONFIRM).

    >>> decode_request({"deferred": False, "sizes": [2, 1]}, b"abc")
    (False, [b'ab', b'c'], [], [])
    """
    deferred = header.get("deferred", False)
    if type(deferred) is not bool:
        raise InvalidArgument(f"'deferred' must be a bool, not {deferred!r}"[:200],
                              argument="deferred")
    sizes = _entries(header, SIZES_FIELD, [])
    confirms = [_confirm(c, CONFIRMS_FIELD) for c in _entries(header, CONFIRMS_FIELD, [])]
    hints = [_confirm(c, HINTS_FIELD) for c in _entries(header, HINTS_FIELD, [])]
    if not sizes and not confirms and not hints:
        raise InvalidArgument("an APPEND_MANY needs at least one batch, confirm or hint",
                              argument=SIZES_FIELD)
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
    return deferred, batches, confirms, hints


def batch_index(value: object, field: str = BATCH_FIELD) -> int | None:
    """A batch index as sent (None: none): 0..2**63-1, else :class:`InvalidArgument`
    naming ``field``.

    >>> batch_index(7), batch_index(None)
    (7, None)
    """
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= _INDEX_MAX:
        raise InvalidArgument(f"a batch index must be 0..{_INDEX_MAX}, not {value!r}"[:200],
                              argument=field)
    return value


def batch_indexes(header: dict[str, Any], count: int) -> list[int | None]:
    """APPEND_MANY's ``"batches"``: one index (or null) per batch; absent, none.

    >>> batch_indexes({}, 2), batch_indexes({"batches": [3, None]}, 2)
    ([None, None], [3, None])
    """
    raw = header.get(BATCHES_FIELD)
    if raw is None:
        return [None] * count
    if not isinstance(raw, list) or len(raw) != count:
        raise InvalidArgument(f"{BATCHES_FIELD!r} must list one index per batch ({count})",
                              argument=BATCHES_FIELD)
    return [batch_index(v, BATCHES_FIELD) for v in raw]


def _entries(header: dict[str, Any], field: str, default: list[Any]) -> list[Any]:
    """A list field of at most ``limits.append_many_entries_max`` items."""
    value = header.get(field, default)
    if not isinstance(value, list):
        raise InvalidArgument(f"{field!r} must be a list", argument=field)
    if len(value) > limits.append_many_entries_max:
        raise InvalidArgument(
            f"{len(value)} {field} in one APPEND_MANY: at most "
            f"{limits.append_many_entries_max}", argument=field)
    return value


def _confirm(raw: object, field: str) -> Confirm:
    """One confirm (or hint), ``[stream_id, range_index, epoch, confirm]`` of integers
    (their bounds are the range server's, per entry)."""
    if (not isinstance(raw, list) or len(raw) != 4
            or any(type(n) is not int for n in raw)):
        raise InvalidArgument(
            f"a confirm must be [stream_id, range_index, epoch, confirm], not {raw!r}"[:200],
            argument=field)
    return raw[0], raw[1], raw[2], raw[3]


def encode_answer(
    results: Sequence[Result], confirmed: Sequence[EstreamError | None] = (),
    hinted: Sequence[EstreamError | None] = (),
) -> dict[str, Any]:
    """The answer header of an APPEND_MANY: one result per batch, one per confirm and one
    per hint, in request order."""
    body: dict[str, Any] = {RESULTS_FIELD: [r if isinstance(r, int) else {"error": r.to_wire()}
                                            for r in results]}
    if confirmed:
        body[CONFIRMED_FIELD] = [None if c is None else {"error": c.to_wire()}
                                 for c in confirmed]
    if hinted:
        body[HINTED_FIELD] = [None if c is None else {"error": c.to_wire()} for c in hinted]
    return body


def decode_answer(
    body: dict[str, Any], entries: int, confirms: int = 0, hints: int = 0
) -> tuple[list[Result], list[EstreamError | None]]:
    """The results of an answer to ``entries`` batches, ``confirms`` confirms and
    ``hints`` hints: the batches', then the confirms' followed by the hints'.
    :class:`MalformedFrame` when it does not hold one per entry (each entry then fails
    with it). A result that is not one is :class:`MalformedFrame` for that entry alone. An
    answer without ``hinted`` (a server older than hints ignores them) answers each hint
    with None: a hint is best effort, the writer's durable CONFIRM follows.

    >>> decode_answer({"results": [4], "hinted": [None]}, 1, 0, 1)
    ([4], [None])
    """
    results = body.get(RESULTS_FIELD)
    confirmed = body.get(CONFIRMED_FIELD, []) if confirms else []
    hinted = body.get(HINTED_FIELD, [None] * hints) if hints else []
    if (not isinstance(results, list) or len(results) != entries
            or not isinstance(confirmed, list) or len(confirmed) != confirms
            or not isinstance(hinted, list) or len(hinted) != hints):
        raise MalformedFrame(f"an APPEND_MANY answer to {entries} batches, {confirms} "
                             f"confirms and {hints} hints is {str(body)[:100]}")
    return [_result(r) for r in results], [_confirmed(c) for c in (*confirmed, *hinted)]


def _result(raw: object) -> Result:
    if type(raw) is int:
        return raw
    if isinstance(raw, dict) and "error" in raw:
        return from_wire(raw["error"])
    return MalformedFrame(f"an APPEND_MANY result is {str(raw)[:100]}, not an end or an error")


def _confirmed(raw: object) -> EstreamError | None:
    if raw is None:
        return None
    if isinstance(raw, dict) and "error" in raw:
        return from_wire(raw["error"])
    return MalformedFrame(f"an APPEND_MANY confirm result is {str(raw)[:100]}")


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
    "CONFIRMED_FIELD",
    "CONFIRMS_FIELD",
    "Confirm",
    "HINTED_FIELD",
    "HINTS_FIELD",
    "RESULTS_FIELD",
    "SIZES_FIELD",
    "Result",
    "decode_answer",
    "decode_request",
    "encode_answer",
    "encode_request",
    "group_entries",
]
