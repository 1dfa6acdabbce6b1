"""The append delay above the disk watermark (rangeserver/pacing.py)."""

from __future__ import annotations

import doctest

from rangeserver import pacing
from rangeserver.pacing import append_delay_ms, append_delay_ms_max, append_delay_ms_min


def test_the_worked_examples() -> None:
    assert doctest.testmod(pacing).failed == 0


def test_the_delay_grows_with_the_disk_and_is_bounded() -> None:
    delays = [append_delay_ms(used=u, total=1000, watermark_percent=80) for u in range(0, 1001)]
    assert delays[:801] == [0] * 801
    assert delays == sorted(delays)
    assert delays[801] >= append_delay_ms_min and delays[-1] == append_delay_ms_max
    assert append_delay_ms(used=2000, total=1000, watermark_percent=80) == append_delay_ms_max
    assert append_delay_ms(used=5, total=0, watermark_percent=80) == 0, "no figures: no delay"
    assert append_delay_ms(used=10, total=10, watermark_percent=100) == 0
