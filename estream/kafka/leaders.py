"""Which Kafka gateway leads each partition: rendezvous hashing over the live gateways.

Every gateway learns the live gateways from PD (``PD_GATEWAY_HEARTBEAT``,
``pd/gateways.py``) and computes the same answer: partition stream ``T-p`` is led by the
gateway whose hash of ``(gateway id, stream)`` is highest (:func:`owner`). So a gateway
joining takes only the partitions it now wins, and one leaving gives away only its own,
each to the gateway second on that partition's list. A gateway's id is its advertised
``HOST:PORT``; its Kafka node id a hash of it (:func:`node_ids`, the same on every gateway).

A gateway owns a partition only while its view is fresh (a beat answered within the TTL,
counted from when it was sent): cut off from PD, it stops writing before PD gives its
partitions away (:class:`Leadership`).

Pure: no I/O, no clock (callers pass ``now_ms``).
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Sequence


def _score(gateway: str, stream: str) -> bytes:
    return hashlib.blake2b(f"{gateway}\x00{stream}".encode(), digest_size=8).digest()


def owner(stream: str, gateways: Iterable[str]) -> str | None:
    """The gateway leading ``stream`` among ``gateways`` (None: no gateway).

    >>> three = ["a:1", "b:1", "c:1"]
    >>> [owner(f"orders-{p}", three) for p in range(4)]
    ['c:1', 'c:1', 'b:1', 'b:1']
    >>> [owner(f"orders-{p}", ["a:1", "b:1"]) for p in range(4)]   # c:1 left: its own moved
    ['b:1', 'b:1', 'b:1', 'b:1']
    >>> owner("orders-0", []) is None
    True
    """
    return max(gateways, key=lambda g: (_score(g, stream), g), default=None)


def node_ids(gateways: Iterable[str]) -> dict[str, int]:
    """Each gateway's Kafka node id: a 30-bit hash of its id, the next free one on a
    clash (in sorted order: the same on every gateway).

    >>> node_ids(["127.0.0.1:7140", "127.0.0.1:7141"])
    {'127.0.0.1:7140': 1031982405, '127.0.0.1:7141': 176553427}
    """
    out: dict[str, int] = {}
    taken: set[int] = set()
    for gateway in sorted(set(gateways)):
        node = zlib.crc32(gateway.encode()) & 0x3FFF_FFFF
        while node in taken:
            node = (node + 1) & 0x3FFF_FFFF
        taken.add(node)
        out[gateway] = node
    return out


class Leadership:
    """One gateway's view of the live gateways, and what it leads.

    >>> me = Leadership("a:1", ttl_ms=3_000)
    >>> me.owns("orders-0", 0)                # nothing heard yet
    False
    >>> me.heard(["a:1", "c:1"], settled=True, sent_ms=0)
    >>> me.owns("orders-0", 100), me.leader("orders-0"), me.owns("orders-2", 100)
    (False, 'c:1', True)
    >>> me.heard(["a:1"], settled=False, sent_ms=500)   # a new PD leader: keep c:1
    >>> me.gateways
    ('a:1', 'c:1')
    >>> me.heard(["a:1"], settled=True, sent_ms=1_000)
    >>> me.owns("orders-0", 3_999), me.owns("orders-0", 4_000)   # fresh until sent + TTL
    (True, False)
    """

    def __init__(self, me: str, ttl_ms: int) -> None:
        self.me = me
        self.ttl_ms = ttl_ms
        self.gateways: tuple[str, ...] = ()
        self._fresh_until_ms = -1

    def heard(self, gateways: Sequence[str], settled: bool, sent_ms: int) -> None:
        """PD answered a beat sent at ``sent_ms`` with ``gateways`` (``settled``: a
        leader that had a whole TTL to hear from every gateway; else those are added to
        the ones known)."""
        live = set(gateways) if settled else set(gateways) | set(self.gateways)
        self.gateways = tuple(sorted(live))
        self._fresh_until_ms = sent_ms + self.ttl_ms

    def fresh(self, now_ms: int) -> bool:
        return now_ms < self._fresh_until_ms and self.me in self.gateways

    def leader(self, stream: str) -> str:
        """The gateway Metadata names as ``stream``'s leader (this one while it knows no
        other)."""
        return owner(stream, self.gateways) or self.me

    def owns(self, stream: str, now_ms: int) -> bool:
        """Whether this gateway may write ``stream`` now."""
        return self.fresh(now_ms) and owner(stream, self.gateways) == self.me

    def brokers(self) -> dict[str, int]:
        """Every gateway Metadata lists (this one included), with its node id."""
        return node_ids((*self.gateways, self.me))


__all__ = ["Leadership", "node_ids", "owner"]
