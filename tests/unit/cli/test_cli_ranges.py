"""estream/cli/ranges.py's pure parts: which admin address to ask, the summary line, the
table rows, typed errors of the admin API's answers."""

from __future__ import annotations

from estream.cli.admin import admin_address, http_error
from estream.cli.ranges import rows, skip_lines, summary
from estream.wire.errors import InvalidArgument, Unauthenticated, Unavailable

NODES = [{"id": "1", "address": "10.0.0.1:7100", "http": "10.0.0.1:7120"},
         {"id": "2", "address": "10.0.0.2:7100", "http": "0.0.0.0:7120"}]


def test_the_leaders_admin_address_first_then_any_node() -> None:
    leader = {"id": "2", "address": "10.0.0.2:7100", "http": "0.0.0.0:7120"}
    assert admin_address({"leader": leader, "nodes": NODES}) == ("10.0.0.2:7120", True)
    assert admin_address({"leader": None, "nodes": NODES}) == ("10.0.0.1:7120", False)
    assert admin_address({"leader": {"id": "3", "http": None}, "nodes": []}) is None


REPORT = {
    "ranges": [
        {"stream": "s", "index": 0, "start": 0, "end": 10, "state": "sealed", "wanted": 3,
         "healthy": 2, "under_replicated": True, "repairing": True,
         "replicas": [{"id": "a", "health": "healthy", "reason": None},
                      {"id": "b", "health": "unavailable", "reason": "down"}]},
        {"stream": "s", "index": 1, "start": 10, "end": None, "state": "open", "wanted": 3,
         "healthy": 3, "under_replicated": False, "repairing": False, "replicas": []}],
    "repair": {"leader": True, "under_replicated": 1, "in_progress": 1, "planned": 2,
               "deferred": 0, "draining": ["b"], "open_ranges_rolled": 0, "skipped": []},
}


def test_summary_and_rows() -> None:
    line = summary(REPORT, from_leader=True)
    assert line == ("1 ranges under-replicated; repairs in progress 1, planned 2, "
                    "deferred 0; draining b")
    assert summary(REPORT, from_leader=False).endswith("(not from the PD leader: no repair "
                                                       "runs there)")
    first, second = rows(REPORT)
    assert first == ("s", 0, "0..10", "sealed", "2/3", "a healthy, b unavailable (down)",
                     "repairing")
    assert second[2] == "10.." and second[6] == ""


def test_skipped_ranges_with_each_replica_judged_and_the_rest_counted() -> None:
    assert skip_lines(REPORT) == []
    repair = {**REPORT["repair"], "skipped_omitted": 7, "skipped": [  # type: ignore[dict-item]
        {"stream": "s", "stream_id": 4, "index": 0, "reason": "no target",
         "replicas": ["a: healthy", "b: unavailable (silent 12000 ms)"]}]}
    assert skip_lines({**REPORT, "repair": repair}) == [
        "repair skips s range 0: no target (a: healthy, b: unavailable (silent 12000 ms))",
        "repair skips 7 more ranges"]


def test_http_errors_are_typed() -> None:
    body = '{"error": {"code": "UNAUTHENTICATED", "message": "needs a token"}}'
    error = http_error(401, body, "http://h/v1/ranges")
    assert isinstance(error, Unauthenticated) and "needs a token" in error.message
    assert isinstance(http_error(400, "{}", "u"), InvalidArgument)
    assert isinstance(http_error(503, "not json", "u"), Unavailable)
    assert "not json" in http_error(503, "not json", "u").message
