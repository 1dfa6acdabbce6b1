"""A writer process for the chaos suite: appends unique values and logs each outcome.

``python -m tests.chaos.writer_proc PD STREAM NAME LOG`` opens a writer (fencing any
earlier one) and appends ``NAME-SEQ`` values until killed, writing ``A value`` before
each append and ``K value offset`` (acknowledged) or ``F value error`` after, one flushed
line each, so a ``kill -9`` leaves a log the history can be rebuilt from.

Side effects: network calls to the cluster, the log file.
"""

from __future__ import annotations

import sys

import uvloop

appends_max = 1_000_000


async def main(pd: str, stream: str, name: str, log_path: str) -> None:
    import estream

    with open(log_path, "a", buffering=1) as log:
        async with await estream.connect(pd, timeout_s=10.0) as client:
            writer = await client.open_writer(stream)
            log.write("OPEN\n")
            for seq in range(appends_max):
                value = f"{name}-{seq}"
                log.write(f"A {value}\n")
                try:
                    offset = await writer.append(value.encode())
                except estream.EstreamError as exc:
                    log.write(f"F {value} {type(exc).__name__}\n")
                    return
                log.write(f"K {value} {offset}\n")


if __name__ == "__main__":
    uvloop.run(main(*sys.argv[1:5]))
