"""A topic's partition count is found from its own streams (``T-0``, ``T-1``, ... sort
together), not by listing the catalog: a Metadata request naming one topic listed every
stream (100,000 of them: every page, for every request)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from estream.kafka.shell.admin import topic_counts


class Catalog:
    def __init__(self, names: list[str]) -> None:
        self.names = sorted(names)
        self.listed = 0  # streams handed out

    async def iter_streams(self, *, after: str = "") -> AsyncIterator[Any]:
        for name in self.names:
            if name > after:
                self.listed += 1
                yield SimpleNamespace(name=name)


async def test_named_topics_list_their_own_streams_only() -> None:
    names = ([f"a{i:05}-0" for i in range(1000)] + ["orders-0", "orders-1", "orders-x-0"]
             + [f"z{i:05}-0" for i in range(1000)])
    catalog = Catalog(names)
    counts = await topic_counts(catalog, ["orders", "orders", "missing", "a/b", None])  # type: ignore[arg-type]
    assert counts == {"orders": 2}
    assert catalog.listed <= 5  # orders-0, orders-1, orders-x-0 and one past each prefix
    assert len(await topic_counts(catalog)) == 2002  # type: ignore[arg-type]  # every topic
