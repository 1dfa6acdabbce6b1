"""tests/system_tools.py: a missing Debian tool fails a test in CI and skips it elsewhere."""

from __future__ import annotations

import pytest

from tests import system_tools
from tests.system_tools import in_ci, missing_tool_message, require_tool


@pytest.mark.parametrize(("value", "expected"), [
    (None, False), ("", False), ("0", False), ("false", False), ("true", True),
    ("1", True), ("TRUE", True)])
def test_ci_is_any_true_looking_value(value: str | None, expected: bool) -> None:
    assert in_ci({} if value is None else {"CI": value}) is expected


def test_the_message_names_the_package_and_says_why() -> None:
    assert "make system-deps" in missing_tool_message(("promtool",), "prometheus", False)
    in_ci_text = missing_tool_message(("chromium", "google-chrome"), "chromium", True)
    assert "chromium or google-chrome" in in_ci_text and "CI is set" in in_ci_text


def test_a_missing_tool_fails_in_ci_and_skips_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_tools.shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        require_tool("promtool", package="prometheus")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="skipped outside CI"):
        require_tool("promtool", package="prometheus")


def test_a_present_tool_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system_tools.shutil, "which",
                        lambda name: "/usr/bin/b" if name == "b" else None)
    assert require_tool("a", "b", package="x") == "/usr/bin/b"
