"""The range server's answers, one frozen dataclass each (requests: :mod:`.rangemessages`).

``to_header`` is the map the server answers (the order and fields earlier versions
answered); ``from_header`` is the client's side, which raises :class:`MalformedFrame` for an
answer whose numbers are not integers. READ's batches travel as the frame's payload.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from estream.wire.errors import MalformedFrame
from estream.wire.fields import Header


def answer_int(body: Mapping[str, Any], key: str) -> int:
    """An answer's integer field, or :class:`MalformedFrame`."""
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise MalformedFrame(f"the answer's {key!r} is {value!r}, not an integer")
    return value


def _optional_int(body: Mapping[str, Any], key: str) -> int | None:
    return None if body.get(key) is None else answer_int(body, key)


def _optional_str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    return None if value is None else str(value)


@dataclass(frozen=True, slots=True)
class PingAnswer:
    """PING: who answers at the address, and its log's state."""

    server_id: str
    address: str
    wal_spares: int
    wal_io: str

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> PingAnswer:
        spares = body.get("wal_spares")
        return cls(str(body.get("server_id", "")), str(body.get("address", "")),
                   spares if isinstance(spares, int) else 0, str(body.get("wal_io", "")))

    def to_header(self) -> Header:
        return {"server_id": self.server_id, "address": self.address,
                "wal_spares": self.wal_spares, "wal_io": self.wal_io}


@dataclass(frozen=True, slots=True)
class Created:
    """CREATE_RANGE: the replica as it is now (it may have existed already); ``digest``:
    the digest name it holds batches to (None: none recorded, any accepted)."""

    start: int
    end: int
    epoch: int
    sealed: bool
    digest: str | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> Created:
        return cls(answer_int(body, "start"), answer_int(body, "end"),
                   answer_int(body, "epoch"), bool(body.get("sealed")),
                   _optional_str(body, "digest"))

    def to_header(self) -> Header:
        header: Header = {"start": self.start, "end": self.end, "epoch": self.epoch,
                          "sealed": self.sealed}
        if self.digest is not None:
            header["digest"] = self.digest
        return header


@dataclass(frozen=True, slots=True)
class SealAnswer:
    """SEAL: without an end (a fence), the durable end after a log barrier; with one, the
    sealed end. ``sealed``: the replica is sealed for good (at ``end``)."""

    end: int
    sealed: bool
    # A striped replica's (docs/ARCHITECTURE.md section 10, ``ChainEnd``): the index of its
    # durable chain's last batch (-1: none), and once sealed the range's batch count.
    last_batch: int | None = None
    batches: int | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> SealAnswer:
        return cls(answer_int(body, "end"), bool(body.get("sealed")),
                   _optional_int(body, "last_batch"), _optional_int(body, "batches"))

    def to_header(self) -> Header:
        header: Header = {"end": self.end, "sealed": self.sealed}
        if self.last_batch is not None:
            header["last_batch"] = self.last_batch
        if self.batches is not None:
            header["batches"] = self.batches
        return header


@dataclass(frozen=True, slots=True)
class ReadAnswer:
    """READ: whole batches from the one holding the offset asked (``payload``, possibly
    empty), the replica's readable ``end`` and whether it is ``sealed``."""

    end: int
    sealed: bool
    payload: bytes | memoryview
    # A striped replica's (docs/ARCHITECTURE.md section 10): the index of each batch
    # answered, and, for an offset in another server's batch, (index, base) of the batch
    # to ask for next. None: an unstriped replica's answer (not sent).
    batches: list[int] | None = None
    next: tuple[int, int] | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any], payload: bytes | memoryview) -> ReadAnswer:
        batches, after = body.get("batches"), body.get("next")
        if batches is not None and (not isinstance(batches, list)
                                    or not all(type(b) is int for b in batches)):
            raise MalformedFrame(f"the answer's 'batches' is {batches!r}"[:200])
        if after is not None and (not isinstance(after, list) or len(after) != 2
                                  or not all(type(v) is int for v in after)):
            raise MalformedFrame(f"the answer's 'next' is {after!r}"[:200])
        return cls(answer_int(body, "end"), bool(body.get("sealed")), payload, batches,
                   None if after is None else (after[0], after[1]))

    def to_header(self) -> Header:
        """The header (the batches are the frame's payload)."""
        header: Header = {"end": self.end, "sealed": self.sealed}
        if self.batches is not None:
            header["batches"] = self.batches
        if self.next is not None:
            header["next"] = list(self.next)
        return header


