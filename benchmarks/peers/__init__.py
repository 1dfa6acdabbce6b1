"""The systems estream is compared with, and the shared measuring code of ``compare.py``.

One module per peer: it starts and stops the peer's servers on 127.0.0.1 (always by PID,
from a ``finally``) and drives them from Python with the peer's own asyncio client:
:mod:`.nats` (JetStream, 3 nodes, R3), :mod:`.redis` (Redis 7, AOF fsync always),
:mod:`.etcd` (etcd 3.4, 3 members), :mod:`.estream` (estream through its SDK) and
:mod:`.machine` (the machine's ceiling: fdatasync loops and loopback bandwidth).
:mod:`.load` holds the bounded load loops and :mod:`.stats` the measurement records.
"""
