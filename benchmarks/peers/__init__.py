"""The systems estream is compared with, and the shared measuring code of ``compare.py``.

One module per peer: it starts and stops the peer's servers on 127.0.0.1 (always by PID,
from a ``finally``) and drives them from Python with the peer's own asyncio client:
:mod:`.nats` (JetStream, 3 nodes, R3), :mod:`.redis` (Redis 7, AOF fsync always),
:mod:`.estream` (estream through its SDK) and
:mod:`.machine` (the machine's ceiling: fdatasync loops and loopback bandwidth). etcd, the placement
driver's peer, lives in ``benchmarks/bench_pd.py``, which ``compare.py`` reuses.
:mod:`.load` holds the bounded load loops and :mod:`.stats` the measurement records.
"""
