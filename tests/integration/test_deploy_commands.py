"""deploy/'s command lines and monitoring files, run through the real tools.

There is no container engine or running systemd here, so each command (systemd ExecStart,
compose command, Kubernetes container script, the TOML configs) is run through ``estream
... --check-config``: the CLI parses every flag, env variable and config key and exits 0.
``systemd-analyze verify`` checks the units with a real binary path; ``promtool`` checks the
alert rules, the scrape config and the rules' unit tests (the alerts fire).
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

from tests.system_tools import require_tool

pytestmark = pytest.mark.integration

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


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=30, env=env or clean_env(), check=False
    )
    assert result.returncode == 0, f"{argv}: {result.stdout}{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def check(argv: list[str], env: dict[str, str] | None = None) -> str:
    return run(argv, env).stdout


def load_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


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
    assert 'http = "rs-0.estream.internal:7140"' in out
    env = clean_env(ESTREAM_LISTEN="rs-9.estream.internal:7130")
    out = check([str(shim / "estream"), "rangeserver", "--config", str(config)], env)
    assert 'listen = "rs-9.estream.internal:7130"' in out


def test_check_config_warns_about_the_development_secret_and_open_ports(
        shim: Path, tmp_path: Path) -> None:
    base = [str(shim / "estream"), "pd", "--id", "0", "--listen", "10.1.2.3:7100",
            "--raft", "10.1.2.3:7110", "--peers", "10.1.2.4:7110,10.1.2.5:7110",
            "--http", "10.1.2.3:7120", "--data-dir", str(tmp_path / "pd")]
    warned = run(base).stderr
    assert "PUBLIC development secret" in warned and "no --token-file" in warned
    (tmp_path / "password").write_text("a-real-secret\n")
    (tmp_path / "tokens").write_text("a-real-token\n")
    quiet = run([*base, "--password-file", str(tmp_path / "password"),
                 "--token-file", str(tmp_path / "tokens")]).stderr
    assert "warning" not in quiet, quiet
    loopback = run([str(shim / "estream"), "pd", "--id", "0", "--listen", "127.0.0.1:7100",
                    "--raft", "127.0.0.1:7110", "--peers", "127.0.0.1:7111",
                    "--http", "127.0.0.1:7120", "--data-dir", str(tmp_path / "pd")]).stderr
    assert "warning" not in loopback, "a loopback development cluster needs no secrets"
    rs = run([str(shim / "estream"), "rangeserver", "--listen", "0.0.0.0:7130",
              "--data-dir", str(tmp_path / "rs")]).stderr
    assert "no --token-file" in rs


@pytest.mark.parametrize(
    ("unit", "config"),
    [("estream-pd.service", "pd-0.toml"), ("estream-rangeserver.service", "rangeserver.toml")],
)
def test_systemd_units_run_and_verify(shim: Path, tmp_path: Path, unit: str,
                                      config: str) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(DEPLOY / "systemd" / unit)
    assert {"Unit", "Service", "Install"} <= set(parser.sections())
    argv = shlex.split(parser["Service"]["ExecStart"])
    assert argv[0] == "/opt/estream/bin/estream"
    argv[0] = str(shim / "estream")
    argv = [str(DEPLOY / "config" / config) if a.startswith("/etc/estream/") else a for a in argv]
    check(argv)
    analyze = require_tool("systemd-analyze", package="systemd")
    text = (DEPLOY / "systemd" / unit).read_text()
    copy = tmp_path / unit
    copy.write_text(text.replace("/opt/estream/bin/estream", str(shim / "estream")))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "Unknown key" not in result.stderr and "Unknown lvalue" not in result.stderr, (
        result.stderr)


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
        assert 'token_file = "/etc/estream/secrets/tokens"' in out
        if name == "estream-pd":
            others = [i for i in range(3) if i != ordinal]
            peers = ",".join(
                f"estream-pd-{i}.estream-pd.estream.svc.cluster.local:7110" for i in others
            )
            assert f'peers = "{peers}"' in out
            assert f'id = "{ordinal}"' in out
            assert 'password_file = "***"' in out, "set, and masked by --check-config"
        else:
            assert "estream-pd-2.estream-pd.estream.svc.cluster.local:7100" in out
            assert 'http = "0.0.0.0:7140"' in out


def test_alert_rules_and_scrape_config_pass_promtool_and_fire_in_its_rule_tests() -> None:
    promtool = require_tool("promtool", package="prometheus")
    prometheus = DEPLOY / "prometheus"
    for args in (["check", "rules", "alerts.yml"], ["check", "config", "prometheus.yml"],
                 ["test", "rules", "alerts_test.yml"]):
        result = subprocess.run([promtool, *args], cwd=prometheus, capture_output=True,
                                text=True, timeout=60, check=False)
        assert result.returncode == 0, f"promtool {args}: {result.stdout}{result.stderr}"
        assert "SUCCESS" in result.stdout + result.stderr


def test_the_kafka_gateways_command_lines_are_accepted(shim: Path, tmp_path: Path) -> None:
    """systemd's, compose's and Kubernetes' ``estream kafka`` through the real CLI."""
    pd = "pd-0.estream.internal:7100,pd-1.estream.internal:7100"
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read(DEPLOY / "systemd" / "estream-kafka.service")
    argv = shlex.split(parser["Service"]["ExecStart"])
    assert argv[0] == "/opt/estream/bin/estream"
    out = check([str(shim / "estream"), *argv[1:]], clean_env(ESTREAM_PD=pd))
    assert 'token_file = "/etc/estream/tokens"' in out and f'pd = "{pd}"' in out
    analyze = require_tool("systemd-analyze", package="systemd")
    copy = tmp_path / "estream-kafka.service"
    copy.write_text((DEPLOY / "systemd" / "estream-kafka.service").read_text().replace(
        "/opt/estream/bin/estream", str(shim / "estream")))
    result = subprocess.run([analyze, "verify", str(copy)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and "Unknown" not in result.stderr, result.stderr
    (compose,) = load_yaml(DEPLOY / "docker" / "docker-compose.yml")
    out = check([str(shim / "estream"), *compose["services"]["kafka"]["command"]])
    assert 'advertise = "127.0.0.1:9092"' in out
    (deployment,) = [d for d in _k8s_docs() if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = clean_env(PATH=f"{shim}{os.pathsep}{os.environ['PATH']}",
                    **{e["name"]: e["value"] for e in container.get("env", [])})
    out = check(list(container["command"]), env)
    assert 'advertise = "estream-kafka.estream.svc.cluster.local:9092"' in out
    assert 'token_file = "/etc/estream/secrets/tokens"' in out
