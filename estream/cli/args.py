"""Argument types the user commands share: each turns one command-line word into a value
or an ``argparse.ArgumentTypeError`` (a usage error: exit 2, one line). Pure."""

from __future__ import annotations

import argparse


def offset_arg(text: str) -> int:
    """An offset: an integer, 0 or more (offsets start at 0)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected an offset (an integer >= 0), got {text!r}")
    return int(text)


def count_arg(text: str) -> int:
    """A count of records: an integer, 0 or more."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a count (an integer >= 0), got {text!r}")
    return int(text)


def positive_arg(text: str) -> int:
    """A positive integer (a limit, a size)."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)
