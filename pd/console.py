"""The console's decisions: whether a drain can finish, PD's own samples for the charts,
and how the record browser asks and answers.

- :func:`drain_outlooks`: a drain moves every replica of a server to servers the range
  does not name yet, so a range of ``w`` replicas needs ``w`` *other* live, active servers
  (``w - 1`` keep their replica, one more takes the moved one). The largest ``w`` among
  the ranges on the server is what the drain needs; with fewer, it cannot finish, and the
  console says so up front ("cannot finish: needs N servers") instead of leaving a drain
  that never ends.
- :class:`SampleRing`: the last hour of a PD node's own figures (one sample every
  :data:`sample_interval_s`, at most :data:`samples_max` kept: bounded memory whatever the
  uptime), as ``GET /v1/samples`` serves them for the console's charts.
- :func:`records_query` and :func:`record_row`: ``GET /v1/streams/{name}/records``'s
  bounds (at most :data:`browse_records_max` records and :data:`records_bytes_max` bytes of
  values per answer) and each record's shape (value as base64, and as text when it is
  UTF-8).

Pure: no I/O.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from estream.wire.errors import InvalidArgument
from estream.wire.meta import StreamMeta

sample_interval_s: Final = 10.0  # one sample of PD's own figures this often
samples_max: Final = 360  # an hour of samples at the interval above
browse_records_max: Final = 100  # records per answer of the record browser
browse_records_default: Final = 20
records_bytes_max: Final = 1024 * 1024  # values per answer (at least one record is given)
timestamp_ms_max: Final = 2**63 - 1


# -- drain ---------------------------------------------------------------------------------


def drain_outlooks(
    server_ids: Iterable[str], streams: Iterable[StreamMeta], live: Collection[str],
    draining: Collection[str],
) -> dict[str, dict[str, Any]]:
    """Whether draining each of ``server_ids`` can finish (one pass over the catalog):
    ``needs_servers`` (the largest replica count among the ranges naming it, 0 for none),
    ``available_servers`` (other servers alive and not draining), ``can_finish`` and, when
    it cannot, ``reason``.

    >>> from estream.wire.meta import RangeMeta, ReplicaRef
    >>> refs = tuple(ReplicaRef(x, "h:" + x) for x in "abc")
    >>> s = StreamMeta(1, "s", ranges=(RangeMeta(0, 0, None, refs),))
    >>> drain_outlooks("a", [s], {"a", "b", "c", "d"}, ())["a"]["can_finish"]
    True
    >>> drain_outlooks("a", [s], {"a", "b", "c"}, ())["a"]["reason"]
    'cannot finish: needs 3 servers besides this one (alive, not draining), 2 available'
    >>> drain_outlooks("d", [s], {"a"}, ())["d"]["needs_servers"]
    0
    """
    widths: dict[str, int] = {}
    for stream in streams:
        for rng in stream.ranges:
            for ref in rng.replicas:
                widths[ref.id] = max(widths.get(ref.id, 0), len(rng.replicas))
    usable = {s for s in live if s not in draining}
    return {server: _outlook(widths.get(server, 0), len(usable - {server}))
            for server in server_ids}


def _outlook(needs: int, available: int) -> dict[str, Any]:
    can_finish = available >= needs
    return {
        "needs_servers": needs, "available_servers": available, "can_finish": can_finish,
        "reason": None if can_finish else (
            f"cannot finish: needs {needs} servers besides this one (alive, not draining), "
            f"{available} available"),
    }


# -- samples -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a PD node's figures at ``at_ms`` (ms since the epoch)."""

    at_ms: int
    figures: Mapping[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, **self.figures}


