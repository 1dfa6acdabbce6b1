"""PD_SEAL_RANGE's short answer: the ranges from the sealed one on, the earlier ones taken
from the stream the client holds (pd/shell/service.py stream_tail, estream/net/pdclient.py
with_earlier_ranges)."""

from __future__ import annotations

from dataclasses import replace

from estream.net.pdclient import with_earlier_ranges
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.paging import stream_tail

REPLICAS = (ReplicaRef("rs1", "127.0.0.1:7001"), ReplicaRef("rs2", "127.0.0.1:7002"))


def _stream(first: int, count: int, stream_id: int = 7) -> StreamMeta:
    ranges = tuple(RangeMeta(i, i * 10, None if i == first + count - 1 else i * 10 + 10,
                             REPLICAS) for i in range(first, first + count))
    return StreamMeta(id=stream_id, name="s", replicas=2, ack_count=1, type="", hints=(),
                      epoch=1, start_offset=first * 10, ranges=ranges)


def test_the_answer_holds_the_ranges_from_the_sealed_one_and_merges_back_whole() -> None:
    now = _stream(0, 6)
    answer = stream_tail(now, 4)
    assert [r["index"] for r in answer["stream"]["ranges"]] == [4, 5]
    assert answer["omitted"] == 4 and answer["ranges_from"] == 4
    tail = StreamMeta.from_dict(answer["stream"])
    held = _stream(0, 5)  # the client's copy, before the seal
    assert with_earlier_ranges(tail, held, 4, answer["omitted"]) == now


def test_a_trimmed_stream_omits_only_what_is_left() -> None:
    now = _stream(3, 3)  # ranges 0..2 trimmed since the client's copy
    answer = stream_tail(now, 4)
    assert answer["omitted"] == 1
    merged = with_earlier_ranges(StreamMeta.from_dict(answer["stream"]), _stream(0, 5), 4, 1)
    assert merged == now


def test_another_stream_or_a_missing_range_needs_the_whole_stream() -> None:
    tail = StreamMeta.from_dict(stream_tail(_stream(0, 6), 4)["stream"])
    assert with_earlier_ranges(tail, _stream(0, 5, stream_id=8), 4, 4) is None
    gap = _stream(0, 5)
    gap = replace(gap, ranges=gap.ranges[:2] + gap.ranges[3:])
    assert with_earlier_ranges(tail, gap, 4, 4) is None
    assert with_earlier_ranges(tail, _stream(2, 3), 4, 4) is None  # the copy lacks 0 and 1
