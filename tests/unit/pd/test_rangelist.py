"""pd/rangelist.py against the tuple it stands for: the same ranges after any seals,
replacements and trims, equal to that tuple, and each change sharing all but one chunk."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

from estream.wire.meta import RangeMeta, StreamMeta
from pd.rangelist import RangeList, chunk_ranges_max


def r(index: int, end: int | None = None, tag: str = "") -> RangeMeta:
    return RangeMeta(index, index, end, (), object_key=tag or None)


def check_same(got: RangeList, want: tuple[RangeMeta, ...]) -> None:
    assert len(got) == len(want) and tuple(got) == want and got == want and want == got
    assert list(reversed(got)) == list(reversed(want)) and hash(got) == hash(want)
    for i in (0, len(want) // 2, len(want) - 1, -1, -len(want)) if want else ():
        assert got[i] == want[i]
    for lo, hi in ((0, 3), (len(want) // 3, len(want)), (5, 2), (-4, None)):
        assert got[lo:hi] == want[lo:hi]


@pytest.mark.parametrize("seed", range(8))
def test_a_rangelist_is_the_tuple_after_any_changes(seed: int) -> None:
    rng = random.Random(seed)
    want = tuple(r(i, i + 1) for i in range(rng.randrange(1, 3 * chunk_ranges_max)))
    got = RangeList(want)
    check_same(got, want)
    for step in range(300):
        kind = rng.choice(("seal", "seal", "replace", "trim"))
        if kind == "seal":
            n = want[-1].index
            items = (r(n, n + 1, "s"), r(n + 1))
            want, got = want[:-1] + items, got.with_last(*items)
        elif kind == "replace":
            at = rng.randrange(len(want))
            item = r(want[at].index, want[at].end, f"k{step}")
            want, got = want[:at] + (item,) + want[at + 1:], got.replace_at(at, item)
        else:
            cut = rng.randrange(min(len(want), rng.choice((3, chunk_ranges_max + 7))))
            want, got = want[cut:], got.drop_front(cut)
        check_same(got, want)


def test_a_change_shares_every_chunk_but_one() -> None:
    base = RangeList(r(i, i + 1) for i in range(10 * chunk_ranges_max + 5))
    for changed in (base.replace_at(3 * chunk_ranges_max + 1, r(0)),
                    base.with_last(r(0, 1), r(1)), base.drop_front(chunk_ranges_max + 2)):
        shared = {id(c) for c in base._chunks} & {id(c) for c in changed._chunks}
        assert len(shared) >= len(base._chunks) - 2  # (the old list stays whole)
    assert base == tuple(r(i, i + 1) for i in range(10 * chunk_ranges_max + 5))


def test_a_stream_with_a_rangelist_equals_one_with_the_tuple() -> None:
    ranges = tuple(r(i, i + 1) for i in range(600))
    a, b = StreamMeta(1, "s", ranges=RangeList(ranges)), StreamMeta(1, "s", ranges=ranges)
    assert a == b and hash(a) == hash(b) and a.to_dict() == b.to_dict()
    assert a.range_for(300) == ranges[300] and a.range_at(599) == ranges[599]
    assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a
    assert RangeList(ranges) != ranges[:-1] and RangeList(ranges) != list(ranges)
    with pytest.raises(IndexError):
        RangeList(ranges)[600]