class SampleRing:
    """The last ``capacity`` samples, oldest first (the oldest dropped when full)."""

    def __init__(self, capacity: int = samples_max) -> None:
        if capacity < 1:
            raise ValueError("a sample ring holds at least one sample")
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def add(self, at_ms: int, figures: Mapping[str, float]) -> None:
        """Keep a sample; one older than the newest kept is ignored (a clock step back)."""
        if self._samples and at_ms < self._samples[-1].at_ms:
            return
        self._samples.append(Sample(at_ms, dict(figures)))

    def since(self, from_ms: int) -> list[Sample]:
        """The samples taken at or after ``from_ms``, oldest first."""
        return [s for s in self._samples if s.at_ms >= from_ms]

    def __len__(self) -> int:
        return len(self._samples)


def interval_mean_ms(before: tuple[float, int], after: tuple[float, int]) -> float | None:
    """The mean latency (ms) of what a histogram saw between two of its ``(sum_s, count)``
    readings; None when it saw nothing.

    >>> interval_mean_ms((1.0, 10), (1.5, 15))
    100.0
    >>> interval_mean_ms((1.0, 10), (1.0, 10)) is None
    True
    """
    count = after[1] - before[1]
    if count <= 0:
        return None
    return round((after[0] - before[0]) / count * 1000, 3)


# -- the record browser --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordsQuery:
    """Where a browse starts (``offset``, or the first record at or after
    ``timestamp_ms``) and how many records it answers at most."""

    offset: int | None
    timestamp_ms: int | None
    limit: int


def _query_int(params: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be an integer", argument=name) from None
    if not low <= value <= high:
        raise InvalidArgument(f"{name} must be between {low} and {high}", argument=name)
    return value


def records_query(params: Mapping[str, str]) -> RecordsQuery:
    """The browse a query string asks (``offset`` or ``timestamp``, ``limit``); unknown
    parameters and values out of range are :class:`InvalidArgument` naming the field.

    >>> records_query({"offset": "5", "limit": "10"})
    RecordsQuery(offset=5, timestamp_ms=None, limit=10)
    >>> records_query({}).limit == browse_records_default
    True
    """
    unknown = sorted(set(params) - {"offset", "timestamp", "limit"})
    if unknown:
        raise InvalidArgument(f"unknown parameter {unknown[0][:64]!r}: records takes offset, "
                              "timestamp and limit", argument=unknown[0][:64])
    offset = _query_int(params, "offset", 0, 2**63 - 1)
    timestamp = _query_int(params, "timestamp", 0, timestamp_ms_max)
    if offset is not None and timestamp is not None:
        raise InvalidArgument("give offset or timestamp, not both", argument="timestamp")
    limit = _query_int(params, "limit", 1, browse_records_max)
    return RecordsQuery(offset, timestamp,
                        browse_records_default if limit is None else limit)


def record_row(offset: int, timestamp_ms: int, headers: Mapping[str, str],
               value: bytes) -> dict[str, Any]:
    """A record as the browser answers it: ``value`` base64, ``text`` the value decoded
    as UTF-8 (None when it is not).

    >>> record_row(3, 7, {"k": "v"}, b"hi")
    {'offset': 3, 'timestamp': 7, 'headers': {'k': 'v'}, 'size': 2, 'value': 'aGk=', 'text': 'hi'}
    >>> record_row(0, 0, {}, b"\\xff")["text"] is None
    True
    """
    try:
        text: str | None = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"offset": offset, "timestamp": timestamp_ms, "headers": dict(headers),
            "size": len(value), "value": base64.b64encode(value).decode("ascii"),
            "text": text}


def within_budget(sizes: Iterable[int], limit: int, bytes_max: int = records_bytes_max) -> int:
    """How many of the records (their value sizes, in order) one answer holds: at most
    ``limit``, and no more than ``bytes_max`` bytes of values (always at least one).

    >>> within_budget([10, 10, 10], 2)
    2
    >>> within_budget([600, 600, 600], 100, bytes_max=1000)
    1
    """
    count = total = 0
    for size in sizes:
        if count >= limit or (count and total + size > bytes_max):
            break
        count += 1
        total += size
    return count
