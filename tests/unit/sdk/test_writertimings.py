"""The writer's timing seam: one typed value a client hands to its writers' shells."""

from __future__ import annotations

from pathlib import Path

from estream.core import recovery, roll
from estream.net import rangeclient
from estream.sdk.client import Client
from estream.sdk.writertimings import WRITER_TIMINGS, WriterTimings
from estream.wire import limits

ROOT = Path(__file__).resolve().parents[3]


def test_the_defaults_are_the_shells_constants() -> None:
    t = WRITER_TIMINGS
    assert t.request_timeout_ms == limits.request_timeout_ms
    assert t.fence_grace_ms == recovery.fence_grace_ms
    assert t.replica_timeouts() == rangeclient.REPLICA_TIMEOUTS
    assert t.roll_config(3) == roll.RollConfig(3)


def test_scaled_timings_reach_the_replica_client_and_the_roller() -> None:
    t = WriterTimings(request_timeout_ms=300, seal_timeout_ms=100, ping_timeout_ms=100,
                      roll_backoff_ms_min=50, roll_backoff_ms_max=400, suspect_cleared_ms=500)
    replicas = t.replica_timeouts()
    assert (replicas.request_s, replicas.seal_s, replicas.ping_s) == (0.3, 0.1, 0.1)
    config = t.roll_config(3)
    assert (config.backoff_ms_min, config.backoff_ms_max, config.suspect_cleared_ms) == (
        50, 400, 500)


def test_a_client_hands_its_writer_timings_on() -> None:
    t = WriterTimings(request_timeout_ms=300)
    client = Client("127.0.0.1:1", writer_timings=t)
    assert client.writer_timings is t
    assert client.appends.timeout_s == 0.3  # its writers' APPENDs and CONFIRMs
    assert Client("127.0.0.1:1").appends.timeout_s == limits.request_timeout_ms / 1000
