"""The relationships between estream's limits: what must fit in what."""

from __future__ import annotations

from typing import Final

from estream.wire import limits
from estream.wire.protocol import FRAME_PREFIX_BYTES
from estream.wire.record import BATCH_HEADER_BYTES, RECORD_PREFIX_BYTES
from rangeserver.shell.linuxaio import BLOCK_BYTES
from rangeserver.walformat import ENTRY_HEADER_BYTES

# The largest msgpack header a batch-carrying request or response needs in practice.
CONTROL_HEADER_BYTES_MAX: Final = 4 * limits.KiB


def test_units() -> None:
    assert limits.KiB == 1024 and limits.MiB == 1024 * 1024


def test_every_limit_is_a_positive_int() -> None:
    names = [n for n in dir(limits) if not n.startswith("_") and n[0].islower()]
    assert names, "limits module lost its constants"
    for name in names:
        value = getattr(limits, name)
        if isinstance(value, int):
            assert value > 0, name


def test_a_maximal_batch_fits_in_a_frame_with_its_header() -> None:
    assert (
        FRAME_PREFIX_BYTES + CONTROL_HEADER_BYTES_MAX + limits.batch_bytes_max
        <= limits.frame_bytes_max
    )


def test_a_maximal_batch_fits_in_one_direct_log_write() -> None:
    """After the log's last partial block and padded to whole blocks
    (``rangeserver/shell/directwriter.py``)."""
    block = BLOCK_BYTES
    assert ENTRY_HEADER_BYTES + limits.batch_bytes_max + 2 * block <= limits.wal_write_bytes_max


def test_a_read_answer_fits_in_a_frame() -> None:
    assert (
        FRAME_PREFIX_BYTES + CONTROL_HEADER_BYTES_MAX + limits.read_bytes_max
        <= limits.frame_bytes_max
    )


def test_a_read_answer_can_carry_a_maximal_batch() -> None:
    # A read returns whole batches, so the largest one must fit in one answer.
    assert limits.batch_bytes_max <= limits.read_bytes_max


def test_frame_header_fits_in_a_frame() -> None:
    assert FRAME_PREFIX_BYTES + limits.frame_header_bytes_max <= limits.frame_bytes_max


def test_a_maximal_record_fits_in_a_batch() -> None:
    assert (
        BATCH_HEADER_BYTES
        + RECORD_PREFIX_BYTES
        + limits.record_headers_bytes_max
        + 5 + limits.record_key_bytes_max  # an extended head's marker and key length
        + limits.record_value_bytes_max
        <= limits.batch_bytes_max
    )


def test_batch_records_max_fits_its_u32_field_and_the_batch() -> None:
    assert limits.batch_records_max < 2**32
    assert BATCH_HEADER_BYTES + limits.batch_records_max * RECORD_PREFIX_BYTES <= (
        limits.batch_bytes_max
    )


def test_writer_batches_fit_the_batch_limit() -> None:
    assert limits.writer_batch_bytes <= limits.batch_bytes_max
    assert limits.writer_inflight_bytes_max >= limits.batch_bytes_max
    assert limits.writer_inflight_batches_max >= 2  # pipelining needs more than one batch


def test_connection_inflight_holds_at_least_one_maximal_frame() -> None:
    assert limits.connection_inflight_bytes_max >= limits.frame_bytes_max
    assert limits.connection_inflight_bytes_max >= limits.writer_inflight_bytes_max


def test_chase_backlog_holds_at_least_one_maximal_batch() -> None:
    assert limits.chase_backlog_bytes_max >= limits.batch_bytes_max


def test_storage_sizes() -> None:
    assert limits.segment_bytes_max >= limits.batch_bytes_max
    assert limits.cache_bytes_max >= limits.read_bytes_max
    assert limits.cache_bytes_max >= limits.batch_bytes_max
    assert limits.range_bytes_max >= limits.batch_bytes_max


def test_times() -> None:
    assert limits.linger_ms < limits.request_timeout_ms
    assert limits.connect_timeout_ms <= limits.request_timeout_ms
    assert limits.heartbeat_interval_ms * 2 <= limits.server_suspect_after_ms
    assert limits.chase_backlog_ms_max < limits.request_timeout_ms
    assert limits.read_wait_ms_max >= limits.request_timeout_ms


def test_an_early_batch_is_smaller_than_a_full_one_and_fits_the_budget() -> None:
    assert limits.writer_early_batch_bytes <= limits.writer_batch_bytes
    assert limits.writer_early_batches <= limits.writer_inflight_batches_max