@dataclass(frozen=True, slots=True)
class RangeState:
    """DESCRIBE_RANGE: a replica's state. ``end`` is its durable contiguous end;
    ``sealed_end`` is None while it is open; ``digest`` the name of the digest recorded
    (None: none); ``seen_ms`` how long ago (the server's monotonic clock) it last took an
    APPEND or CONFIRM of ``epoch`` (None: none since the server started, or an older
    server): PD's lease recovery keeps a writer alive on its data path (``pd/lease.py``)."""

    start: int
    end: int
    confirm: int
    epoch: int
    sealed: bool
    sealed_end: int | None
    damaged: bool
    digest: str | None = None
    seen_ms: int | None = None
    # A striped replica's (docs/ARCHITECTURE.md section 10): (ensemble, replicas,
    # position), its durable chain's last batch index, once sealed the batch count.
    stripe: tuple[int, int, int] | None = None
    last_batch: int | None = None
    batches: int | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> RangeState:
        # Each field checked once, the common case (an exact int, or None where optional)
        # without a call: a PD leader decodes every replica of every server each reclaim
        # round (issue 27); anything else goes to answer_int (an int's subclass, or
        # MalformedFrame naming the field).
        get = body.get
        start, end, confirm, epoch = get("start"), get("end"), get("confirm"), get("epoch")
        sealed_end, seen_ms, last_batch = get("sealed_end"), get("seen_ms"), get("last_batch")
        batches, digest, ensemble = get("batches"), get("digest"), get("ensemble")
        return cls(
            start if type(start) is int else answer_int(body, "start"),  # noqa: E721
            end if type(end) is int else answer_int(body, "end"),  # noqa: E721
            confirm if type(confirm) is int else answer_int(body, "confirm"),  # noqa: E721
            epoch if type(epoch) is int else answer_int(body, "epoch"),  # noqa: E721
            bool(get("sealed")),
            sealed_end if sealed_end is None or type(sealed_end) is int  # noqa: E721
            else answer_int(body, "sealed_end"),
            bool(get("damaged")),
            None if digest is None else str(digest),
            seen_ms if seen_ms is None or type(seen_ms) is int  # noqa: E721
            else answer_int(body, "seen_ms"),
            None if ensemble is None else (answer_int(body, "ensemble"),
                                           answer_int(body, "replicas"),
                                           answer_int(body, "position")),
            last_batch if last_batch is None or type(last_batch) is int  # noqa: E721
            else answer_int(body, "last_batch"),
            batches if batches is None or type(batches) is int  # noqa: E721
            else answer_int(body, "batches"))

    def to_header(self) -> Header:
        """The wire form (as DESCRIBE_RANGE answers it; ``"digest"`` and ``"seen_ms"``
        only when known)."""
        header: Header = {"start": self.start, "end": self.end, "confirm": self.confirm,
                          "epoch": self.epoch, "sealed": self.sealed,
                          "sealed_end": self.sealed_end, "damaged": self.damaged}
        if self.digest is not None:
            header["digest"] = self.digest
        if self.seen_ms is not None:
            header["seen_ms"] = self.seen_ms
        if self.stripe is not None:
            header["ensemble"], header["replicas"], header["position"] = self.stripe
            header["last_batch"] = self.last_batch
            if self.batches is not None:
                header["batches"] = self.batches
        return header


