"""The history checker on hand-made histories: each rule catches what it should."""

from __future__ import annotations

from tests.chaos.history import History, Outcome, StripedRange, check


def _good() -> History:
    h = History()
    for i in range(5):
        h.ack("w1", b"v%d" % i, i)
    h.fail("w1", b"x", "Timeout", unknown=True)
    h.final = [(i, b"v%d" % i) for i in range(5)]
    h.readers = {"r1": h.final[:3], "r2": h.final[2:]}
    h.replicas = {0: {"s1": h.final[:3], "s2": h.final[:3]}}
    return h


def test_good_history_passes_with_figures() -> None:
    verdict = check(_good())
    assert verdict.ok, verdict.violations
    assert (verdict.acknowledged, verdict.unknown, verdict.lost, verdict.duplicates) == (5, 1, 0, 0)
    assert verdict.sealed_ranges_compared == 1
    assert "lost=0" in verdict.summary()


def test_lost_acknowledged_record() -> None:
    h = _good()
    h.final = h.final[:4]
    h.readers = {}
    verdict = check(h)
    assert verdict.lost == 1
    assert any(v.startswith("lost: b'v4'") for v in verdict.violations)


def test_acknowledged_record_at_another_offset_is_lost() -> None:
    h = _good()
    h.final[1], h.final[2] = (1, b"v2"), (2, b"v1")
    h.readers = {}
    verdict = check(h)
    assert verdict.lost == 2


def test_duplicate_is_reported() -> None:
    h = _good()
    h.final.append((5, b"v4"))
    verdict = check(h)
    assert verdict.duplicates == 1
    assert any("duplicate" in v for v in verdict.violations)


def test_failed_write_present_once_is_fine_twice_is_not() -> None:
    h = _good()
    h.final.append((5, b"x"))
    verdict = check(h)
    assert verdict.ok and verdict.failed_present == 1
    h.final.append((6, b"x"))
    assert check(h).duplicates == 1


def test_gap_in_offsets() -> None:
    h = _good()
    h.final = [*h.final, (7, b"x")]
    verdict = check(h)
    assert any("not contiguous" in v for v in verdict.violations)


def test_final_read_must_start_at_start_offset() -> None:
    h = _good()
    h.start_offset = 1
    assert any("expected 1, read 0" in v for v in check(h).violations)


def test_reader_saw_other_order() -> None:
    h = _good()
    h.readers["r3"] = [(0, b"v0"), (1, b"v2")]
    verdict = check(h)
    assert any(v.startswith("reader r3: saw b'v2' at 1") for v in verdict.violations)


def test_reader_skipped_or_repeated_offset() -> None:
    h = _good()
    h.readers["r3"] = [(0, b"v0"), (2, b"v2"), (2, b"v2")]
    problems = check(h).violations
    assert "reader r3: offset 2 after 0" in problems
    assert "reader r3: offset 2 after 2" in problems


def test_sealed_replicas_differ() -> None:
    h = _good()
    h.replicas[0]["s3"] = [(0, b"v0"), (1, b"other")]
    verdict = check(h)
    assert verdict.violations == ("sealed range 0: replica s3 differs from s1 (2 vs 3 records)",)


def test_short_replica_is_a_prefix_but_two_complete_copies_are_needed() -> None:
    h = _good()
    h.replicas[0]["s3"] = h.final[:2]
    assert check(h).ok
    h.replicas[0]["s2"] = h.final[:1]
    assert check(h).violations == (
        "sealed range 0: only 1 complete copies (3 records), expected 2",
    )


def test_single_replica_answer_is_not_compared() -> None:
    h = _good()
    h.replicas[1] = {"s1": [(3, b"v3")]}
    assert check(h).sealed_ranges_compared == 1


def test_phantom_value() -> None:
    h = _good()
    h.final.append((5, b"never"))
    assert any(v.startswith("phantom") for v in check(h).violations)


def test_offset_acknowledged_to_two_values() -> None:
    h = _good()
    h.ack("w2", b"other", 4)
    assert any("acknowledged twice" in v for v in check(h).violations)


def test_trimmed_acknowledged_records_are_not_lost() -> None:
    h = _good()
    h.start_offset = 2
    h.final = h.final[2:]
    h.readers = {}
    h.replicas = {}
    assert check(h).ok


def test_outcomes_are_counted() -> None:
    h = History()
    h.fail("w", b"a", "Unavailable")
    h.fail("w", b"b", "Timeout", unknown=True)
    verdict = check(h)
    assert (verdict.failed, verdict.unknown, verdict.acknowledged) == (1, 1, 0)
    assert [a.outcome for a in h.appends] == [Outcome.FAILED, Outcome.UNKNOWN]


def test_delivery_deadline_flags_late_and_untyped_appends() -> None:
    h = _good()
    h.delivery_deadline_s = 13.0
    h.ack("w1", b"v5", 5, elapsed_s=2.0)
    h.final.append((5, b"v5"))
    h.readers = {}
    assert check(h).ok
    h.fail("w1", b"slow", "Timeout", unknown=True, elapsed_s=13.5)
    h.fail("w1", b"odd", "KeyError", elapsed_s=0.1, typed=False)
    verdict = check(h)
    assert verdict.late == 2
    assert any(v.startswith("late: b'slow'") for v in verdict.violations)
    assert any(v.startswith("untyped error: b'odd'") for v in verdict.violations)
    assert "late=2" in verdict.summary()


def test_no_delivery_deadline_no_delivery_check() -> None:
    h = _good()
    h.fail("w1", b"slow", "Timeout", unknown=True, elapsed_s=600.0)
    assert check(h).ok


def _striped() -> StripedRange:
    """A sealed range of E 5, R 3, A 2 with 4 batches of 2 records: each on its write set,
    batch 1 on only A of it (one copy never made, e.g. a server that failed)."""
    batches = [[(2 * k, b"v%d" % (2 * k)), (2 * k + 1, b"v%d" % (2 * k + 1))] for k in range(4)]
    held = {k: {f"s{(k + i) % 5}": batches[k] for i in range(3)} for k in range(4)}
    del held[1]["s3"]
    return StripedRange(batches=4, acks=2, held=held)


def test_a_striped_range_is_judged_per_batch_not_as_prefixes() -> None:
    """No striped server holds a prefix of the range, yet the range is whole: each batch
    on A servers of its write set, alike, the batches' offsets following."""
    h = _good()
    h.striped = {1: _striped()}
    verdict = check(h)
    assert verdict.ok, verdict.violations
    assert verdict.sealed_ranges_compared == 2


def test_a_striped_batch_short_of_its_copies_or_differing_or_missing() -> None:
    few = _striped()
    del few.held[1]["s2"]  # type: ignore[attr-defined]
    differ = _striped()
    differ.held[2]["s2"] = [(4, b"v4"), (5, b"other")]  # type: ignore[index]
    missing = _striped()
    del missing.held[3]  # type: ignore[attr-defined]
    moved = _striped()
    moved.held[2] = {s: [(5, b"v5"), (6, b"v6")] for s in moved.held[2]}  # type: ignore[index]
    expected = {"few": "batch 1 held by ['s1'], expected 2 copies",
                "differ": "batch 2 differs between servers",
                "missing": "batch 3 held by [], expected 2 copies",
                "moved": "batch 2 starts at 5, the batch before it ends at 4"}
    for name, striped in [("few", few), ("differ", differ), ("missing", missing),
                          ("moved", moved)]:
        h = _good()
        h.striped = {1: striped}
        violations = check(h).violations
        assert any(expected[name] in v for v in violations), (name, violations)
