"""The placement driver (PD): the catalog of streams, ranges and range servers.

The modules here are its pure decisions, tested without sockets: the catalog state machine
(:mod:`catalog`, :mod:`commands`), placement, liveness, writer leases, repair and reclaim
planning, the metrics text and the OpenAPI document. :mod:`pd.shell` runs them: Raft, the
journal, the RPC service, the HTTP API and the leader-only loops.
"""
