"""The PD leader's registry of Kafka gateways (pd/gateways.py): a TTL per gateway, a new
term forgets all and is settled only after a TTL, bounded, bad ids refused by name."""

from __future__ import annotations

import pytest

from estream.wire.errors import InvalidArgument
from pd.gateways import GatewayRegistry, check_gateway_id


def test_a_gateway_is_live_until_its_ttl_passes() -> None:
    r = GatewayRegistry(ttl_ms=3_000)
    r.lead(1, 10_000)
    r.beat("h:2", 10_000)
    r.beat("h:1", 11_000)
    assert r.live(12_999) == ["h:1", "h:2"]
    assert r.live(13_000) == ["h:1"]
    r.beat("h:2", 13_500)  # back: live again
    assert r.live(13_500) == ["h:1", "h:2"]
    r.leave("h:1")
    assert r.live(13_500) == ["h:2"]


def test_a_new_term_starts_afresh_and_settles_after_a_ttl() -> None:
    r = GatewayRegistry(ttl_ms=3_000)
    r.lead(1, 0)
    r.beat("h:1", 0)
    r.lead(1, 5_000)  # the same term: nothing changes
    assert r.settled(5_000) and r.live(2_000) == ["h:1"]
    r.lead(2, 5_000)
    assert r.live(5_000) == [] and not r.settled(7_999) and r.settled(8_000)


def test_each_pool_is_answered_its_own_gateways() -> None:
    r = GatewayRegistry()
    r.lead(1, 0)
    r.beat("h:1", 0)
    r.beat("h:2", 0, "sasl")
    r.beat("h:3", 0, "sasl")
    assert r.live(1) == ["h:1"] and r.live(1, "sasl") == ["h:2", "h:3"]
    assert r.live(1, "ssl") == []
    with pytest.raises(InvalidArgument) as refused:
        r.beat("h:4", 0, "no pool!")
    assert refused.value.argument == "pool"


def test_bounded_and_expired_gateways_make_room() -> None:
    r = GatewayRegistry(ttl_ms=1_000, limit=2)
    r.lead(1, 0)
    r.beat("h:1", 0)
    r.beat("h:2", 0)
    with pytest.raises(InvalidArgument) as refused:
        r.beat("h:3", 10)
    assert refused.value.argument == "gateway" and r.live(10) == ["h:1", "h:2"]
    r.beat("h:1", 10)  # a known one always beats
    r.beat("h:3", 1_000)  # h:1 (10) still live, h:2 (0) expired: room
    assert r.live(1_000) == ["h:1", "h:3"]


@pytest.mark.parametrize("bad", ["", "nohost", ":1", "h:", "h:x", "h :1", "h\n:1",
                                 "h" * 300 + ":1", 5, None])
def test_bad_gateway_ids_are_refused_by_name(bad: object) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_gateway_id(bad)
    assert refused.value.argument == "gateway"
    r = GatewayRegistry()
    r.lead(1, 0)
    with pytest.raises(InvalidArgument):
        r.beat(bad, 0)  # type: ignore[arg-type]
    assert r.live(0) == []
