"""The persistent map behind catalog views: a dict's answers, snapshots that never change."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pd.pmap import PMap, _Branch, _Leaf, node_entries_max

KEYS = st.text(alphabet="abcdefgh", min_size=0, max_size=4)
OPS = st.lists(st.tuples(st.booleans(), KEYS, st.integers()), max_size=400)


def check(m: PMap[int], ref: dict[str, int]) -> None:
    assert len(m) == len(ref)
    assert list(m) == sorted(ref)
    assert list(m.items()) == sorted(ref.items())
    assert list(m.values()) == [ref[k] for k in sorted(ref)]
    assert m == ref
    for k, v in ref.items():
        assert k in m and m[k] == v and m.get(k) == v
    assert "zzzzz" not in m and m.get("zzzzz", -1) == -1 and 3 not in m

    def depth(node: _Leaf | _Branch) -> int:
        if isinstance(node, _Leaf):
            assert len(node.keys) <= node_entries_max and node.keys == sorted(node.keys)
            return 1
        assert 1 <= len(node.kids) <= node_entries_max and len(node.seps) == len(node.kids) - 1
        depths = {depth(k) for k in node.kids}
        assert len(depths) == 1  # balanced
        return depths.pop() + 1

    depth(m._root)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, st.integers(), max_size=300), OPS)
def test_behaves_as_a_dict_and_snapshots_never_change(
    start: dict[str, int], ops: list[tuple[bool, str, int]]
) -> None:
    m, ref = PMap(start), dict(start)
    check(m, ref)
    snapshots = [(m, dict(ref))]
    for put, key, value in ops:
        if put:
            m, ref[key] = m.set(key, value), value
        else:
            m = m.delete(key)
            ref.pop(key, None)
        snapshots.append((m, dict(ref)))
    check(m, ref)
    for snap, expected in snapshots[::17]:
        check(snap, expected)


def test_large_maps_stay_shallow_and_share_their_nodes() -> None:
    m = PMap({f"s{i:06}": i for i in range(20_000)})
    before = m
    m2 = m.set("s010000x", 1).set("s000005", -5).delete("s019999")
    assert before["s000005"] == 5 and "s010000x" not in before and len(before) == 20_000
    assert len(m2) == 20_000 and m2["s000005"] == -5
    assert isinstance(m2._root, _Branch) and isinstance(before._root, _Branch)
    shared = sum(a is b for a, b in zip(m2._root.kids, before._root.kids, strict=False))
    assert shared >= len(before._root.kids) - 3  # only the changed paths were copied
    for i in range(20_000):
        m2 = m2.delete(f"s{i:06}")
    assert list(m2) == ["s010000x"] and isinstance(m2._root, _Leaf)
