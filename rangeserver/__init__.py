"""The range server: stores replicas of ranges in one write-ahead log.

The modules here are its pure decisions: the replica state machine (:mod:`replica`), the
log's entry format (:mod:`walformat`), the in-memory index, replay at start and segment
retention. :mod:`rangeserver.shell` runs them against disks and sockets.
"""
