"""A persistent (immutable) sorted map from strings, for the catalog's snapshots.

:class:`PMap` is a B+-tree whose nodes are never changed once built: :meth:`PMap.set` and
:meth:`PMap.delete` return a new map that shares every node off the changed path with the
old one. A change thus costs O(log n) (a few short lists copied), and keeping the map as
it was, a snapshot, costs nothing: the catalog hands its readers the map itself instead
of a copy of every stream. Lookups are O(log n) (a bisect per level); iteration is in key
order, the same on every node whatever the history of changes (a deterministic order).

Pure: no I/O. Safe to share across threads (nothing is ever mutated after construction).
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from collections.abc import ItemsView as _ItemsView
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import ValuesView as _ValuesView
from itertools import chain
from typing import Any, Final, Generic, TypeVar, overload

V = TypeVar("V")
T = TypeVar("T")

node_entries_max: Final = 64  # entries of a leaf, children of a branch
node_entries_min: Final = node_entries_max // 4  # below this, a node merges with a neighbour


class _Leaf:
    __slots__ = ("keys", "values")

    def __init__(self, keys: list[str], values: list[Any]) -> None:
        self.keys = keys
        self.values = values


class _Branch:
    """``seps[i]`` is a lower bound of every key in ``kids[i + 1]`` and above every key in
    ``kids[i]`` (a key goes to ``kids[bisect_right(seps, key)]``)."""

    __slots__ = ("seps", "kids")

    def __init__(self, seps: list[str], kids: list[_Leaf | _Branch]) -> None:
        self.seps = seps
        self.kids = kids


_Node = _Leaf | _Branch
_EMPTY: Final = _Leaf([], [])


class _Absent(enum.Enum):
    """What :meth:`PMap.get` returns to ``__getitem__`` for a key not in the map."""

    ABSENT = 0


def _size(node: _Node) -> int:
    return len(node.keys) if type(node) is _Leaf else len(node.kids)  # type: ignore[union-attr]


def _split(node: _Node) -> list[Any]:
    """``[node]``, or ``[left, sep, right]`` when it holds more than ``node_entries_max``."""
    if type(node) is _Leaf:
        n = len(node.keys)
        if n <= node_entries_max:
            return [node]
        h = n // 2
        return [_Leaf(node.keys[:h], node.values[:h]), node.keys[h],
                _Leaf(node.keys[h:], node.values[h:])]
    assert type(node) is _Branch
    n = len(node.kids)
    if n <= node_entries_max:
        return [node]
    h = n // 2
    return [_Branch(node.seps[:h - 1], node.kids[:h]), node.seps[h - 1],
            _Branch(node.seps[h:], node.kids[h:])]


def _merge(left: _Node, sep: str, right: _Node) -> _Node:
    if type(left) is _Leaf:
        assert type(right) is _Leaf
        return _Leaf(left.keys + right.keys, left.values + right.values)
    assert type(left) is _Branch and type(right) is _Branch
    return _Branch(left.seps + [sep] + right.seps, left.kids + right.kids)


class PMap(Mapping[str, V], Generic[V]):
    """An immutable sorted map ``str -> V``; changes return a new map (see the module)."""

    __slots__ = ("_root", "_len")

    def __init__(self, items: Mapping[str, V] | Iterable[tuple[str, V]] = ()) -> None:
        pairs = sorted((items if isinstance(items, Mapping) else dict(items)).items())
        self._root: _Node = _build(pairs)
        self._len = len(pairs)

    @classmethod
    def _of(cls, root: _Node, size: int) -> PMap[V]:
        out: PMap[V] = cls.__new__(cls)
        out._root = root
        out._len = size
        return out

    # -- reading -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __getitem__(self, key: str) -> V:
        value = self.get(key, _Absent.ABSENT)
        if value is _Absent.ABSENT:
            raise KeyError(key)
        return value

    @overload
    def get(self, key: str, /) -> V | None: ...
    @overload
    def get(self, key: str, /, default: V | T) -> V | T: ...
    def get(self, key: str, default: Any = None) -> Any:
        node = self._root
        while type(node) is _Branch:
            node = node.kids[bisect_right(node.seps, key)]
        keys = node.keys  # type: ignore[union-attr]
        i = bisect_left(keys, key)
        if i < len(keys) and keys[i] == key:
            return node.values[i]  # type: ignore[union-attr]
        return default

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        node = self._root
        while type(node) is _Branch:
            node = node.kids[bisect_right(node.seps, key)]
        keys = node.keys  # type: ignore[union-attr]
        i = bisect_left(keys, key)
        return i < len(keys) and keys[i] == key

    def _leaves(self) -> Iterator[_Leaf]:
        return _leaves_under(self._root)

    def items_after(self, key: str) -> Iterator[tuple[str, V]]:
        """The entries whose keys sort after ``key``, in key order (a page of a listing
        that resumes after the last key it gave): O(log n) to the first, then in turn."""
        path, leaf = self._descend(key)
        at = bisect_right(leaf.keys, key)
        yield from zip(leaf.keys[at:], leaf.values[at:], strict=True)
        for branch, taken in reversed(path):
            for kid in branch.kids[taken + 1:]:
                for later in _leaves_under(kid):
                    yield from zip(later.keys, later.values, strict=True)

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(leaf.keys for leaf in self._leaves())

    def values(self) -> _Values[V]:
        return _Values(self)

    def items(self) -> _Items[V]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"PMap({dict(self.items())!r})"

    def changes(self, old: PMap[V]) -> list[tuple[str, V | None, V | None]]:
        """The keys whose value is not the same object in ``old`` as here, in key order,
        each with its value there and here (None: absent). The two trees are walked down
        together a level at a time, and a node both hold is not entered
        (:func:`_unshared_leaves`): a map made from ``old`` by k changes shares all but
        O(k log n) nodes with it, so this looks at the kids of O(k log n) nodes (about
        280 for two changes at 100,000 entries, not the 4,500 nodes of both trees), plus
        the entries of the leaves not shared: never a walk of every entry (what a round
        that keeps figures per entry needs to follow the catalog)."""
        if self._root is old._root:
            return []
        theirs, mine = _unshared_leaves(old._root, self._root)
        before: dict[str, Any] = {}
        for leaf in theirs:
            before.update(zip(leaf.keys, leaf.values, strict=True))
        out: list[tuple[str, Any, Any]] = []
        for leaf in mine:
            for key, value in zip(leaf.keys, leaf.values, strict=True):
                was = before.pop(key, _Absent.ABSENT)
                if was is not value:
                    out.append((key, None if was is _Absent.ABSENT else was, value))
        out.extend((key, was, None) for key, was in before.items())
        out.sort(key=lambda change: change[0])
        return out

    # -- changing (a new map) ------------------------------------------------------
    def _descend(self, key: str) -> tuple[list[tuple[_Branch, int]], _Leaf]:
        """The branches from the root to ``key``'s leaf (each with the kid taken), and the
        leaf."""
        path: list[tuple[_Branch, int]] = []
        node = self._root
        while type(node) is _Branch:
            i = bisect_right(node.seps, key)
            path.append((node, i))
            node = node.kids[i]
        assert type(node) is _Leaf
        return path, node

    def set(self, key: str, value: V) -> PMap[V]:
        """This map with ``key`` mapped to ``value``."""
        path, node = self._descend(key)
        keys = node.keys
        j = bisect_left(keys, key)
        if j < len(keys) and keys[j] == key:
            if node.values[j] is value:
                return self
            values = node.values.copy()
            values[j] = value
            return self._of(_replace_path(path, [_Leaf(keys, values)]), self._len)
        leaf = _Leaf(keys[:j] + [key] + keys[j:], node.values[:j] + [value] + node.values[j:])
        return self._of(_replace_path(path, _split(leaf)), self._len + 1)

    def delete(self, key: str) -> PMap[V]:
        """This map without ``key`` (itself when it has no ``key``)."""
        path, node = self._descend(key)
        keys = node.keys
        j = bisect_left(keys, key)
        if j >= len(keys) or keys[j] != key:
            return self
        new: _Node = _Leaf(keys[:j] + keys[j + 1:], node.values[:j] + node.values[j + 1:])
        for branch, i in reversed(path):
            kids, seps = branch.kids.copy(), branch.seps.copy()
            kids[i] = new
            if _size(new) < node_entries_min and len(kids) > 1:
                at = i if i + 1 < len(kids) else i - 1  # merge kids[at] and kids[at + 1]
                parts = _split(_merge(kids[at], seps[at], kids[at + 1]))
                kids[at:at + 2] = parts[::2]
                seps[at:at + 1] = parts[1:2]
            new = _Branch(seps, kids)
        while type(new) is _Branch and len(new.kids) == 1:
            new = new.kids[0]
        return self._of(new, self._len - 1)

    def update(self, items: Iterable[tuple[str, V]]) -> PMap[V]:
        out = self
        for key, value in items:
            out = out.set(key, value)
        return out


def _leaves_under(root: _Node) -> Iterator[_Leaf]:
    stack: list[_Node] = [root]
    while stack:
        node = stack.pop()
        if type(node) is _Leaf:
            yield node
        else:
            stack.extend(reversed(node.kids))  # type: ignore[union-attr]


def _height(node: _Node) -> int:
    """Levels of branches above the leaves (every leaf is as deep)."""
    height = 0
    while type(node) is _Branch:
        node = node.kids[0]
        height += 1
    return height


def _below(nodes: list[_Node]) -> list[_Node]:
    return [kid for node in nodes for kid in node.kids]  # type: ignore[union-attr]


def _unshared_leaves(old: _Node, new: _Node) -> tuple[list[_Leaf], list[_Leaf]]:
    """The leaves of each tree that the other does not hold. Both are walked down a
    level at a time, from the same height; a node found in both at a level is left out
    with everything under it (a node holds a range of keys: it is in a tree once, so a
    node both trees hold is in both walks at its height unless a node above it was left
    out already)."""
    olds, news = [old], [new]
    old_height, new_height = _height(old), _height(new)
    for _ in range(old_height - new_height):  # (a root split or merged since)
        olds = _below(olds)
    for _ in range(new_height - old_height):
        news = _below(news)
    height = min(old_height, new_height)
    while True:
        shared = {id(n) for n in olds} & {id(n) for n in news}
        if shared:
            olds = [n for n in olds if id(n) not in shared]
            news = [n for n in news if id(n) not in shared]
        if height == 0 or not (olds or news):
            return olds, news  # type: ignore[return-value]
        olds, news = _below(olds), _below(news)
        height -= 1


def _replace_path(path: list[tuple[_Branch, int]], parts: list[Any]) -> _Node:
    """The new root once the node at the end of ``path`` became ``parts`` (``[node]`` or
    ``[left, sep, right]``)."""
    for branch, i in reversed(path):
        if len(parts) == 1:
            kids = branch.kids.copy()
            kids[i] = parts[0]
            parts = [_Branch(branch.seps, kids)]
        else:
            kids = branch.kids[:i] + parts[::2] + branch.kids[i + 1:]
            seps = branch.seps[:i] + [parts[1]] + branch.seps[i:]
            parts = _split(_Branch(seps, kids))
    if len(parts) == 1:
        root: _Node = parts[0]
        return root
    return _Branch([parts[1]], [parts[0], parts[2]])


def _build(pairs: list[tuple[str, Any]]) -> _Node:
    """A tree of sorted, distinct ``pairs``, its nodes three quarters full."""
    if not pairs:
        return _EMPTY
    step = node_entries_max * 3 // 4
    nodes: list[_Node] = []
    lows: list[str] = []
    for at in range(0, len(pairs), step):
        chunk = pairs[at:at + step]
        nodes.append(_Leaf([k for k, _ in chunk], [v for _, v in chunk]))
        lows.append(chunk[0][0])
    while len(nodes) > 1:
        up: list[_Node] = []
        up_lows: list[str] = []
        for at in range(0, len(nodes), step):
            up.append(_Branch(lows[at + 1:at + step], nodes[at:at + step]))
            up_lows.append(lows[at])
        nodes, lows = up, up_lows
    return nodes[0]


class _Values(_ValuesView[V]):
    _mapping: PMap[V]

    def __iter__(self) -> Iterator[V]:
        return chain.from_iterable(leaf.values for leaf in self._mapping._leaves())


class _Items(_ItemsView[str, V]):
    _mapping: PMap[V]

    def __iter__(self) -> Iterator[tuple[str, V]]:
        return chain.from_iterable(zip(leaf.keys, leaf.values, strict=True)
                                   for leaf in self._mapping._leaves())


EMPTY: Final[PMap[Any]] = PMap()
