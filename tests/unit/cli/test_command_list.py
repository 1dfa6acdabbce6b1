"""``estream --help`` lists every command ``estream`` runs, the server processes included
(they are dispatched before the user parser: :mod:`estream.cli.main`)."""

from __future__ import annotations

import argparse

from estream.cli.user import build_parser

SERVER_PROCESSES = ("up", "pd", "rangeserver", "kafka", "certs")


def test_every_server_process_is_listed() -> None:
    parser = build_parser()
    commands = next(action.choices for action in parser._actions
                    if isinstance(action, argparse._SubParsersAction))
    assert set(SERVER_PROCESSES) <= set(commands)
    assert "`estream kafka`" in (parser.description or "")
