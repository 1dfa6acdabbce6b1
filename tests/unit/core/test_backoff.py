"""estream/core/backoff.py: the bounded doubling waits, and that the loops moved onto it
keep their exact old waits (the formulas they had are restated here)."""

from __future__ import annotations

from itertools import islice

import pytest

from estream.core.backoff import backoff_delay, delays
from estream.devcluster.up import RESTART_DELAY_S_MAX, RESTART_DELAY_S_MIN, restart_delay_s
from pd.offload import retry_backoff_ms_max, retry_backoff_ms_min, retry_delay_ms


def test_doubles_from_low_and_stops_at_high() -> None:
    assert [backoff_delay(n, 100, 1_000) for n in range(-1, 7)] == [
        100, 100, 100, 200, 400, 800, 1_000, 1_000]
    assert backoff_delay(10**6, 0.5, 10.0) == 10.0  # no overflow after very many failures
    assert isinstance(backoff_delay(3, 100, 1_000), int)


def test_delays_iterates_the_same_waits() -> None:
    assert list(islice(delays(3, 20), 5)) == [3, 6, 12, 20, 20]


@pytest.mark.parametrize("failures", [*range(-1, 40), 10**4])
def test_offload_and_restart_waits_are_unchanged(failures: int) -> None:
    shift = min(max(failures - 1, 0), 16)
    assert retry_delay_ms(failures) == min(retry_backoff_ms_max, retry_backoff_ms_min << shift)
    if failures < 1000:  # the old float formula overflowed past that
        assert restart_delay_s(failures) == min(
            RESTART_DELAY_S_MIN * 2.0 ** max(failures - 1, 0), RESTART_DELAY_S_MAX)
