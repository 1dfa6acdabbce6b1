"""Reading docs/PROTOCOL.md's message tables, for the tests that check them against the
typed messages (test_pdmessages.py, test_rangemessages.py)."""

from __future__ import annotations

import re


def top_level_names(cell: str) -> set[str]:
    """The quoted names at the first level of ``{...}``, outside parentheses."""
    names, depth, parens = set(), 0, 0
    for match in re.finditer(r'[{}()\[\]]|"([^"]*)"', cell):
        token = match[0]
        if token in "{[":
            depth += 1
        elif token in "}]":
            depth -= 1
        elif token == "(":
            parens += 1
        elif token == ")":
            parens -= 1
        elif depth == 1 and not parens:
            names.add(match[1])
    return names
