"""Property test of the catalog: any command sequence keeps every invariant.

Random sequences over a few names and servers (valid and invalid mixed): after every
step, ranges are contiguous from the start, only the last is open, a sealed range never
changes, epochs and start offsets never shrink, ids are unique, a rejected command left
the catalog as it was, and two catalogs fed the same commands stay identical (determinism)
and survive a snapshot round trip.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from estream.wire.errors import EstreamError
from estream.wire.meta import StreamMeta
from pd.catalog import Catalog
from pd.commands import (
    Command,
    CreateStream,
    DeleteStream,
    OpenWriter,
    RegisterServer,
    SealRange,
    TrimStream,
    UpdateReplicas,
)

NAMES = st.sampled_from(["a", "b", ".x"])
SERVERS = st.sampled_from(["s1", "s2", "s3", "s4", "zz"])
VALID = st.sampled_from([("s1",), ("s2", "s3"), ("s3", "s1", "s2"), ("s2",), ("s1", "s2", "s3")])
PLACEMENT = st.one_of(VALID, VALID, VALID, st.lists(SERVERS, max_size=4).map(tuple))
SMALL = st.integers(min_value=-2, max_value=40)



@st.composite
def creates(draw: st.DrawFn) -> CreateStream:
    placement = draw(PLACEMENT)
    replicas = draw(st.one_of(st.just(len(placement)), st.integers(0, 4)))
    ack_count = draw(st.one_of(st.integers(1, max(1, replicas)), st.integers(0, 4)))
    return CreateStream(draw(NAMES), replicas, ack_count, draw(st.sampled_from(["", ".sys"])),
                        (), placement, draw(st.sampled_from(["", "r1", "r2"])),
                        draw(st.booleans()))


COMMANDS: st.SearchStrategy[Command] = st.one_of(
    st.builds(RegisterServer, SERVERS, st.just("127.0.0.1:1"), st.sampled_from(["ssd", "x"])),
    creates(),
    creates(),
    st.builds(DeleteStream, NAMES),
    st.builds(OpenWriter, NAMES),
    st.builds(SealRange, NAMES, st.integers(0, 2), st.integers(0, 3), SMALL, PLACEMENT),
    st.builds(SealRange, NAMES, st.integers(0, 1), st.integers(0, 1), st.integers(0, 40),
              VALID),
    st.builds(SealRange, NAMES, st.integers(0, 1), st.integers(0, 1), st.integers(0, 40),
              VALID),
    st.builds(TrimStream, NAMES, SMALL),
    st.builds(UpdateReplicas, NAMES, st.integers(0, 2), PLACEMENT),
)


def check_stream(s: StreamMeta) -> None:
    assert s.ranges, "a stream always has its open range"
    assert all(r.sealed for r in s.ranges[:-1]) and not s.ranges[-1].sealed
    for prev, nxt in zip(s.ranges, s.ranges[1:], strict=False):
        assert nxt.index == prev.index + 1 and nxt.start == prev.end
    for r in s.ranges:
        assert len({x.id for x in r.replicas}) == len(r.replicas) >= 1
        assert r.end is None or r.end >= r.start
    assert 1 <= s.ack_count <= s.replicas
    assert not s.type.startswith(".") or s.type == ".sys"


@settings(max_examples=300, deadline=None)
@given(st.lists(COMMANDS, min_size=1, max_size=40))
def test_invariants_hold_for_any_sequence(commands: list[Command]) -> None:
    catalog, twin = Catalog(), Catalog()
    for sid in ("s1", "s2", "s3"):
        catalog.apply(RegisterServer(sid, "127.0.0.1:2", "ssd"))
        twin.apply(RegisterServer(sid, "127.0.0.1:2", "ssd"))
    for command in commands:
        before = catalog.snapshot()
        old = dict(catalog.view().streams)
        try:
            catalog.apply(command)
        except EstreamError:
            assert catalog.snapshot() == before
        try:
            twin.apply(command)
        except EstreamError:
            pass
        assert twin.snapshot() == catalog.snapshot()
        streams = catalog.view().streams
        assert len({s.id for s in streams.values()}) == len(streams)
        for name, s in streams.items():
            check_stream(s)
            prev = old.get(name)
            if prev is not None and prev.id == s.id:
                assert s.epoch >= prev.epoch and s.start_offset >= prev.start_offset
                for r in prev.ranges:
                    if r.sealed:
                        same = [x for x in s.ranges if x.index == r.index]
                        if same:  # kept (not trimmed away): its bounds never change
                            assert (same[0].start, same[0].end) == (r.start, r.end)
    restored = Catalog.restore(catalog.snapshot())
    assert restored.snapshot() == catalog.snapshot()
    view, again = catalog.view(), restored.view()  # what restore derives, as apply kept it
    assert again.open_ranges_by_server() == view.open_ranges_by_server()
    assert again.range_count() == view.range_count() == sum(
        len(s.ranges) for s in view.streams.values())
    assert dict(again.object_refs) == dict(view.object_refs)
