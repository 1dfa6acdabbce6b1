"""pd/metrics.py: what PD records, and how the families read through prometheus-client;
PD's readiness rule (pd/shell/http.py).

The text itself is the library's (``estream/server/metrics.py``); promtool checks it on real
processes in tests/integration/test_metrics.py.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from estream.server.metrics import FamiliesCollector, exposition, new_registry
from pd.metrics import (
    LATENCY_BUCKETS_S,
    Histogram,
    Metrics,
    counter_family,
    histogram_family,
)
from pd.shell.http import needs_token, not_ready_reason
from pd.shell.raft import RaftStatus


def scrape(m: Metrics, **kwargs: object) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    registry = new_registry()
    registry.register(FamiliesCollector(lambda: m.families(**kwargs)))  # type: ignore[arg-type]
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(exposition(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def test_histogram_buckets_are_cumulative_with_inf_last() -> None:
    h = Histogram()
    for seconds in (0.0001, 0.003, 0.003, 7.0):
        h.observe(seconds)
    samples = h.samples()
    buckets = [(dict(s.labels)["le"], s.value) for s in samples if s.suffix == "_bucket"]
    assert buckets[0] == ("0.0005", 1)
    assert dict(buckets)["0.005"] == 3
    assert buckets[-1] == ("+Inf", 4) and len(buckets) == len(LATENCY_BUCKETS_S) + 1
    assert [s.value for s in samples if s.suffix == "_count"] == [4]
    assert [s.value for s in samples if s.suffix == "_sum"] == [pytest.approx(7.0061)]


def test_requests_counters_and_histograms_by_api_and_op() -> None:
    m = Metrics()
    m.observe("rpc", "PD_CLUSTER", 0.002, ok=True)
    m.observe("rpc", "PD_CLUSTER", 0.2, ok=False)
    assert m.requests("rpc", "PD_CLUSTER") == 2
    seen = scrape(m)
    ok = (("api", "rpc"), ("op", "PD_CLUSTER"), ("outcome", "ok"))
    assert seen["estream_pd_requests_total"][ok] == 1
    count = seen["estream_pd_request_seconds_count"]
    assert count[(("api", "rpc"), ("op", "PD_CLUSTER"))] == 2


def test_registered_counters_gauges_histograms_and_scrape_time_families() -> None:
    m = Metrics()
    m.count("estream_offloads_total", "Ranges offloaded.", 3, outcome="done")
    m.set_gauge("estream_offload_lag_seconds", "Offload lag.", 12.5)
    m.observe_seconds("estream_offload_seconds", "Upload time.", 0.7, store="file")
    assert m.counter("estream_offloads_total", outcome="done") == 3
    histogram = m.histogram("estream_offload_seconds", store="file")
    assert histogram is not None and histogram.count == 1
    commits = Histogram()
    commits.observe(0.004)
    seen = scrape(m, gauges={"estream_pd_streams": ("Streams.", 4.0)}, extra=[
        counter_family("estream_pd_raft_proposals_total", "Proposals.", 9),
        histogram_family("estream_pd_raft_commit_seconds", "Commits.", commits)])
    assert seen["estream_offloads_total"][(("outcome", "done"),)] == 3
    assert seen["estream_offload_lag_seconds"][()] == 12.5
    assert seen["estream_offload_seconds_count"][(("store", "file"),)] == 1
    assert seen["estream_pd_streams"][()] == 4
    assert seen["estream_pd_raft_proposals_total"][()] == 9
    assert seen["estream_pd_raft_commit_seconds_bucket"][(("le", "0.005"),)] == 1
    assert "process_cpu_seconds_total" in seen  # the library's process collector


def test_a_name_keeps_its_type() -> None:
    m = Metrics()
    m.count("estream_x_total", "X.")
    with pytest.raises(ValueError, match="counter"):
        m.set_gauge("estream_x_total", "X.", 1)


def test_gauge_max_over_every_label() -> None:
    m = Metrics()
    assert m.gauge_max("estream_cursor_lag") is None
    m.set_gauge("estream_cursor_lag", "Lag.", 3, stream="a", cursor="c")
    m.set_gauge("estream_cursor_lag", "Lag.", 7, stream="b", cursor="c")
    assert m.gauge_max("estream_cursor_lag") == 7


def status(leader: str | None, connected: bool, me: str = "n1:7110") -> RaftStatus:
    peers = {"n2:7110": connected, "n3:7110": connected}
    return RaftStatus(me, "leader" if leader == me else "follower", leader, 3, 10, 10, 10, peers)


@pytest.mark.parametrize(
    ("raft", "caught_up", "reason"),
    [
        (status("n1:7110", False), True, None),  # the leader itself
        (status("n2:7110", True), True, None),
        (status(None, True), True, "knows no leader"),
        # every peer gone: pysyncobj still names its last leader
        (status("n2:7110", False), True, "not connected to its last known leader"),
        (status("n2:7110", True), False, "catching up"),
    ],
)
def test_pd_readiness(raft: RaftStatus, caught_up: bool, reason: str | None) -> None:
    found = not_ready_reason(raft, caught_up)
    assert found is None if reason is None else reason in (found or "")


def test_readyz_and_healthz_need_no_token() -> None:
    assert not needs_token("GET", "/readyz", protect_reads=True)
    assert not needs_token("GET", "/healthz", protect_reads=True)
    assert needs_token("GET", "/metrics", protect_reads=True)
