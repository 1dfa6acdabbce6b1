"""The replication protocol's decisions, as pure state machines shared by the SDK and PD.

Quorum math (:mod:`quorum`), the writer's one core (:mod:`writer`) and its 2/3 chasing
write (:mod:`rangewriter`), the roll to a new
range (:mod:`roll`), the fail-over seal of an abandoned range (:mod:`seal`) and the order
in which a recovery's requests go out (:mod:`recovery`), the reader's cursor
(:mod:`readcursor`), idempotent producers' duplicate detection (:mod:`producer`),
bounded retry waits (:mod:`backoff`) and which ranges may hold a time (:mod:`timerange`).
They import only :mod:`estream.wire`; the asyncio drivers in :mod:`estream.net` and
:mod:`estream.sdk` feed them events and carry out their effects, and the simulator
(``tests/sim``) drives the same classes with a seeded clock.
"""
