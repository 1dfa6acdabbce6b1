"""What a PD node measures: its metric names and help, and :class:`Metrics`, the recorder
(``estream/core/metrics.py``, the one way estream makes metrics) with PD's requests by API,
operation and outcome. Other parts of PD (repair, reclaim, recovery, offload) record with
``count``, ``set_gauge`` and ``observe_seconds``.

Pure: no I/O (the caller measures durations and serves the text).
"""

from __future__ import annotations

from typing import Final

from estream.core.metrics import (
    LATENCY_BUCKETS_S,
    Family,
    Histogram,
    Recorder,
    Sample,
    counter_family,
    histogram_family,
)

__all__ = ["LATENCY_BUCKETS_S", "Family", "Histogram", "Metrics", "Sample", "counter_family",
           "histogram_family"]

WRITER_RECOVERIES_TOTAL: Final = "estream_writer_recoveries_total"
WRITER_RECOVERIES_HELP: Final = (
    "Open ranges the PD leader recovered after their writer's lease ran out, by outcome "
    "(sealed, kept, unavailable, superseded, failed; alive: seen on its data path, its "
    "lease renewed instead).")
# The object-storage tier's offloader (pd/shell/offloader.py): name -> help.
OFFLOADED_BYTES: Final = "estream_offload_bytes_total"
OFFLOADED_RANGES: Final = "estream_offload_ranges_total"
OFFLOAD_ERRORS: Final = "estream_offload_errors_total"
OFFLOAD_LAG: Final = "estream_offload_lag_seconds"
OBJECT_REQUESTS: Final = "estream_object_requests_total"
RECLAIMED_BYTES: Final = "estream_offload_reclaimed_bytes_total"
RELEASED_RANGES: Final = "estream_offload_released_ranges_total"
OBJECTS_DELETED: Final = "estream_objects_deleted_total"
OBJECTS_COMPACTED: Final = "estream_objects_compacted_total"
OFFLOAD_HELP: Final = {
    OFFLOADED_BYTES: "Bytes of sealed ranges uploaded to the object store and committed.",
    OFFLOADED_RANGES: "Sealed ranges uploaded to the object store and committed.",
    OFFLOAD_ERRORS: "Failed offload steps, by stage (read, put, verify, commit, release, sweep).",
    OFFLOAD_LAG: "How long the oldest sealed range still in the local tier has waited.",
    OBJECT_REQUESTS: "Object-store requests of the offloader, by operation and outcome.",
    RECLAIMED_BYTES: "Range-server bytes released (object size times replicas dropped).",
    RELEASED_RANGES: "Object-tier ranges whose range-server replicas were released.",
    OBJECTS_DELETED: "Objects deleted: unreferenced, uncommitted, or found by the sweep.",
}
# (not in OFFLOAD_HELP, whose every metric the Grafana dashboard must show: none shows this)
OBJECTS_COMPACTED_HELP: Final = ("Objects rewritten by compaction into a new object (small "
                                 "or mostly garbage), counted when the rewrite commits.")
# The offloader's backlog by stage (pd/offload.py's backlog(); label stage: "upload" for
# ranges sealed and still local, "release" for object-tier ranges still listing replicas).
OFFLOAD_BACKLOG: Final = "estream_pd_offload_backlog_ranges"
OFFLOAD_BACKLOG_AGE: Final = "estream_pd_offload_backlog_age_seconds"
OFFLOAD_BACKLOG_HELP: Final = {
    OFFLOAD_BACKLOG: "Ranges waiting in the PD leader's offloader, by stage (upload: sealed, "
                     "not yet in the object tier; release: in the object tier, range-server "
                     "replicas not yet released). 0 on followers.",
    OFFLOAD_BACKLOG_AGE: "How long the oldest range of each offloader stage has waited there "
                         "(as seen by this leader). 0 on followers.",
}
# Damaged objects (pd/objectdamage.py, pd/shell/offloader.py): name -> help (not in
# OFFLOAD_HELP: the dashboard need not show them; the alert rules may).
DAMAGE_REPORTS: Final = "estream_object_damage_reports_total"
DAMAGE_CHECKS: Final = "estream_object_damage_checks_total"
DAMAGE_REPAIRED: Final = "estream_object_damage_repaired_ranges_total"
DAMAGE_LOST: Final = "estream_object_damage_lost_ranges_total"
DAMAGE_HELP: Final = {
    DAMAGE_REPORTS: "Readers' reports of a missing or damaged object received by the PD "
                    "leader, by outcome (queued, stale, pending, recent, full).",
    DAMAGE_CHECKS: "Objects the PD leader read back after a report or a failed check "
                   "before a release, by result (damaged, sound, inconclusive).",
    DAMAGE_REPAIRED: "Ranges of damaged objects moved back to the local tier, to be "
                     "uploaded again from their replicas.",
    DAMAGE_LOST: "Ranges whose part of an object is damaged and whose replicas are "
                 "released: unreadable until restored by hand.",
}
# The object scrub (pd/scrub.py, pd/shell/scrubber.py): name -> help.
SCRUB_OBJECTS: Final = "estream_object_scrub_objects_total"
SCRUB_BYTES: Final = "estream_object_scrub_bytes_total"
SCRUB_DAMAGED: Final = "estream_object_scrub_damaged_total"
SCRUB_HELP: Final = {
    SCRUB_OBJECTS: "Committed objects the PD leader's scrub read back, by result (sound, "
                   "damaged, inconclusive).",
    SCRUB_BYTES: "Bytes the PD leader's scrub read back from committed objects.",
    SCRUB_DAMAGED: "Objects the scrub found missing or damaged (their ranges uploaded "
                   "again from replicas, or counted as lost).",
}
REQUESTS_TOTAL: Final = "estream_pd_requests_total"
REQUEST_SECONDS: Final = "estream_pd_request_seconds"
COMMIT_SECONDS: Final = "estream_pd_raft_commit_seconds"
COMMIT_HELP: Final = "Raft commit latency of the commands this node proposed."



class Metrics(Recorder):
    """PD's recorder: per-operation request counts (ok / error) and latency histograms,
    plus the counters, gauges and histograms other parts of PD register by name."""

    def observe(self, api: str, op: str, seconds: float, ok: bool) -> None:
        """One request served by ``api`` ("rpc", "http") for ``op``, and how long it took."""
        self.count(REQUESTS_TOTAL, "PD requests served, by API, operation and outcome.",
                   api=api, op=op, outcome="ok" if ok else "error")
        self.observe_seconds(REQUEST_SECONDS, "PD request latency, by API and operation.",
                             seconds, api=api, op=op)

    def requests(self, api: str, op: str) -> int:
        return (self.counter(REQUESTS_TOTAL, api=api, op=op, outcome="ok")
                + self.counter(REQUESTS_TOTAL, api=api, op=op, outcome="error"))
