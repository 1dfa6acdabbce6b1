"""The transport ring: asyncio on top of :mod:`estream.wire`, shared by the SDK and servers.

The multiplexed frame client and dispatching server (:mod:`rpc`), TLS and tokens
(:mod:`security`), the typed placement-driver client (:mod:`pdclient`), the typed
range-server client (:mod:`rangeclient`) and the recovery driver that runs
:class:`estream.core.seal.RangeRecovery` over it (:mod:`recovery`, used by a new writer and
by the PD leader).
"""
