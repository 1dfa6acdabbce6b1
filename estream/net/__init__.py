"""The transport ring: asyncio on top of :mod:`estream.wire`, shared by the SDK and servers.

The multiplexed frame client and dispatching server (:mod:`rpc`), TLS and tokens
(:mod:`security`), the typed placement-driver client (:mod:`pdclient`) and the check that
tells a client pointed at a PD node's Raft port so (:mod:`portprobe`), the typed
range-server client with the one copy loop (:mod:`rangeclient`), the recovery driver that
runs :class:`estream.core.seal.RangeRecovery` over it (:mod:`recovery`, used by a new
writer and by the PD leader), the object store client behind the object tier
(:mod:`objectstore`) and the read of one object's index (:mod:`objectindex`). The ports
the simulator replaces: the clock every shell reads (:mod:`clock`) and the network the RPC
layer opens and serves connections through (:mod:`transport`).
"""