@dataclass(frozen=True, slots=True)
class ListedRange:
    """One entry of LIST_RANGES: which replica, and its DESCRIBE_RANGE state."""

    stream_id: int
    range_index: int
    state: RangeState

    @classmethod
    def from_header(cls, item: object) -> ListedRange | None:
        """None for an entry that is not well formed (it is left alone, not an error)."""
        if not isinstance(item, Mapping):
            return None
        stream_id, range_index = item.get("stream_id"), item.get("range_index")
        try:
            if type(stream_id) is not int or type(range_index) is not int:  # noqa: E721
                stream_id = answer_int(item, "stream_id")  # (an int's subclass, or not one)
                range_index = answer_int(item, "range_index")
            return cls(stream_id, range_index, RangeState.from_header(item))
        except MalformedFrame:
            return None

    def to_header(self) -> Header:
        """The wire form (as LIST_RANGES answers it)."""
        return {"stream_id": self.stream_id, "range_index": self.range_index,
                **self.state.to_header()}


RangeKey = tuple[int, int]  # (stream_id, range_index)


@dataclass(frozen=True, slots=True)
class ReplicaListing:
    """A whole LIST_RANGES listing asked ``compact`` (:func:`listed_entries` of each
    page): ``keys``, every replica the server named, in its order; ``ranges``, the
    entries it listed whole (sealed or damaged replicas; every one, from a server that
    does not know ``compact``). An open sound replica is in ``keys`` only."""

    keys: tuple[RangeKey, ...]
    ranges: tuple[ListedRange, ...]


def listed_entries(items: list[Any], keys: list[RangeKey], ranges: list[ListedRange]) -> None:
    """Add a LIST_RANGES page's ``items`` to ``keys`` (every one) and ``ranges`` (those
    listed whole); an entry not well formed is left out of both.

    >>> keys, ranges = [], []
    >>> listed_entries([[4, 0], {"stream_id": 4, "range_index": 1, "start": 0, "end": 3,
    ...     "confirm": 3, "epoch": 1, "sealed": True, "sealed_end": 3}, [4, "x"], 7],
    ...     keys, ranges)
    >>> keys, [(r.range_index, r.state.sealed) for r in ranges]
    ([(4, 0), (4, 1)], [(1, True)])
    """
    for item in items:
        if type(item) is list:
            if len(item) == 2 and type(item[0]) is int and type(item[1]) is int:
                keys.append((item[0], item[1]))
            continue
        entry = ListedRange.from_header(item)
        if entry is not None:
            keys.append((entry.stream_id, entry.range_index))
            ranges.append(entry)


@dataclass(frozen=True, slots=True)
class TimeAnswer:
    """TIME_INDEX: a replica's time statistics (``rangeserver/timeindex.py``) and, when a
    timestamp was asked, where it is.

    ``min_timestamp``, ``max_timestamp``, ``bytes``: None when unknown (the replica's
    index is partial). ``max_timestamp`` is the running maximum of every batch held (an
    upper bound of what is readable); ``min_timestamp`` is the smallest *first-record*
    timestamp of its batches (a record inside a batch may be older: informational only).
    They cover every batch below ``end`` (the durable end, maybe past a sealed range's
    catalog end); ``sealed``: the replica is sealed. With a timestamp: ``offset``, the
    first offset at or after it (None: none below ``searched_end``), and
    ``searched_end``, the end searched up to (short of the asked end: the replica is
    short, ask another); both None without one."""

    min_timestamp: int | None
    max_timestamp: int | None
    bytes: int | None
    end: int
    sealed: bool
    offset: int | None = None
    searched_end: int | None = None

    @classmethod
    def from_header(cls, body: Mapping[str, Any]) -> TimeAnswer:
        return cls(_optional_int(body, "min_timestamp"), _optional_int(body, "max_timestamp"),
                   _optional_int(body, "bytes"), answer_int(body, "end"),
                   bool(body.get("sealed")), _optional_int(body, "offset"),
                   _optional_int(body, "searched_end"))

    def to_header(self) -> Header:
        """The wire form (``offset`` and ``searched_end`` once a timestamp was searched)."""
        header: Header = {"min_timestamp": self.min_timestamp,
                          "max_timestamp": self.max_timestamp, "bytes": self.bytes,
                          "end": self.end, "sealed": self.sealed}
        if self.searched_end is not None:
            header.update(offset=self.offset, searched_end=self.searched_end)
        return header

    @property
    def complete(self) -> bool:
        """The statistics are known (the index is not partial)."""
        return (self.min_timestamp is not None and self.max_timestamp is not None
                and self.bytes is not None)
