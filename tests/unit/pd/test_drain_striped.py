"""Drain's counts for striped streams (issue 30, docs/ARCHITECTURE.md section 10): a
range is under-replicated with fewer live servers than its ensemble (E), not than its
``replicas`` (an unstriped stream's count is as before)."""

from __future__ import annotations

from pathlib import Path

from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.drain import ReplicaTotals, under_replicated
from pd.pmap import PMap

ROOT = Path(__file__).resolve().parents[3]
REFS = tuple(ReplicaRef(i, f"127.0.0.1:{n + 1}") for n, i in enumerate("abcde"))
STRIPED = StreamMeta(1, "s", 3, 2, ranges=(RangeMeta(0, 0, 50, REFS),
                                           RangeMeta(1, 50, None, REFS)), ensemble=5)
PLAIN = StreamMeta(2, "p", 3, 2, ranges=(RangeMeta(0, 0, 50, REFS[:3]),))


def test_a_striped_range_missing_one_of_its_ensemble_is_under_replicated() -> None:
    four = set("abcd")
    assert under_replicated([STRIPED], four) == 2
    assert under_replicated([STRIPED], set("abcde")) == 0
    assert under_replicated([PLAIN], four) == 0 and under_replicated([PLAIN], set("ab")) == 1
    totals = ReplicaTotals()
    catalog = PMap({"s": STRIPED, "p": PLAIN})
    assert totals.under_replicated(catalog, four) == 2
    assert totals.under_replicated(catalog, set("ab")) == 3
