"""estream/core/backoff.py: the bounded doubling waits, and that the loops moved onto it
keep their exact old waits (the formulas they had are restated here)."""

from __future__ import annotations

from itertools import islice

import pytest

from estream.core.backoff import backoff_delay, delays, delays_until
from estream.devcluster.up import RESTART_DELAY_S_MAX, RESTART_DELAY_S_MIN, restart_delay_s
from estream.net.pdclient import backoff_s_max, backoff_s_min
from pd.offload import retry_backoff_ms_max, retry_backoff_ms_min, retry_delay_ms


def test_doubles_from_low_and_stops_at_high() -> None:
    assert [backoff_delay(n, 100, 1_000) for n in range(-1, 7)] == [
        100, 100, 100, 200, 400, 800, 1_000, 1_000]
    assert backoff_delay(10**6, 0.5, 10.0) == 10.0  # no overflow after very many failures
    assert isinstance(backoff_delay(3, 100, 1_000), int)


def test_delays_iterates_the_same_waits() -> None:
    assert list(islice(delays(3, 20), 5)) == [3, 6, 12, 20, 20]


def test_delays_until_cuts_the_last_wait_and_ends_at_the_deadline() -> None:
    now = [10.0]
    waits = delays_until(1.0, 8.0, 17.0, lambda: now[0])
    seen = []
    for wait in waits:
        seen.append(wait)
        now[0] += wait
    assert seen == [1.0, 2.0, 4.0] and now[0] == 17.0
    assert list(delays_until(1.0, 8.0, 5.0, lambda: 5.0)) == []  # already past


def test_pd_client_waits_are_unchanged() -> None:
    """The PD client slept min(backoff, remaining), doubling backoff up to its maximum."""
    deadline, clock = 1.0, [0.0]
    old, backoff = [], backoff_s_min
    while (remaining := deadline - clock[0]) > 0:
        old.append(min(backoff, remaining))
        backoff = min(backoff * 2, backoff_s_max)
        clock[0] += old[-1]
    clock[0] = 0.0
    new = []
    for wait in delays_until(backoff_s_min, backoff_s_max, deadline, lambda: clock[0]):
        new.append(wait)
        clock[0] += wait
    assert new == old and len(new) > 3


@pytest.mark.parametrize("failures", [*range(-1, 40), 10**4])
def test_offload_and_restart_waits_are_unchanged(failures: int) -> None:
    shift = min(max(failures - 1, 0), 16)
    assert retry_delay_ms(failures) == min(retry_backoff_ms_max, retry_backoff_ms_min << shift)
    if failures < 1000:  # the old float formula overflowed past that
        assert restart_delay_s(failures) == min(
            RESTART_DELAY_S_MIN * 2.0 ** max(failures - 1, 0), RESTART_DELAY_S_MAX)
