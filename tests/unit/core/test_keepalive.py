"""estream/core/keepalive.py: when a writer PD has not answered touches its replicas."""

from __future__ import annotations

import pytest

from estream.core.keepalive import overdue, touch_after_ms
from estream.wire import limits


@pytest.mark.parametrize(("renewed_ms", "touched_ms", "now_ms", "want"), [
    (0, None, 0, False),
    (0, None, touch_after_ms - 1, False),
    (0, None, touch_after_ms, True),
    (1_000, None, 1_000 + limits.writer_lease_ms, True),
    (0, touch_after_ms, touch_after_ms + 1, False),  # touched a moment ago
    (0, touch_after_ms, 2 * touch_after_ms, True),  # ... half a lease ago: again
])
def test_overdue(renewed_ms: int, touched_ms: int | None, now_ms: int, want: bool) -> None:
    assert overdue(renewed_ms, touched_ms, now_ms) is want


def test_half_a_lease_leaves_pd_time_to_see_the_confirm() -> None:
    assert 0 < touch_after_ms <= limits.writer_lease_ms // 2
