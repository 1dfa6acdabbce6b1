"""An idempotent producer process for tests/integration/test_producer.py: opens a writer
with ``producer_id``, prints ``OPEN <last_sequence>``, then appends its input (value
``s<sequence>`` for sequences ``first .. total-1``) with many appends in flight, printing
``ACK <sequence> <offset>`` for each acknowledged one; the test kills it with SIGKILL.
With a fifth argument ``stall``, after the input it prints ``STALL`` and appends sequence
``total`` without waiting for its end (the test makes only one replica take it, then
kills the process)."""

from __future__ import annotations

import asyncio
import sys

import estream


async def main(pd: str, stream: str, producer: str, total: int, stall: bool) -> None:
    client = await estream.connect(pd)
    writer = await client.open_writer(stream, producer_id=producer)
    print("OPEN", writer.last_sequence, flush=True)

    async def one(seq: int) -> None:
        offset = await writer.append(b"s%d" % seq, sequence=seq)
        sys.stdout.write(f"ACK {seq} {offset}\n")

    for first in range(0, total, 50):  # bounded: the whole input once
        await asyncio.gather(*(one(s) for s in range(first, min(first + 50, total))))
        sys.stdout.flush()
        await asyncio.sleep(0.002)
    if stall:
        print("STALL", flush=True)
        await asyncio.sleep(1.0)  # the test drops this append's copies on two replicas
        await asyncio.wait_for(writer.append(b"s%d" % total, sequence=total), 60)
    await writer.close()
    print("DONE", flush=True)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]),
                     len(sys.argv) > 5 and sys.argv[5] == "stall"))
