"""Consumer-group lag as the gateway's ``/metrics`` shows it: one series per group and
partition, the partition stream's readable end minus the group's committed offset.

The series are bounded: groups are taken in name order (at most
:data:`lag_groups_max` described per refresh), their partitions in stream order, and past
:data:`lag_series_max` series the rest are counted in ``omitted``, not shown. A group's
offset on a stream not named like a partition (an SDK group's) is left out.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from estream.wire.kafkanames import parse_stream

lag_series_max: Final = 2_000  # group and partition series in one scrape
lag_groups_max: Final = 200  # groups described (one PD call each) per refresh
lag_refresh_ms_min: Final = 10_000  # scrapes closer than this reuse the last figures


@dataclass(frozen=True, slots=True)
class Lag:
    """One series: ``group``'s lag on partition ``partition`` of ``topic``."""

    group: str
    topic: str
    partition: int
    lag: int


def groups_to_describe(groups: Iterable[Mapping[str, Any]]) -> tuple[list[str], int]:
    """The names of the groups to describe (name order, at most :data:`lag_groups_max`)
    and how many are left out."""
    names = sorted(str(g["group"]) for g in groups)
    return names[:lag_groups_max], max(0, len(names) - lag_groups_max)


def group_lags(described: Iterable[Mapping[str, Any]]) -> tuple[list[Lag], int]:
    """The series of described groups (``{"group", "offsets": [{"stream", "offset",
    "end", "lag"}]}``, as PD's describe with lag answers) and the number past
    :data:`lag_series_max`::

        group_lags([{"group": "g", "offsets": [{"stream": "t-0", "lag": 3},
                                               {"stream": "plain", "lag": 1}]}])
        -> ([Lag("g", "t", 0, 3)], 0)
    """
    found: list[Lag] = []
    omitted = 0
    for group in sorted(described, key=lambda g: str(g["group"])):
        for entry in sorted(group.get("offsets") or (), key=lambda o: str(o["stream"])):
            parsed = parse_stream(str(entry["stream"]))
            if parsed is None:
                continue
            if len(found) >= lag_series_max:
                omitted += 1
                continue
            found.append(Lag(str(group["group"]), parsed[0], parsed[1],
                             max(0, int(entry["lag"]))))
    return found, omitted


__all__ = ["Lag", "group_lags", "groups_to_describe", "lag_groups_max",
           "lag_refresh_ms_min", "lag_series_max"]
