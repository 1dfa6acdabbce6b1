"""The streaming reader's admission and streamPattern wiring (estream/spark/source.py)
with the cluster calls replaced by fixed answers: no network, no Spark session."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import (  # noqa: E402
    ReadAllAvailable,
    ReadMaxRows,
    ReadMinRows,
)

from estream.spark import source  # noqa: E402
from estream.spark.options import SourceOptions  # noqa: E402
from estream.spark.planning import StreamBounds, match_streams  # noqa: E402
from estream.wire.errors import InvalidArgument  # noqa: E402


class FakeCluster:
    """Streams and their bounds, as the PD listing and survey would answer."""

    def __init__(self, bounds: dict[str, tuple[int, int]]) -> None:
        self.bounds = bounds

    def current(self, opts: SourceOptions) -> SourceOptions:
        if opts.stream_pattern is None:
            return opts
        return opts.known(match_streams(opts.stream_pattern, list(self.bounds)))

    def survey(self, opts: SourceOptions) -> tuple[dict[str, Any], dict[str, StreamBounds]]:
        return {}, {n: StreamBounds(*self.bounds[n]) for n in opts.streams if n in self.bounds}


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster({"o-1": (0, 10), "x": (0, 3)})
    monkeypatch.setattr(source, "current", fake.current)
    monkeypatch.setattr(source, "survey", fake.survey)
    return fake


def test_pattern_starts_present_streams_at_latest_and_new_ones_at_zero(
        cluster: FakeCluster) -> None:
    reader = source.EstreamStreamReader({"pd": "h:1", "streamPattern": r"o-\d"})
    start = reader.initialOffset()
    assert start == {"o-1": 10}
    cluster.bounds["o-2"] = (0, 4)  # created after the start
    cluster.bounds["o-1"] = (0, 12)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    assert end == {"o-1": 12, "o-2": 4}


def test_pattern_with_offsets_json_naming_a_missing_stream_is_a_clear_error(
        cluster: FakeCluster) -> None:
    reader = source.EstreamStreamReader({"pd": "h:1", "streamPattern": r"o-\d",
                                         "startingOffsets": '{"o-9": 3}'})
    with pytest.raises(InvalidArgument, match="exist and match"):
        reader.initialOffset()


def test_min_rows_hold_the_batch_unless_available_now(cluster: FakeCluster) -> None:
    options = {"pd": "h:1", "streams": "o-1", "minOffsetsPerTrigger": "100",
               "maxTriggerDelay": "1h"}
    reader = source.EstreamStreamReader(options)
    assert reader.getDefaultReadLimit() == ReadMinRows(100)
    assert reader.latestOffset({"o-1": 2}, ReadMinRows(100)) == {"o-1": 2}  # held
    assert reader.latestOffset({"o-1": 2}, ReadAllAvailable()) == {"o-1": 10}
    both = source.EstreamStreamReader({**options, "maxOffsetsPerTrigger": "200"})
    assert both.getDefaultReadLimit() == ReadMaxRows(200)  # no composite limit in PySpark
    assert both.latestOffset({"o-1": 2}, ReadMaxRows(200)) == {"o-1": 2}  # min from options
    both.prepareForTriggerAvailableNow()
    assert both.latestOffset({"o-1": 2}, ReadMaxRows(5)) == {"o-1": 7}
