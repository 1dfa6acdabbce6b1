"""Spark source options (estream/spark/options.py): unknown and Kafka-only options are
errors naming the option; time starts and their precedence; maxOffsetsPerTrigger."""

from __future__ import annotations

import pytest

from estream.spark.options import KAFKA_ONLY_OPTIONS, SOURCE_OPTIONS, SourceOptions
from estream.wire.errors import InvalidArgument

BASE = {"pd": "h:1", "streams": "a,b"}


@pytest.mark.parametrize(("option", "hint"), [
    ("startingOffset", "did you mean 'startingOffsets'"),
    ("startingTimestamps", "did you mean 'startingTimestamp'"),
    ("maxRecordPerTrigger", "did you mean 'maxRecordsPerTrigger'"),
    ("colour", "its options are: pd, streams"),
])
def test_an_unknown_option_is_named_with_the_known_ones(option: str, hint: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        SourceOptions.parse({**BASE, option: "1"})
    assert repr(option) in info.value.message and hint in info.value.message
    assert info.value.fields["argument"] == option


@pytest.mark.parametrize("option", KAFKA_ONLY_OPTIONS)
def test_kafka_options_estream_does_not_implement_are_refused(option: str) -> None:
    with pytest.raises(InvalidArgument, match="Kafka source is not supported"):
        SourceOptions.parse({**BASE, option: "1"})


def test_every_known_option_parses_case_insensitively() -> None:
    values = {"startingOffsets": "earliest", "endingOffsets": "latest",
              "startingOffsetsByTimestamp": '{"a": 5}', "tlsCa": "", "tlsCert": "",
              "tlsKey": "", "tokenFile": "", "secretFile": "", "failOnDataLoss": "true",
              "path": "x"}
    options = {k.upper(): values.get(k, "7") for k in SOURCE_OPTIONS}
    options.update({"PD": "h:1", "STREAMS": "a,b"})
    del options["STREAMPATTERN"]  # exclusive with streams
    opts = SourceOptions.parse(options)
    assert opts.max_records_per_trigger == 7 and opts.starting_timestamp == 7


def test_max_offsets_per_trigger_is_max_records_per_trigger() -> None:
    assert SourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "9"}).max_records_per_trigger == 9
    same = {**BASE, "maxOffsetsPerTrigger": "9", "maxRecordsPerTrigger": "9"}
    assert SourceOptions.parse(same).max_records_per_trigger == 9
    with pytest.raises(InvalidArgument, match="disagree"):
        SourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "9", "maxRecordsPerTrigger": "8"})


def test_starting_times_and_their_precedence() -> None:
    assert SourceOptions.parse(BASE).starting_times() == {}
    both = SourceOptions.parse({**BASE, "startingTimestamp": "1000",
                                "startingOffsetsByTimestamp": '{"a": 5}'})
    assert both.starting_times() == {"a": 1000, "b": 1000}  # startingTimestamp wins
    by = SourceOptions.parse({**BASE, "startingOffsetsByTimestamp": '{"b": 5}'})
    assert by.starting_times() == {"b": 5}  # "a" follows startingOffsets


@pytest.mark.parametrize("bad", [
    {"startingTimestamp": "noon"},
    {"startingOffsetsByTimestamp": "[1]"},
    {"startingOffsetsByTimestamp": '{"a": "soon"}'},
    {"startingOffsetsByTimestamp": '{"c": 1}'},  # not in 'streams'
])
def test_bad_time_starts_are_refused(bad: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        SourceOptions.parse({**BASE, **bad})
