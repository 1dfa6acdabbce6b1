"""Compressed Kafka batches that expand past what a batch may hold (estream/kafka/records.py):
refused as InvalidArgument without the gateway holding what they expand to. A zstd frame
of 64 KiB expands to 2 GiB: decompressed whole, a few of them in one Produce request take
the gateway's memory (and a CPU for about a minute each). Each bomb is decoded in a child
process, whose peak resident memory is its own to read."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import estream

CHILD = textwrap.dedent('''
    import resource, struct, sys
    import cramjam, crc32c
    from estream.kafka import records as kr
    from estream.wire.errors import InvalidArgument

    def bomb(kind):
        if kind == kr.COMPRESSION_SNAPPY:  # raw snappy by hand: a literal, then copies of 64
            n = 8 * 1024 * 1024
            return _uvarint(1 + 64 * n) + b"\\x00\\x00" + b"\\xfe\\x01\\x00" * n
        zeros = bytes(64 * 1024 * 1024)
        one = bytes((cramjam.zstd if kind == kr.COMPRESSION_ZSTD else cramjam.lz4)
                    .compress(zeros))
        return one * 8  # frames one after another: 512 MiB

    def _uvarint(v):
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        return bytes(out)

    def batch(kind, body):
        head = bytearray(kr.encode_producer_batch((kr.KafkaRecord(0, None, b"v", ()),))[
            :kr.BATCH_HEADER_BYTES])
        struct.pack_into(">i", head, 8, kr.BATCH_HEADER_BYTES - 12 + len(body))
        struct.pack_into(">h", head, 21, kind)
        struct.pack_into(">I", head, 17, crc32c.crc32c(bytes(head[21:]) + body))
        return bytes(head) + body

    frames = [batch(k, bomb(k)) for k in (kr.COMPRESSION_ZSTD, kr.COMPRESSION_LZ4,
                                         kr.COMPRESSION_SNAPPY)]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused = 0
    for frame in frames:
        try:
            kr.decode_batches(frame)
        except InvalidArgument:
            refused += 1
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(refused, grown // 1024)
''')


def test_compression_bombs_are_refused_within_the_batch_bound() -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(estream.__file__).parents[1])}  # (this tree)
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=300, check=True, env=env).stdout.split()
    refused, grown_mib = int(out[0]), int(out[1])
    assert refused == 3
    # Each expands to 512 MiB; bounded, at most a batch's 64 MiB (and its copy) is held.
    assert grown_mib < 200, f"decoding grew the process by {grown_mib} MiB"
