"""Pure helpers of the CLI's operator commands and fixes: where ``read`` starts
(``--from``), the HTTP-port sentence, JSON errors (estream/cli/records.py, user.py)."""

from __future__ import annotations

import doctest
import json

import pytest

from estream.cli import output, records, servers, user
from estream.wire.errors import MalformedFrame, OffsetOutOfRange, Unavailable


@pytest.mark.parametrize("module", [records, output, servers])
def test_doctests(module: object) -> None:
    assert doctest.testmod(module, verbose=False).failed == 0  # type: ignore[arg-type]


def test_server_resolution_refuses_short_ambiguous_and_unknown_keys() -> None:
    from estream.wire.errors import InvalidArgument, ServerNotFound

    found = [{"id": "3f9c01", "address": "h:1"}, {"id": "3f9c02", "address": "h:2"}]
    assert servers.resolve_server("3f9c02", found)["address"] == "h:2"
    with pytest.raises(InvalidArgument, match="several"):
        servers.resolve_server("3f9c", found)
    with pytest.raises(InvalidArgument, match="too short"):
        servers.resolve_server("3f9", found)
    with pytest.raises(ServerNotFound):
        servers.resolve_server("h:3", found)


def test_start_offset_refuses_a_trimmed_offset_with_an_explanation() -> None:
    with pytest.raises(OffsetOutOfRange, match="trimmed.*first kept offset is 10"):
        records.start_offset("3", 10, 50)
    assert records.start_offset("10", 10, 50) == 10


@pytest.mark.parametrize("text", ["0", "12", "start", "end", "-3"])
def test_from_arg_accepts(text: str) -> None:
    assert records.from_arg(text) == text


def test_from_arg_refuses() -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        records.from_arg("yesterday")


def test_an_http_answer_is_named() -> None:  # the SDK's sentence, which the CLI prints
    from estream.net.portprobe import answers_http, http_port

    assert answers_http(MalformedFrame("bad frame magic 0x5448"))
    assert not answers_http(MalformedFrame("bad frame magic 0x1234"))
    assert not answers_http(Unavailable("bad frame magic 0x5448"))
    sentence = http_port(["h:1"]).message
    assert "h:1 answers HTTP" in sentence and "0x5448" not in sentence


def test_json_errors_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        user.main(["read", "s", "--from", "nope", "--json"])
    assert stop.value.code == 2
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["code"] == "USAGE" and "--from expects" in error["message"]


def test_stdin_lines_arrive_in_order_then_none() -> None:
    import asyncio
    import io

    async def read_all() -> list[bytes | None]:
        lines = records.StdinLines(io.BytesIO(b"a\nb\n\nc"), asyncio.get_running_loop())
        got: list[bytes | None] = []
        while not got or got[-1] is not None:
            got.append(await lines.get())
        return got

    assert asyncio.run(read_all()) == [b"a", b"b", b"", b"c", None]


def test_a_command_that_ends_before_stdin_does_leaves_no_coroutine_behind() -> None:
    # `estream append no-such-stream`: the loop closed while the stdin thread was handing it
    # a line; a Queue.put coroutine made for it was never awaited (a RuntimeWarning that
    # turned the one-line error into four lines).
    import asyncio
    import gc
    import threading
    import warnings
    from collections.abc import Iterator

    gate = threading.Event()

    def stdin() -> Iterator[bytes]:
        gate.wait(5)
        yield from (b"late\n", b"later\n")

    loop = asyncio.new_event_loop()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lines = records.StdinLines(stdin(), loop)  # type: ignore[arg-type]
        loop.close()
        gate.set()
        lines.thread.join(5)
        gc.collect()
    assert not lines.thread.is_alive()
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []


@pytest.mark.parametrize("argv", [
    ["read", "s", "--from", str(2**63)],
    ["read", "s", "--from-time", "99999999999999999999"],
    ["read", "s", "--to", str(2**63)],
    ["stream", "list", "--limit", "100000"],
    ["stream", "describe", "s", "--offset", str(2**63)],
])
def test_numbers_past_what_the_protocol_carries_are_usage_errors(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 2 with the argument named, before anything is sent (they were exit 1, from a
    server's refusal or a field that "cannot be sent")."""
    with pytest.raises(SystemExit) as stop:
        user.main([*argv, "--pd", "127.0.0.1:1"])
    assert stop.value.code == 2
    assert "argument --" in capsys.readouterr().err


def test_a_drain_goes_ahead_when_its_outlook_cannot_be_read(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The outlook comes from the admin API at the leader's advertised address, which a
    host reaching PD through a port mapping cannot reach: the drain (over RPC) stopped
    there, before draining anything."""
    import argparse
    import asyncio

    from estream.cli import servers
    from estream.wire.errors import Unavailable

    async def unreachable(*_: object) -> tuple[object, bool]:
        raise Unavailable("cannot read http://pd-1:7120/v1/rangeservers/rs-1")

    monkeypatch.setattr(servers, "admin_get", unreachable)
    ns = argparse.Namespace(json=False)
    assert asyncio.run(servers._outlook(None, ns, "rs-1")) == {}
    assert "cannot tell whether the drain can finish" in capsys.readouterr().err
