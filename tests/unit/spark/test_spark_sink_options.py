"""The Spark sink's option safety: unknown options refused by name (as the source does),
and executors mode refusing to fall back to the shared sink id "default"."""

from __future__ import annotations

import pytest

from estream.spark.options import SINK_OPTIONS, SinkOptions, check_executors_sink_id
from estream.wire.errors import InvalidArgument

PD = {"pd": "h:1"}


def test_every_documented_sink_option_is_known() -> None:
    opts = SinkOptions.parse({
        **PD, "stream": "s", "sinkId": "q1", "checkpointLocation": "/c", "mode": "executors",
        "keyColumn": "k", "streams": "4", "createStreams": "false", "replicas": "3",
        "ackCount": "2", "digest": "crc32c", "connectTimeoutSeconds": "3", "tlsCa": "/ca",
        "tokenFile": "/t", "secretFile": "/s", "path": "ignored",
    })
    assert (opts.sink_id, opts.key_streams, opts.digest) == ("q1", 4, "crc32c")
    # Spark's option names are case-insensitive.
    assert SinkOptions.parse({"PD": "h:1", "STREAM": "s", "SinkID": "q"}).sink_id == "q"


def test_an_unknown_option_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(InvalidArgument) as caught:
        SinkOptions.parse({**PD, "stream": "s", "sinkID": "q", "ackcount": "1",
                           "replica": "1"})
    message = caught.value.message
    assert "'replica'" in message and "did you mean 'replicas'" in message
    assert all(name in message for name in SINK_OPTIONS)
    assert caught.value.fields["argument"] == "replica"
    with pytest.raises(InvalidArgument, match="'topic'"):  # a Kafka sink habit
        SinkOptions.parse({**PD, "topic": "s"})
    with pytest.raises(InvalidArgument, match="'startingOffsets'"):  # a source option
        SinkOptions.parse({**PD, "stream": "s", "startingOffsets": "earliest"})


def test_executors_mode_needs_a_sink_id_or_a_checkpoint_location() -> None:
    check_executors_sink_id({**PD, "sinkId": "q1"})
    check_executors_sink_id({**PD, "checkpointLocation": "/ckpt/q1"})
    for options in ({**PD}, {**PD, "sinkId": "  "}, {**PD, "checkpointLocation": ""}):
        with pytest.raises(InvalidArgument, match="'sinkId'") as caught:
            check_executors_sink_id(options)
        assert caught.value.fields["argument"] == "sinkId"
    # Driver mode keeps its fallback (one writer per stream; a stream written by one query).
    assert SinkOptions.parse({**PD, "stream": "s"}).sink_id == "default"


def test_the_sink_writer_checks_both_at_construction() -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    from estream.spark.sink import EstreamStreamWriter

    schema = StructType([StructField("value", BinaryType())])
    with pytest.raises(InvalidArgument, match="sinkId"):
        EstreamStreamWriter({**PD, "stream": "s", "mode": "executors"}, schema)
    assert EstreamStreamWriter({**PD, "stream": "s", "mode": "executors",
                                "checkpointLocation": "/c"}, schema).mode == "executors"
    assert EstreamStreamWriter({**PD, "stream": "s"}, schema).mode == "driver"
    routed = StructType([StructField("value", BinaryType()), StructField("stream", StringType())])
    with pytest.raises(InvalidArgument, match="sinkId"):  # routed rows: executors by default
        EstreamStreamWriter({**PD}, routed)
    with pytest.raises(InvalidArgument, match="unknown option 'sinkid2'"):
        EstreamStreamWriter({**PD, "stream": "s", "sinkid2": "q"}, schema)


def test_header_maps_of_other_values_and_null_values_are_refused() -> None:
    """map<string,binary> headers were stored as the Python repr of the bytes, a null value
    as the text 'None'; a value column of another type was refused without naming it."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    from estream.spark.sink import _row_of, check_schema

    def schema(value: object, headers: object) -> StructType:
        return StructType([StructField("value", value), StructField("headers", headers)])

    check_schema(schema(BinaryType(), MapType(StringType(), StringType())))
    with pytest.raises(InvalidArgument, match="map<string,binary>"):
        check_schema(schema(BinaryType(), MapType(StringType(), BinaryType())))
    with pytest.raises(InvalidArgument, match="'value': int"):
        check_schema(schema(IntegerType(), MapType(StringType(), StringType())))
    with pytest.raises(InvalidArgument, match="to null"):
        _row_of({"value": b"v", "headers": {"a": None, "b": "1"}}, has_headers=True)
    assert _row_of({"value": b"v", "headers": {"b": "1"}}, has_headers=True) == (
        b"v", (("b", "1"),))
