"""estream.wire.packing: msgpack.packb's bytes without a new 256 KiB buffer a call."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Iterator

import msgpack
import pytest

from estream.wire import packing
from estream.wire.packing import packb
from estream.wire.protocol import Opcode, encode_frame
from pd.commands import SealRange, encode_command


@pytest.fixture
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def _peak_above_current(work: object) -> int:
    """The most bytes ``work()`` had allocated at once beyond what was live before it."""
    before, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    work()  # type: ignore[operator]
    _, peak = tracemalloc.get_traced_memory()
    return peak - before


@pytest.mark.parametrize("value", [
    {"a": 1, "b": [1, 2, 3], "c": b"\x00\xff", "d": "é", "e": None, "f": 2.5},
    [], {}, 2**64 - 1, -(2**63), "x" * 70_000, b"y" * 40_000,
])
def test_same_bytes_as_msgpack_packb(value: object) -> None:
    assert packb(value) == msgpack.packb(value)
    assert packb(value) == msgpack.packb(value)  # the reused packer, the long ones a new one


def test_surrogateescape_strings() -> None:
    value = {"k": "\udcff"}
    assert packb(value, unicode_errors="surrogateescape") == msgpack.packb(
        value, unicode_errors="surrogateescape")
    with pytest.raises(UnicodeEncodeError):
        packb(value)


def test_same_errors_and_a_failed_call_leaves_nothing_behind() -> None:
    with pytest.raises(OverflowError):
        packb({"a": 2**64})
    with pytest.raises(TypeError):
        packb({"a": object()})
    assert packb({"a": 1}) == msgpack.packb({"a": 1})


def test_frame_headers_and_commands_allocate_no_packer_buffer_per_call(traced: None) -> None:
    """The leak's cause: msgpack.packb mallocs (and frees) 256 KiB for every header and
    command; glibc serves those blocks from the main heap, which grew on the PD leader."""
    seal = SealRange(name="s", epoch=2, range_index=3, end=120, next_replicas=("a", "b", "c"),
                     stream_id=7)

    def work() -> None:
        for request_id in range(20):
            encode_frame(Opcode.PING, request_id, {"stream_id": 7, "offset": request_id})
            encode_command(seal)
    work()  # this thread's packer, made once
    assert _peak_above_current(work) < 32 * 1024  # was over 256 KiB


def test_a_long_answer_does_not_leave_a_grown_buffer(traced: None) -> None:
    packb({"a": 1})
    before, _ = tracemalloc.get_traced_memory()
    long = packb(b"z" * 2_000_000)
    del long
    packb({"a": 1})
    after, _ = tracemalloc.get_traced_memory()
    assert after - before < packing.buffer_bytes + 4096


def test_threads_packing_at_once_get_their_own_bytes() -> None:
    results: list[bool] = []

    def pack_many(tag: int) -> None:
        ok = all(packb({"t": tag, "i": i, "s": "v" * (i % 50)})
                 == msgpack.packb({"t": tag, "i": i, "s": "v" * (i % 50)}) for i in range(2000))
        results.append(ok)
    threads = [threading.Thread(target=pack_many, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [True] * 4
