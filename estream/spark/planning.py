"""Offset and partition planning for the Spark source: what to read in each micro-batch.

Spark compares a source's offsets as JSON text, so an offset here is a dict ``{stream
name: next offset}`` with sorted keys (:func:`offsets_dict`). Given each stream's start
and confirmed end (asked by ``estream/spark/source.py``), this module decides where a new
query starts (``startingOffsets``: ``-2`` earliest, ``-1`` latest, as in Spark's Kafka
source), how far a micro-batch goes under ``maxRecordsPerTrigger`` (shared fairly:
:func:`split_budget`), what a trimmed start means (``failOnDataLoss``), and how each
stream's span is cut into partitions: at range boundaries and a size limit, rotating the
preferred replica (none once a range is read from its object).

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from estream.wire.errors import InvalidArgument, OffsetOutOfRange
from estream.wire.meta import StreamMeta

EARLIEST: Final = -2
LATEST: Final = -1
PARTITION_RECORDS_DEFAULT: Final = 250_000
MIN_PARTITIONS_DEFAULT: Final = 2

Offsets = dict[str, int]


def offsets_dict(offsets: Mapping[str, int]) -> Offsets:
    """The offsets with keys in sorted order, so that ``json.dumps`` is canonical.

    >>> json.dumps(offsets_dict({"payments": 3, "orders": 7}))
    '{"orders": 7, "payments": 3}'
    """
    return {name: int(offsets[name]) for name in sorted(offsets)}


def parse_streams(value: str | None) -> tuple[str, ...]:
    """The ``streams`` option (comma-separated names) as sorted, distinct names."""
    names = sorted({part.strip() for part in (value or "").split(",") if part.strip()})
    if not names:
        raise InvalidArgument("option 'streams' must name at least one stream", argument="streams")
    return tuple(names)


def parse_offsets_spec(value: str | None, streams: Sequence[str], option: str) -> Offsets:
    """``startingOffsets``/``endingOffsets`` as a per-stream spec (``EARLIEST``, ``LATEST``
    or an explicit offset). Streams a JSON spec leaves out default to the option's default:
    earliest for starting offsets, latest for ending offsets."""
    default = EARLIEST if option == "startingOffsets" else LATEST
    text = (value or "").strip()
    if text == "" or text.lower() in ("earliest", "latest"):
        kind = default if text == "" else (EARLIEST if text.lower() == "earliest" else LATEST)
        return {name: kind for name in sorted(streams)}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise InvalidArgument(
            f"option {option!r} must be 'earliest', 'latest' or a JSON object "
            f'{{"stream": offset}}, not {text!r}',
            argument=option,
        )
    unknown = sorted(set(parsed) - set(streams))
    if unknown:
        raise InvalidArgument(
            f"option {option!r} names streams not in 'streams': {unknown}", argument=option
        )
    spec: Offsets = {}
    for name in sorted(streams):
        offset = parsed.get(name, default)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
            raise InvalidArgument(
                f"option {option!r}: offset of {name!r} must be an integer >= -2, not {offset!r}",
                argument=option,
            )
        spec[name] = offset
    return spec


@dataclass(frozen=True, slots=True)
class StreamBounds:
    """What the cluster says about one stream right now: its first readable offset (moves
    with trim) and its confirmed end (records at or past it are not readable yet)."""

    start: int
    end: int
    id: int = 0  # the stream's id (which incarnation of the name); 0: unknown


# A query's offsets (Spark's offsets log) name each stream's id beside its offset, as
# "<name>@id" (a stream name never holds "@"): a name deleted and created again between two
# batches, or while the query was stopped, is another stream, not the same one read on
# from the old offset (which skipped the new stream's first records in silence).
ID_SUFFIX: Final = "@id"


def with_ids(offsets: Mapping[str, int], bounds: Mapping[str, StreamBounds]) -> Offsets:
    """``offsets`` with each stream's id beside it, keys sorted (canonical JSON).

    >>> with_ids({"b": 3, "a": 7}, {"a": StreamBounds(0, 9, 4), "b": StreamBounds(0, 9)})
    {'a': 7, 'a@id': 4, 'b': 3}
    """
    merged = dict(offsets) | {name + ID_SUFFIX: bounds[name].id for name in offsets
                              if name in bounds and bounds[name].id}
    return offsets_dict(merged)


def without_ids(offsets: Mapping[str, int]) -> Offsets:
    """The streams' offsets of a query's offsets (:func:`with_ids`'s ids left out)."""
    return {name: int(o) for name, o in offsets.items() if not name.endswith(ID_SUFFIX)}


def resolve_spec(spec: Mapping[str, int], bounds: Mapping[str, StreamBounds]) -> Offsets:
    """Turn ``EARLIEST``/``LATEST`` into concrete offsets."""
    resolved: Offsets = {}
    for name, offset in spec.items():
        if offset == EARLIEST:
            resolved[name] = bounds[name].start
        elif offset == LATEST:
            resolved[name] = bounds[name].end
        else:
            resolved[name] = offset
    return offsets_dict(resolved)


def check_start(name: str, offset: int, bounds: StreamBounds, fail_on_data_loss: bool,
                stream_id: int = 0) -> int:
    """The offset to read ``name`` from, given that Spark asks to continue at ``offset``
    of the stream with id ``stream_id`` (0: unknown, an older checkpoint's).

    A stream deleted and created again under the name since (another id) is new to the
    query: with ``fail_on_data_loss`` that raises (what the old one held past ``offset``
    is gone), else the new one is read from its start.

    Below the stream's start (trimmed away), or past its confirmed end (the stream was
    deleted and created again?), records are lost: with ``fail_on_data_loss`` that raises
    :class:`OffsetOutOfRange` naming the stream and offsets; without it the reader skips
    to the nearest readable offset.
    """
    if stream_id and bounds.id and stream_id != bounds.id:
        what = (f"stream {name!r} was deleted and created again (its id was {stream_id}, "
                f"is {bounds.id}): the old stream's records from offset {offset} on are "
                "gone, and the new one is read from its start")
        if not fail_on_data_loss:
            return bounds.start
        raise OffsetOutOfRange(what + ". Set option failOnDataLoss=false to go on so.",
                               offset=offset, start=bounds.start, end=bounds.end)
    if bounds.start <= offset <= bounds.end:
        return offset
    if offset < bounds.start:
        what = (
            f"stream {name!r}: offset {offset} was trimmed away; the stream now starts at "
            f"{bounds.start}, so records [{offset}, {bounds.start}) are lost"
        )
        skip_to = bounds.start
    else:
        what = (
            f"stream {name!r}: offset {offset} is past the stream's confirmed end "
            f"{bounds.end} (was the stream deleted and created again?)"
        )
        skip_to = bounds.end
    if fail_on_data_loss:
        raise OffsetOutOfRange(
            what + ". Set option failOnDataLoss=false to skip ahead instead.",
            offset=offset,
            start=bounds.start,
            end=bounds.end,
        )
    return skip_to


def split_budget(available: Mapping[str, int], budget: int) -> Offsets:
    """Share ``budget`` records between streams with ``available`` records each.

    Water-filling: every stream gets an equal share, and what a stream cannot use goes to
    the others; a remainder smaller than the number of streams goes one record each in name
    order. The grants never exceed what is available nor, in total, the budget, and they
    sum to ``min(budget, total available)``, so every trigger makes progress.

    >>> split_budget({"a": 100, "b": 3, "c": 100}, 50)
    {'a': 24, 'b': 3, 'c': 23}
    """
    if budget < 0:
        raise InvalidArgument(f"read budget must be >= 0, not {budget}", argument="budget")
    grant = {name: 0 for name in sorted(available)}
    need = {name: max(0, int(available[name])) for name in sorted(available)}
    left = budget
    pending = [name for name in grant if need[name] > 0]
    while pending and left > 0:
        share = max(1, left // len(pending))
        still: list[str] = []
        for name in pending:
            take = min(need[name], share, left)
            grant[name] += take
            need[name] -= take
            left -= take
            if need[name] > 0:
                still.append(name)
        pending = still
    return grant


def limit_end(start: Mapping[str, int], latest: Mapping[str, int], max_rows: int | None) -> Offsets:
    """The end offsets of the next micro-batch: ``latest``, or under ``max_rows`` as far as
    the budget allows (never behind ``start``)."""
    available = {name: max(0, latest[name] - start[name]) for name in latest}
    if max_rows is None:
        return offsets_dict({name: start[name] + available[name] for name in latest})
    grant = split_budget(available, max_rows)
    return offsets_dict({name: start[name] + grant[name] for name in latest})


def cap_offsets(latest: Mapping[str, int], target: Mapping[str, int] | None) -> Offsets:
    """``latest`` capped at ``target`` (the ``Trigger.AvailableNow`` target fixed when the
    query started); streams without a target are not capped."""
    if target is None:
        return offsets_dict(latest)
    return offsets_dict(
        {name: min(value, target.get(name, value)) for name, value in latest.items()}
    )


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One Spark task's work: records ``[start, end)`` of ``stream``, read preferably from
    range server ``replica`` (None when the range has no replica listed); ``stream_id``:
    the incarnation planned (a name deleted and made again meanwhile is not read)."""

    stream: str
    start: int
    end: int
    replica: str | None
    stream_id: int = 0

    @property
    def count(self) -> int:
        return self.end - self.start


def plan_partitions(
    meta: StreamMeta, start: int, end: int, records_max: int = PARTITION_RECORDS_DEFAULT
) -> list[PartitionSpec]:
    """Cut ``[start, end)`` of one stream into partitions at range boundaries and at
    ``records_max`` records each, rotating the preferred replica over each range's
    replicas so that parallel tasks on one range spread over its servers.

    Offsets no range covers (below the first range, or past a gap in the catalog) are
    planned without a preferred replica: the reader then finds the range itself.
    """
    if records_max < 1:
        raise InvalidArgument(
            f"records per partition must be >= 1, not {records_max}", argument="partitionRecords"
        )
    specs: list[PartitionSpec] = []
    offset = start
    while offset < end:
        rng = meta.range_for(offset)
        replicas: tuple[str, ...] = ()
        if rng is None:
            piece_end, turn = end, 0
            nxt = [r.start for r in meta.ranges if r.start > offset]
            if nxt:
                piece_end = min(end, nxt[0])
        else:
            piece_end = end if rng.end is None else min(end, rng.end)
            replicas = tuple(r.id for r in rng.replicas)
            turn = rng.index
        specs.extend(_cut(meta, offset, piece_end, records_max, replicas, turn))
        offset = piece_end
    return specs


def _cut(
    meta: StreamMeta, start: int, end: int, records_max: int, replicas: Sequence[str],
    turn: int,
) -> list[PartitionSpec]:
    """``[start, end)`` in pieces of at most ``records_max``; piece ``k`` prefers replica
    ``(turn + k) mod n`` (``turn`` shifts the rotation from range to range)."""
    pieces: list[PartitionSpec] = []
    for k, lo in enumerate(range(start, end, records_max)):
        replica = replicas[(turn + k) % len(replicas)] if replicas else None
        pieces.append(PartitionSpec(meta.name, lo, min(end, lo + records_max), replica,
                                    meta.id))
    return pieces


def partition_size(total: int, records_max: int, partitions_min: int) -> int:
    """Records per partition for a micro-batch of ``total`` records: at most
    ``records_max``, and small enough for at least ``partitions_min`` partitions (so a
    small batch still keeps that many tasks busy), never below one record.

    >>> partition_size(1_000_000, 250_000, 2), partition_size(200_000, 250_000, 2)
    (250000, 100000)
    >>> partition_size(3, 250_000, 2), partition_size(0, 250_000, 2)
    (2, 1)
    """
    return max(1, min(records_max, -(-total // max(1, partitions_min))))


def plan_batch(
    metas: Mapping[str, StreamMeta],
    start: Mapping[str, int],
    end: Mapping[str, int],
    records_max: int = PARTITION_RECORDS_DEFAULT,
    partitions_min: int = 1,
) -> list[PartitionSpec]:
    """Partitions of a whole micro-batch, streams in name order, each of at most
    :func:`partition_size` records."""
    spans = {name: (start[name], end[name]) for name in sorted(end) if end[name] > start[name]}
    total = sum(hi - lo for lo, hi in spans.values())
    size = partition_size(total, records_max, partitions_min)
    specs: list[PartitionSpec] = []
    for name, (lo, hi) in spans.items():
        specs.extend(plan_partitions(metas[name], lo, hi, size))
    return specs


# ------------------------------------------------ minOffsetsPerTrigger / maxTriggerDelay

MAX_TRIGGER_DELAY_MS_DEFAULT: Final = 15 * 60 * 1000  # Kafka source's default, 15m

_DURATION_UNITS_MS: Final = {
    "us": 0.001, "ms": 1, "s": 1_000, "m": 60_000, "min": 60_000, "h": 3_600_000,
    "d": 86_400_000,
}


def parse_duration_ms(text: str, option: str) -> int:
    """A Spark duration string (``"30s"``, ``"5m"``, ``"1h"``, ``"250ms"``; a bare number
    is milliseconds, as in Spark's ``timeStringAsMs``) in milliseconds.

    >>> parse_duration_ms("5m", "maxTriggerDelay"), parse_duration_ms("250", "x")
    (300000, 250)
    """
    raw = text.strip().lower()
    digits = raw.rstrip("abcdefghijklmnopqrstuvwxyz").strip()
    unit = raw[len(digits):].strip() or "ms"
    if not digits.isdigit() or unit not in _DURATION_UNITS_MS:
        raise InvalidArgument(
            f"option {option!r} must be a duration such as '30s', '5m' or '1h' (units: "
            f"{', '.join(_DURATION_UNITS_MS)}), not {text!r}", argument=option)
    return int(int(digits) * _DURATION_UNITS_MS[unit])


@dataclass(frozen=True, slots=True)
class Admission:
    """The next micro-batch's end offsets, and the time (ms) the source now counts
    ``maxTriggerDelay`` from (None: no batch let through yet in this driver)."""

    end: Offsets
    last_batch_ms: int | None


def admit(
    start: Mapping[str, int],
    latest: Mapping[str, int],
    *,
    min_rows: int | None,
    max_rows: int | None,
    delay_ms: int,
    now_ms: int,
    last_batch_ms: int | None,
) -> Admission:
    """Kafka's ``minOffsetsPerTrigger`` with ``maxTriggerDelay``, then ``max_rows``.

    With fewer than ``min_rows`` new records over all streams, the batch is held back
    (its end is ``start``, which Spark takes as "no new data") until ``delay_ms`` has
    passed since the last batch let through; the first trigger of a driver starts that
    clock (as Kafka's source does), so a fresh or restarted query waits at most one
    delay. A batch let through (enough records, or the delay passed) then goes as far as
    :func:`limit_end` allows under ``max_rows`` and restarts the clock.

    >>> admit({"a": 0}, {"a": 3}, min_rows=5, max_rows=None, delay_ms=10, now_ms=100,
    ...       last_batch_ms=95).end
    {'a': 0}
    """
    available = sum(max(0, latest[name] - start.get(name, latest[name])) for name in latest)
    if min_rows is not None and available < min_rows:
        since = now_ms if last_batch_ms is None else last_batch_ms
        if now_ms - since < delay_ms:
            begin = {name: min(start.get(name, latest[name]), latest[name]) for name in latest}
            return Admission(offsets_dict(begin), since)
    return Admission(limit_end(start, latest, max_rows), now_ms)


# ---------------------------------------------------------------------- streamPattern


def match_streams(pattern: str, names: Sequence[str]) -> tuple[str, ...]:
    """The names ``pattern`` matches as a whole (Python ``re.fullmatch``, as Kafka's
    ``subscribePattern`` matches whole topic names), sorted."""
    compiled = re.compile(pattern)
    return tuple(sorted({name for name in names if compiled.fullmatch(name)}))


def check_pattern(pattern: str, option: str = "streamPattern") -> str:
    """``pattern`` if it is a valid regular expression, else :class:`InvalidArgument`."""
    if not pattern.strip():
        raise InvalidArgument(f"option {option!r} must be a non-empty regular expression",
                              argument=option)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise InvalidArgument(f"option {option!r} is not a valid regular expression "
                              f"({exc}): {pattern!r}", argument=option) from None
    return pattern


def spec_for(spec: Mapping[str, int], streams: Sequence[str]) -> Offsets:
    """The starting spec over ``streams``: a stream the spec has no entry for (created
    after a ``streamPattern`` query started) starts at ``EARLIEST``, as Kafka's source
    starts new partitions."""
    return {name: int(spec.get(name, EARLIEST)) for name in sorted(streams)}
