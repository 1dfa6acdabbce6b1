"""The limits that more than one module or process must agree on: frame, batch and read
sizes, protocol timings, the writer's defaults the servers size for.

The convention for every limit of estream: a ``Final`` number with a lowercase name, its
unit last (``bytes``, ``ms``, ``s``, or what is counted: ``records``), then ``max``,
``min`` or ``default``. A limit only one module goes by lives beside it, in that module;
``tests/unit/test_limit_names.py`` checks every module. The relationships between these
(a batch fits in a frame, a read answer fits in a frame, ...) are checked by
``tests/unit/wire/test_limits.py``.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB
GiB: Final = 1024 * MiB

# Frames (estream/wire/protocol.py).
frame_header_bytes_max: Final = 1 * MiB  # the msgpack header of one frame
frame_bytes_max: Final = 16 * MiB  # fixed prefix + header + payload of one frame
frame_direct_bytes_min: Final = 64 * KiB  # a client receives frames this large in place
connection_inflight_bytes_max: Final = 64 * MiB  # request bytes being served per connection
connection_write_buffer_bytes_max: Final = 1 * MiB  # unsent answers before a server stops reading
connection_answer_bytes_max: Final = 4 * MiB  # unsent + in-production answers per connection
answer_grant_bytes_min: Final = 64 * KiB  # smallest answer allowance worth producing
server_answer_bytes_max: Final = 16 * MiB  # the same, summed over a server's connections
stream_ranges_per_answer_max: Final = 1_000  # a stream's ranges in one PD answer (a window of
#   them; the rest are asked for by offset or index: pd/paging.py), about 400 KiB at most
stream_ranges_per_answer_default: Final = 8  # ... when the caller names no limit: a
#   stream's answer costs the same with 1 or 100,000 ranges (writers need the last two)
connection_stalled_ms_max: Final = 5_000  # a consumer not reading for this long, when the
#   answer budget is short, is disconnected
connection_inflight_requests_max: Final = 4096  # requests being served per connection
#   (beside its bytes: reading pauses past either). Many writers and long-polling readers
#   share one pooled connection (a writer keeps up to 256 batches in flight)
listener_connections_max: Final = 1024  # open connections per listening port; one past it
#   is closed at once (and counted)
connection_auth_ms_max: Final = 5_000  # a connection that must authenticate (tokens on)
#   and has not by then is closed

# Records and batches (estream/wire/record/).
batch_bytes_max: Final = 8 * MiB  # one encoded record batch
batch_records_max: Final = 65_536
record_value_bytes_max: Final = 4 * MiB
record_headers_bytes_max: Final = 64 * KiB  # msgpack-encoded headers of one record
record_key_bytes_max: Final = 64 * KiB  # one record's key (a Kafka record's)
producer_id_bytes_max: Final = 255  # utf-8 producer id in a batch's system block (u8)

# Reads.
read_bytes_max: Final = 8 * MiB  # payload of one read answer
read_wait_ms_max: Final = 30_000  # longest long-poll a range server holds

# Writer defaults (estream SDK).
linger_ms: Final = 1
writer_batch_bytes: Final = 256 * KiB
# A pending batch this large goes before it is full while fewer than writer_early_batches
# sent batches are unacknowledged: the replicas store part of a burst while the rest is made.
# (128 KiB rather than 64: half the batches, and a batch costs every replica a receive, a
# write and an answer; figures in benchmarks/RESULTS.md.)
writer_early_batch_bytes: Final = 128 * KiB
writer_early_batches: Final = 3
writer_inflight_batches_max: Final = 256
writer_inflight_bytes_max: Final = 32 * MiB
# A list of servers (hints, placements, replicas, exclusions) and a striped range's
# ensemble (its E servers are such a list in the catalog; also bounds
# Stripe.first_unheld's O(E x replicas)): one limit, one constant.
servers_in_list_max: Final = 64
chase_backlog_bytes_max: Final = 16 * MiB  # a slow replica's backlog before it is dropped
chase_backlog_batches_max: Final = 4_096  # complete batches kept for a chasing replica
chase_backlog_ms_max: Final = 2_000  # a slow replica's oldest unacked batch age before drop
range_bytes_max: Final = 1024 * MiB  # a range rolls when it passes this size
delivery_timeout_ms: Final = 30_000  # an append not acknowledged by then raises Timeout
roll_backoff_ms_min: Final = 500  # degraded writer: first wait before trying a roll again
roll_backoff_ms_max: Final = 4_000  # ... doubling up to this (a few ranges per outage)

# Writer lease (pd/): a writer keeps its stream's lease alive; the PD leader recovers an
# open range whose writer's lease ran out (a dead writer's acknowledged tail gets visible).
writer_keepalive_ms: Final = 1_000
writer_lease_ms: Final = 4_000
keepalive_writers_max: Final = 4_096  # writers renewed by one PD_WRITERS_KEEPALIVE request

# Timeouts.
request_timeout_ms: Final = 5_000
connect_timeout_ms: Final = 2_000
heartbeat_interval_ms: Final = 1_000
server_suspect_after_ms: Final = 4_000  # missed heartbeats before a server gets no new ranges
gateway_ttl_ms: Final = 3_000  # a Kafka gateway not heard from this long loses its partitions
gateway_beat_interval_ms: Final = 500  # how often a Kafka gateway beats to PD (pd/gateways.py)

# Write-ahead log (rangeserver/).
segment_bytes_max: Final = 256 * MiB
cache_bytes_max: Final = 256 * MiB
wal_write_bytes_max: Final = 16 * MiB  # one direct log write (a group); two such buffers
wal_idle_sync_ms: Final = 50  # DEFERRED_SYNC writes are fsynced after this much idle time

# Repair (pd/repair.py, pd/shell/repairer.py): sealed ranges short of replicas are re-replicated.
repair_after_ms: Final = 10_000  # a replica dead (or reported short) this long is replaced
repair_interval_ms: Final = 2_000  # how often the PD leader plans a repair round
repair_tasks_per_round_max: Final = 64  # ranges one round plans (a backlog of small ones
#   after a server is lost: 4 a round every 2 s repaired 2 ranges a second)
repair_copies_at_once_max: Final = 4  # of a round's ranges, copied at once
repair_round_starts_ms_max: Final = 10_000  # a round starts no copy later than this after
#   it began (the rest are planned afresh: a round of large ranges holds no plan for long)
heartbeat_problem_replicas_max: Final = 256  # damaged/short/open replicas in one heartbeat
# The latest stream deletions each PD node remembers and every heartbeat answer names, so
# a range server that missed a delete's DROP_STREAM drops the stream's replicas at its next
# beat (pd/catalog.py keeps them, estream/wire/pdanswers.py bounds the answer's).
deleted_streams_max: Final = 1_024
# The latest deletes' request ids PD remembers (in snapshots), so that a client's retry
# of a delete that landed answers it rather than deleting the name's next stream
# (pd/deleterequests.py).
delete_requests_max: Final = 1_024

# Reclaim (pd/reclaim.py, pd/shell/reclaimer.py): replicas of deleted streams and trimmed ranges
# are dropped on their range servers, which then delete the log segments only they used.
reclaim_interval_ms: Final = 5_000  # how often the PD leader lists each server's replicas
reclaim_drops_per_round_max: Final = 1_000  # DROP_RANGE calls of one round (all servers)

# Processes with two busy threads under one GIL (PD: asyncio + pysyncobj's tick thread;
# range server: asyncio + the log's writer thread) hand the GIL over this often, not every
# 5 ms (CPython's default): each hand-off between them could otherwise cost up to 5 ms.
gil_switch_interval_s: Final = 0.0005

# Wrong-port hints (estream/net/portprobe.py): after a PD call timed out, the CLI probes
# whether an address is a PD Raft port; each probe's connect and answer wait this long.
raft_port_probe_timeout_s: Final = 1.0

# APPEND_MANY (estream/wire/appendmany.py): a client's batches to one range server, queued in
# one event-loop turn, share one request. Bounds on one request; a batch past the bytes bound
# goes alone, as an APPEND.
append_many_entries_max: Final = 256  # batches in one APPEND_MANY (a writer's in-flight max)
append_many_bytes_max: Final = 4 * MiB  # their bytes together (frame_bytes_max bounds the frame)

# Consumer groups (pd/groups.py): one member's protocol metadata, and one round's
# assignments (every member's), so that a group change stays well within a PD command.
group_member_metadata_bytes_max: Final = 16 * 1024
group_assignment_bytes_max: Final = 48 * 1024
