"""``estream up --tls``: a local cluster with TLS on every port and a token, made once in
``DATA_DIR/tls`` (estream/devcluster/certs.py) and kept across restarts; clients with the
CA and the token work, clients without are refused with one line."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from estream.devcluster.pd import http_json
from estream.devcluster.upcluster import UpCluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpCluster]:
    tmp = tmp_path_factory.mktemp("up-tls")
    cluster = UpCluster(tmp / "data", tmp / "up.out", pd_nodes=1, range_servers=3,
                        extra_args=["--tls"])
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def cli(up: UpCluster, *args: str, env: dict[str, str], stdin: str = ""
        ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ESTREAM_")}
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", up.pd, "--timeout", "5", *args],
        input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**clean, **env})


def test_clients_with_the_ca_and_token_work(up: UpCluster) -> None:
    tls = up.data_dir / "tls"
    out = up.output()
    assert f"ESTREAM_TLS_CA={tls / 'ca.pem'}" in out and "admin API:     https://" in out
    env = {"ESTREAM_TLS_CA": str(tls / "ca.pem"), "ESTREAM_TOKEN_FILE": str(tls / "token")}
    assert cli(up, "stream", "create", "secure", env=env).returncode == 0
    assert cli(up, "append", "secure", env=env, stdin="a\nb\n").returncode == 0
    assert cli(up, "read", "secure", env=env).stdout == "a\nb\n"
    assert oct((tls / "token").stat().st_mode & 0o777) == "0o600"
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    admin = up.plan.admin_urls[0].replace("http://", "https://")
    status, body = http_json(admin + "/v1/streams/secure", context=context)
    assert status == 200 and body["name"] == "secure"


def test_clients_without_them_are_refused(up: UpCluster) -> None:
    no_token = cli(up, "stream", "list", env={
        "ESTREAM_TLS_CA": str(up.data_dir / "tls" / "ca.pem")})
    assert no_token.returncode == 1 and "Traceback" not in no_token.stderr
    plain = cli(up, "stream", "list", env={})
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1


def test_a_restart_keeps_the_certificates(up: UpCluster) -> None:
    ca = (up.data_dir / "tls" / "ca.pem").read_bytes()
    up.stop()
    up.start()
    assert (up.data_dir / "tls" / "ca.pem").read_bytes() == ca
    env = {"ESTREAM_TLS_CA": str(up.data_dir / "tls" / "ca.pem"),
           "ESTREAM_TOKEN_FILE": str(up.data_dir / "tls" / "token")}
    assert cli(up, "read", "secure", env=env).stdout == "a\nb\n"
