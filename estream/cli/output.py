"""Rendering for the CLI: human tables (rich) or ``--json`` for scripts.

Side effect: writes to standard output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    """A table for people. In a narrow terminal the first column (what the row names: a
    stream, a server) keeps its width, whole; the others fold their text onto more lines
    rather than cut it."""
    cells = [["-" if cell is None else str(cell) for cell in row] for row in rows]
    result = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for i, column in enumerate(columns):
        if i == 0:
            widest = max([len(column), *(len(row[0]) for row in cells if row)])
            result.add_column(column, min_width=widest, no_wrap=True)
        else:
            result.add_column(column, overflow="fold")
    for row in cells:
        result.add_row(*row)
    return result


def print_tables(*tables: Table) -> None:
    out = console()
    for item in tables:
        out.print(item)


def key_values(title: str, values: Mapping[str, Any]) -> Table:
    return table(title, ["field", "value"], [(k, v) for k, v in values.items()])


def human_bytes(count: float | int | None) -> str:
    """``1536`` -> ``1.5 KiB``. Pure."""
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as ISO 8601 UTC, to the millisecond (``--json`` keeps
    the raw number). Pure.

    >>> iso_ms(1700000000500)
    '2023-11-14T22:13:20.500Z'
    """
    import datetime

    when = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
