"""Catalogs the PD unit tests start from, built by real commands: servers registered, and
two streams with two sealed ranges each (the object tier's tests pack and damage them).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from pd.catalog import Catalog
from pd.commands import CreateStream, OpenWriter, PackMember, RegisterServer, SealRange


def registered(servers: Iterable[str], port: int = 7200) -> Catalog:
    """A catalog with ``servers`` registered (ssd) at 127.0.0.1 from ``port`` on."""
    catalog = Catalog()
    for i, sid in enumerate(servers):
        catalog.apply(RegisterServer(sid, f"127.0.0.1:{port + i}", "ssd"))
    return catalog


def two_sealed_streams(catalog: Catalog, placement: tuple[str, ...]) -> Catalog:
    """Streams "a" and "b" on ``placement``, each with ranges [0, 10) and [10, 20) sealed
    and an open third."""
    for name in ("a", "b"):
        catalog.apply(CreateStream(name, 3, 2, "", (), placement))
        catalog.apply(OpenWriter(name))
        catalog.apply(SealRange(name, 1, 0, 10, placement))
        catalog.apply(SealRange(name, 1, 1, 20, placement))
    return catalog


def members(c: Catalog, *which: tuple[str, int], replaces: str = "") -> tuple[PackMember, ...]:
    """Pack members for ranges ``(stream name, range index)`` as the catalog holds them."""
    out = []
    for name, index in which:
        s = c.stream(name)
        r = s.ranges[index - s.ranges[0].index]
        assert r.end is not None
        out.append(PackMember(name, s.id, index, r.start, r.end, replaces=replaces))
    return tuple(out)
