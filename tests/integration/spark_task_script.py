"""One executor-side task of the Spark sink in its own process, for
tests/integration/test_spark_sink_executors.py, which kills it with SIGKILL while its
appends are in flight.

``spark_task_script.py PD SINK_ID BATCH PARTITION COUNT STREAM`` runs what a Spark task of
the executors mode runs on an executor: :func:`~estream.spark.sink.write_partition` of
:func:`task_rows` ``(COUNT)`` (to ``STREAM-PARTITION``), or with ``STREAM`` of the form
``column:PREFIX`` :func:`~estream.spark.sink.write_targets` with row ``i`` routed to
:func:`task_targets` ``(PREFIX, COUNT)[i]`` (as by a ``stream`` column). It prints
``START`` before and ``DONE <stream>:<appended>:<duplicates> ...`` after, which a killed
task never prints. The rows and targets are functions of their arguments, so the test
and its retries send the very same batch.
"""

from __future__ import annotations

import sys

from estream.spark.commit import Row, make_row
from estream.spark.options import SinkOptions
from estream.spark.sink import write_partition, write_targets
from estream.spark.source import run

PAD = b"." * 80  # rows of about 100 bytes: a batch takes a while to append
TARGET_SUFFIXES = ("a", "b", "c")


def task_rows(count: int) -> list[Row]:
    """The partition's rows: value ``t<position>`` (zero-padded, padded), header ``i``."""
    return [make_row(b"t%06d" % i + PAD, {"i": str(i)}) for i in range(count)]


def task_targets(prefix: str, count: int) -> list[str]:
    """Row ``i``'s target stream, as a ``stream`` column would name it."""
    return [f"{prefix}_{TARGET_SUFFIXES[i % len(TARGET_SUFFIXES)]}" for i in range(count)]


def main(pd: str, sink_id: str, batch: int, partition: int, count: int, stream: str) -> None:
    rows = task_rows(count)
    print("START", flush=True)
    if stream.startswith("column:"):
        opts = SinkOptions.parse({"pd": pd, "sinkId": sink_id}, stream_column=True)
        routed = run(write_targets(opts, batch, partition, rows,
                                   task_targets(stream.removeprefix("column:"), count)))
        done = routed.targets
    else:
        opts = SinkOptions.parse({"pd": pd, "stream": stream, "sinkId": sink_id})
        done = (run(write_partition(opts, batch, partition, rows)),)
    print("DONE", *(f"{m.stream}:{m.appended}:{m.duplicates}" for m in done), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]),
         sys.argv[6])
