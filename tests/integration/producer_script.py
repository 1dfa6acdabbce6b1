"""An idempotent producer process for tests/integration/test_producer.py: opens a writer
with ``producer_id``, prints ``OPEN <last_sequence>``, then appends its input (value
``s<sequence>`` for sequences ``first .. total-1``) with many appends in flight, printing
``ACK <sequence> <offset>`` for each acknowledged one; the test kills it with SIGKILL."""

from __future__ import annotations

import asyncio
import sys

import estream


async def main(pd: str, stream: str, producer: str, total: int) -> None:
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
    await writer.close()
    print("DONE", flush=True)
    await client.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
