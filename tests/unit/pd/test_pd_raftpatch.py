"""The pysyncobj patches: the version and every private name they rely on are pinned, and
nothing changes pysyncobj until ``install()`` (importing any PD module does not)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pd.shell import raftpatch

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_pysyncobj_is_the_pinned_version() -> None:
    installed = importlib.metadata.version("pysyncobj")
    assert installed == raftpatch.PYSYNCOBJ_VERSION, (
        f"pysyncobj {installed} is installed but pd/shell/raftpatch.py patches "
        f"{raftpatch.PYSYNCOBJ_VERSION}: check every name in PRIVATE_NAMES and PATCHED_NAMES "
        "against the new version before moving the pin")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert f"pysyncobj=={raftpatch.PYSYNCOBJ_VERSION}" in project["project"]["dependencies"]


def test_every_private_name_relied_on_exists() -> None:
    problems = raftpatch.library_mismatches()
    assert problems == [], "pysyncobj changed under PD's adapter:\n" + "\n".join(problems)


def test_the_check_reads_each_class_source_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every PD start runs the check: finding a class's source parses its module, which
    cost a second or two of CPU per start when done again for each of SyncObj's names."""
    read: list[type] = []
    getsource = raftpatch.inspect.getsource

    def counted(obj: type) -> str:
        read.append(obj)
        return getsource(obj)

    monkeypatch.setattr(raftpatch.inspect, "getsource", counted)
    raftpatch.class_source.cache_clear()
    try:
        assert raftpatch.library_mismatches() == []
    finally:
        raftpatch.class_source.cache_clear()
    assert read and len(read) == len(set(read)), read


def test_a_renamed_name_is_reported_clearly() -> None:
    assert raftpatch.missing_name("pysyncobj.syncobj", "SyncObj", "__raftLog") is None
    assert raftpatch.missing_name("pysyncobj.syncobj", "SyncObj", "_isLeader") is None
    assert raftpatch.missing_name("pysyncobj.pipe_notifier", "PipeNotifier", "__pipeW") is None
    assert raftpatch.missing_name("pysyncobj.syncobj", "SyncObj", "__raftJournal") == (
        "pysyncobj.syncobj.SyncObj no longer has '__raftJournal' (renamed by an upgrade?)")
    assert raftpatch.missing_name("pysyncobj.syncobj", "SyncObject", "_isLeader") == (
        "pysyncobj.syncobj.SyncObject is gone")


# Run in a fresh interpreter: this test process may have installed the patches already.
_PROBE = """
import importlib, json, pkgutil
import pd
import pytest

from pd.shell import raftpatch

def current():
    return {f"{m}.{n}": id(getattr(importlib.import_module(m), n))
            for m, n in raftpatch.PATCHED_NAMES}

before = current()
for info in pkgutil.walk_packages(pd.__path__, "pd."):
    importlib.import_module(info.name)
after_import = current()
raftpatch.install()
after_install = current()
raftpatch.install()
print(json.dumps({"before": before, "after_import": after_import,
                  "after_install": after_install, "again": current(),
                  "installed": raftpatch.installed()}))
"""


def test_importing_pd_changes_nothing_until_install() -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    seen = json.loads(done.stdout)
    assert seen["after_import"] == seen["before"], "importing pd modules patched pysyncobj"
    changed = [name for name in seen["before"]
               if seen["after_install"][name] != seen["before"][name]]
    assert sorted(changed) == sorted(f"{m}.{n}" for m, n in raftpatch.PATCHED_NAMES)
    assert seen["again"] == seen["after_install"] and seen["installed"]  # idempotent


def test_install_refuses_another_pysyncobj_before_patching_anything(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import pysyncobj.syncobj

    monkeypatch.setattr(raftpatch, "_installed", False)
    monkeypatch.setattr(raftpatch, "PYSYNCOBJ_VERSION", "9.9.9")
    journal_factory = pysyncobj.syncobj.createJournal
    with pytest.raises(RuntimeError, match=r"pysyncobj 0\.3\.17 is installed.*9\.9\.9"):
        raftpatch.install()
    assert pysyncobj.syncobj.createJournal is journal_factory
    assert not raftpatch.installed()
