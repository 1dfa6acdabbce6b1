"""A writer process for the recovery test: appends forever, printing every offset it saw
acknowledged as ``ACK <offset> <value>``; the test kills it with SIGKILL."""

from __future__ import annotations

import asyncio
import sys

import estream


async def main(pd: str, stream: str) -> None:
    client = await estream.connect(pd)
    writer = await client.open_writer(stream)
    print("OPEN", writer.epoch, flush=True)

    async def one(i: int) -> None:
        value = f"dead-writer-{i}".encode()
        offset = await writer.append(value)
        sys.stdout.write(f"ACK {offset} {value.decode()}\n")

    i = 0
    for _ in range(10_000):  # bounded: the test kills it long before
        await asyncio.gather(*(one(i + k) for k in range(50)))
        sys.stdout.flush()
        i += 50
        await asyncio.sleep(0.002)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
