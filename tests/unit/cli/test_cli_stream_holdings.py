"""``estream stream describe``'s ranges table: for a striped stream each server with how much
of the range it holds by the layout (docs/ARCHITECTURE.md section 10); unstriped as before."""

from __future__ import annotations

from pathlib import Path

from estream.cli.streams import _servers
from estream.core.stripedread import holding
from estream.wire.stripe import Stripe

ROOT = Path(__file__).resolve().parents[3]
SERVERS = [{"id": c, "address": f"h{c}:1"} for c in "abcde"]


def test_each_server_of_a_striped_range_with_its_share_or_its_batches() -> None:
    stream = {"replicas": 3, "ensemble": 5}
    assert _servers(stream, {"replicas": SERVERS}) == ", ".join(
        f"h{c}:1 (3/5)" for c in "abcde")
    shown = _servers(stream, {"replicas": SERVERS, "batches": 9})
    assert shown == "ha:1 (5/9 batches), hb:1 (5/9 batches), hc:1 (6/9 batches), " \
                    "hd:1 (6/9 batches), he:1 (5/9 batches)"


def test_an_unstriped_range_lists_its_servers_as_before() -> None:
    assert _servers({"replicas": 3, "ensemble": 3}, {"replicas": SERVERS[:3]}) == (
        "ha:1, hb:1, hc:1")
    assert _servers({"replicas": 3}, {"replicas": []}) == "-"


def test_holding_counts_the_layouts_batches() -> None:
    for e, r in ((5, 3), (6, 3), (4, 2), (7, 3)):
        stripe = Stripe(e, r, 1)
        for n in (0, 1, e - 1, e, 3 * e + 2):
            counts = [sum(1 for k in range(n) if stripe.holds(p, k)) for p in range(e)]
            assert [holding(e, r, p, n) for p in range(e)] == [
                f"{c}/{n} batches" for c in counts]
            assert sum(counts) == n * r


def test_the_console_shows_the_same() -> None:
    script = (ROOT / "pd/shell/consolescript.py").read_text()
    assert "function holding(s, r, p)" in script and "esc(holding(s, r, i))" in script
