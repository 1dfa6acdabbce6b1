"""The placement driver's shell: Raft (pysyncobj), the journal on disk, the RPC service,
the admin HTTP API, and the leader-only loops (repair, reclaim, lease recovery) that carry
out the decisions of the pure modules in :mod:`pd`.
"""
