"""The range server's shell: the write-ahead log on disk (O_DIRECT / Linux AIO, spare
segments, checkpoints), the replica store, the RPC server and the heartbeat to PD, carrying
out the decisions of the pure modules in :mod:`rangeserver`.
"""
