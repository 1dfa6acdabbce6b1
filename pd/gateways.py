"""Kafka gateways registered in PD: which are alive to lead partitions.

Each ``estream kafka`` gateway sends ``PD_GATEWAY_HEARTBEAT`` (its id: its advertised
address) every ``limits.gateway_beat_interval_ms`` to the PD leader, which answers the live
gateways; the gateways assign partitions among them (``estream/kafka/leaders.py``). As
writer leases and group sessions, this is the leader's memory, judged by its clock, not
replicated: a gateway is live while its last beat is younger than :data:`gateway_ttl_ms`.
A new term forgets all, and the answer is ``settled`` only once the leader has led for a
whole TTL (before that, gateways that did not beat to it yet are missing, and a gateway
keeps those it knew). A gateway leaving (SIGTERM) is forgotten at once. Each gateway
beats with its ``pool`` (its security: ``plaintext``, ``sasl``, ``ssl``, ``sasl_ssl``) and
is answered the live gateways of its pool only, so that Metadata never sends a client to
a gateway that authenticates differently.

Bounded: :data:`gateways_max` live gateways; one more is :class:`InvalidArgument` (field
``gateway``); expired ones are forgotten at each beat.

Pure: no I/O, no clock (callers pass ``now_ms``).
"""

from __future__ import annotations

from typing import Final

from estream.wire import limits
from estream.wire.errors import InvalidArgument

gateways_max: Final = 256  # live gateways the leader keeps
gateway_ttl_ms: Final = limits.gateway_ttl_ms  # not heard from this long: not live
gateway_id_chars_max: Final = 256  # an id is a HOST:PORT
pool_chars_max: Final = 32


def check_gateway_id(gateway: object) -> str:
    """A valid gateway id: a non-empty ``HOST:PORT`` of printable characters.

    >>> check_gateway_id("127.0.0.1:7140")
    '127.0.0.1:7140'
    >>> check_gateway_id("nope")
    Traceback (most recent call last):
    ...
    estream.wire.errors.InvalidArgument: gateway: a HOST:PORT, not 'nope'
    """
    if not isinstance(gateway, str) or not 0 < len(gateway) <= gateway_id_chars_max:
        raise InvalidArgument(f"gateway: a HOST:PORT of at most {gateway_id_chars_max} "
                              "characters", argument="gateway")
    host, sep, port = gateway.rpartition(":")
    if not sep or not host or not port.isdigit() or not gateway.isprintable() or (
            " " in gateway):
        raise InvalidArgument(f"gateway: a HOST:PORT, not {gateway[:80]!r}", argument="gateway")
    return gateway


class GatewayRegistry:
    """The live gateways, as the PD leader sees them.

    >>> r = GatewayRegistry()
    >>> r.lead(1, 0)
    >>> r.beat("h:1", 0); r.beat("h:2", 1_000); r.beat("h:3", 1_000, pool="sasl")
    >>> r.live(2_999), r.settled(2_999)
    (['h:1', 'h:2'], False)
    >>> r.live(3_000), r.settled(3_000), r.live(3_000, "sasl")
    (['h:2'], True, ['h:3'])
    >>> r.leave("h:2"); r.live(3_000)
    []
    >>> r.beat("h:1", 3_500); r.lead(2, 3_600); r.live(3_600)   # a new term forgets all
    []
    """

    def __init__(self, ttl_ms: int = gateway_ttl_ms, limit: int = gateways_max) -> None:
        self.ttl_ms = ttl_ms
        self.limit = limit
        self._term = -1
        self._led_ms = 0
        self._beats: dict[str, tuple[int, str]] = {}  # gateway -> last beat (ms), pool

    def lead(self, term: int, now_ms: int) -> None:
        """Called with the leader's term before each beat: a new term starts afresh."""
        if term != self._term:
            self._term = term
            self._led_ms = now_ms
            self._beats.clear()

    def beat(self, gateway: str, now_ms: int, pool: str = "plaintext") -> None:
        """``gateway`` is alive at ``now_ms``; :class:`InvalidArgument` for a bad id or a
        new gateway past :data:`gateways_max` live ones (nothing kept)."""
        check_gateway_id(gateway)
        self._expire(now_ms)
        if gateway not in self._beats and len(self._beats) >= self.limit:
            raise InvalidArgument(f"gateway: {self.limit} gateways are live, at most",
                                  argument="gateway")
        if not pool.isidentifier() or len(pool) > pool_chars_max:
            raise InvalidArgument("pool: a name of letters, digits and _", argument="pool")
        self._beats[gateway] = (now_ms, pool)

    def leave(self, gateway: str) -> None:
        self._beats.pop(gateway, None)

    def live(self, now_ms: int, pool: str = "plaintext") -> list[str]:
        """The live gateways of ``pool``, sorted."""
        return sorted(g for g, (at, p) in self._beats.items()
                      if now_ms - at < self.ttl_ms and p == pool)

    def settled(self, now_ms: int) -> bool:
        """Whether every live gateway had a whole TTL to beat to this leader."""
        return now_ms - self._led_ms >= self.ttl_ms

    def _expire(self, now_ms: int) -> None:
        for gone in [g for g, (at, _) in self._beats.items() if now_ms - at >= self.ttl_ms]:
            del self._beats[gone]


__all__ = ["GatewayRegistry", "check_gateway_id", "gateway_ttl_ms", "gateways_max"]
