"""deploy/: every manifest parses, and every command line in it is accepted by the real CLI.

There is no container engine or systemd here, so each command (systemd ExecStart, compose
command, Kubernetes container script, the TOML configs) is run through ``estream ...
--check-config``: the CLI parses every flag, env variable and config key and exits 0.
"""

from __future__ import annotations

import configparser
import os
import shlex
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory whose ``estream`` runs the real CLI with ``--check-config`` appended."""
    bin_dir = tmp_path_factory.mktemp("bin")
    script = bin_dir / "estream"
    script.write_text(
        f"#!/bin/sh\ncd {shlex.quote(str(ROOT))}\n"
        f'exec {shlex.quote(sys.executable)} -m estream.cli.main "$@" --check-config\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ESTREAM_")}
    env.update(extra)
    return env


def check(argv: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=30, env=env or clean_env(), check=False
    )
    assert result.returncode == 0, f"{argv}: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def load_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def test_every_toml_and_yaml_parses() -> None:
    tomls = sorted(DEPLOY.rglob("*.toml"))
    yamls = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    assert len(tomls) >= 4 and len(yamls) >= 4
    for path in tomls:
        assert tomllib.loads(path.read_text()), path
    for path in yamls:
        assert load_yaml(path), path


@pytest.mark.parametrize("name", ["pd-0.toml", "pd-1.toml", "pd-2.toml"])
def test_pd_configs_are_accepted(shim: Path, name: str) -> None:
    config = DEPLOY / "config" / name
    out = check([str(shim / "estream"), "pd", "--config", str(config)])
    doc = tomllib.loads(config.read_text())
    assert f'listen = "{doc["listen"]}"' in out
    assert f'peers = "{doc["peers"]}"' in out


def test_rangeserver_config_is_accepted_and_env_overrides(shim: Path) -> None:
    config = DEPLOY / "config" / "rangeserver.toml"
    out = check([str(shim / "estream"), "rangeserver", "--config", str(config)])
    assert 'listen = "rs-0.estream.internal:7130"' in out
    assert "wal_spares = 4" in out, "production keeps spare log segments"
    env = clean_env(ESTREAM_LISTEN="rs-9.estream.internal:7130")
    out = check([str(shim / "estream"), "rangeserver", "--config", str(config)], env)
    assert 'listen = "rs-9.estream.internal:7130"' in out


@pytest.mark.parametrize(
    ("unit", "config"),
    [("estream-pd.service", "pd-0.toml"), ("estream-rangeserver.service", "rangeserver.toml")],
)
def test_systemd_units(shim: Path, unit: str, config: str) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(DEPLOY / "systemd" / unit)
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    assert parser["Service"]["Restart"] == "on-failure"
    argv = shlex.split(parser["Service"]["ExecStart"])
    assert argv[0] == "/opt/estream/bin/estream"
    argv[0] = str(shim / "estream")
    argv = [str(DEPLOY / "config" / config) if a.startswith("/etc/estream/") else a for a in argv]
    check(argv)


def test_compose_runs_three_pd_and_three_range_servers(shim: Path) -> None:
    (compose,) = load_yaml(DEPLOY / "docker" / "docker-compose.yml")
    services = compose["services"]
    pds = [s for s in services.values() if s["command"][0] == "pd"]
    servers = [s for s in services.values() if s["command"][0] == "rangeserver"]
    assert len(pds) == 3 and len(servers) == 3
    for service in pds + servers:
        assert service["volumes"], service
        out = check([str(shim / "estream"), *service["command"]])
        assert "data_dir" in out
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["estream"]' in dockerfile
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source


def _k8s_docs() -> list[dict[str, Any]]:
    return [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in load_yaml(p)]


def test_k8s_statefulsets_have_pvcs_headless_services_and_probes() -> None:
    docs = _k8s_docs()
    headless = {
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"
    }
    sets = [d for d in docs if d["kind"] == "StatefulSet"]
    assert {s["metadata"]["name"] for s in sets} == {"estream-pd", "estream-rs"}
    for sts in sets:
        assert sts["spec"]["serviceName"] in headless
        assert sts["spec"]["replicas"] == 3
        assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        container = sts["spec"]["template"]["spec"]["containers"][0]
        assert "readinessProbe" in container
    pd = next(s for s in sets if s["metadata"]["name"] == "estream-pd")
    probe = pd["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("ordinal", [0, 1, 2])
def test_k8s_container_commands_are_accepted(shim: Path, ordinal: int) -> None:
    for sts in (d for d in _k8s_docs() if d["kind"] == "StatefulSet"):
        container = sts["spec"]["template"]["spec"]["containers"][0]
        name = sts["metadata"]["name"]
        env = clean_env(
            HOSTNAME=f"{name}-{ordinal}",
            PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
            **{e["name"]: e["value"] for e in container.get("env", [])},
        )
        out = check(list(container["command"]), env)
        key = "listen" if name == "estream-pd" else "advertise"
        assert f'{key} = "{name}-{ordinal}.{name}.estream.svc.cluster.local:' in out
        if name == "estream-pd":
            others = [i for i in range(3) if i != ordinal]
            peers = ",".join(
                f"estream-pd-{i}.estream-pd.estream.svc.cluster.local:7110" for i in others
            )
            assert f'peers = "{peers}"' in out
            assert f'id = "{ordinal}"' in out
        else:
            assert "estream-pd-2.estream-pd.estream.svc.cluster.local:7100" in out
