"""``estream up --tls``: a local cluster with TLS on every port and a token, made once in
``DATA_DIR/tls`` (estream/devcluster/certs.py) and kept across restarts; clients with the
CA and the token work, clients without are refused with one line."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from estream.devcluster.certs import ensure_cluster_tls
from estream.devcluster.pd import http_json
from estream.devcluster.upcluster import UpCluster
from estream.net.security import parse_tokens
from tests.system_tools import require_tool

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(up=True, pd_nodes=1, range_servers=3, extra_args=["--tls"])]
ROOT = Path(__file__).resolve().parents[2]


def cli(up: UpCluster, *args: str, env: dict[str, str], stdin: str = ""
        ) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ESTREAM_")}
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", up.pd, "--timeout", "5", *args],
        input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**clean, **env})


def test_clients_with_the_ca_and_token_work(cluster: UpCluster) -> None:
    tls = cluster.data_dir / "tls"
    out = cluster.output()
    assert f"ESTREAM_TLS_CA={tls / 'ca.pem'}" in out and "admin API:     https://" in out
    env = {"ESTREAM_TLS_CA": str(tls / "ca.pem"), "ESTREAM_TOKEN_FILE": str(tls / "token")}
    assert cli(cluster, "stream", "create", "secure", env=env).returncode == 0
    assert cli(cluster, "append", "secure", env=env, stdin="a\nb\n").returncode == 0
    assert cli(cluster, "read", "secure", env=env).stdout == "a\nb\n"
    assert oct((tls / "token").stat().st_mode & 0o777) == "0o600"
    context = ssl.create_default_context(cafile=str(tls / "ca.pem"))
    admin = cluster.plan.admin_urls[0].replace("http://", "https://")
    status, body = http_json(admin + "/v1/streams/secure", context=context)
    assert status == 200 and body["name"] == "secure"


# In make chaos (12 s): test_security.py's refusals (no CA, no token, a bad one) stay.
@pytest.mark.slow
def test_clients_without_them_are_refused(cluster: UpCluster, tmp_path: Path) -> None:
    no_token = cli(cluster, "stream", "list", env={
        "ESTREAM_TLS_CA": str(cluster.data_dir / "tls" / "ca.pem")})
    assert no_token.returncode == 1 and "Traceback" not in no_token.stderr
    assert "ESTREAM_TOKEN_FILE" in no_token.stderr and "--token-file" in no_token.stderr
    # Told it is TLS and what to set, not that it reached a Raft port.
    plain = cli(cluster, "stream", "list", env={})
    assert plain.returncode == 1 and len(plain.stderr.strip().splitlines()) == 1
    assert "serves TLS" in plain.stderr and "ESTREAM_TLS_CA" in plain.stderr, plain.stderr
    assert "Raft" not in plain.stderr
    other = ensure_cluster_tls(tmp_path / "other", ["127.0.0.1"])
    wrong_ca = cli(cluster, "stream", "list", env={"ESTREAM_TLS_CA": str(other.ca)})
    assert wrong_ca.returncode == 1 and "Raft" not in wrong_ca.stderr
    assert "does not verify against the CA" in wrong_ca.stderr, wrong_ca.stderr


def kafka_security(cluster: UpCluster, token: str | None = None) -> dict[str, str]:
    """confluent-kafka settings for the cluster's gateway: SASL_SSL with ``token`` as the
    PLAIN password, or (None) SSL with the client certificate."""
    tls = cluster.data_dir / "tls"
    common = {"bootstrap.servers": cluster.plan.kafka_addresses,
              "ssl.ca.location": str(tls / "ca.pem")}
    if token is None:
        return {**common, "security.protocol": "SSL",
                "ssl.certificate.location": str(tls / "client.pem"),
                "ssl.key.location": str(tls / "client.key")}
    return {**common, "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
            "sasl.username": "operator", "sasl.password": token}


def test_the_kafka_gateway_serves_sasl_ssl_and_client_certificates(cluster: UpCluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    tls = cluster.data_dir / "tls"
    token = parse_tokens((tls / "token").read_text())[0]
    assert f"kafka: {cluster.plan.kafka_addresses}" in cluster.output()
    admin = AdminClient(kafka_security(cluster, token))
    admin.create_topics([NewTopic("ktls", 1)])["ktls"].result(30)
    producer = Producer({**kafka_security(cluster, token), "acks": "all"})
    reports: list[object] = []
    producer.produce("ktls", b"over-sasl-ssl", key=b"k", partition=0,
                     on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(30) == 0 and reports == [None]
    by_cert = Producer({**kafka_security(cluster), "acks": "all"})  # role client: may write
    by_cert.produce("ktls", b"by-certificate", partition=0,
                    on_delivery=lambda e, m: reports.append(e))
    assert by_cert.flush(30) == 0 and reports == [None, None]
    kcat = require_tool("kcat", package="kcat")
    read = subprocess.run(
        [kcat, "-b", cluster.plan.kafka_addresses, "-X", "security.protocol=SASL_SSL",
         "-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=u", "-X", f"sasl.password={token}",
         "-X", f"ssl.ca.location={tls / 'ca.pem'}", "-t", "ktls", "-p", "0", "-C", "-e",
         "-o", "beginning", "-f", "%o|%k|%s\\n"],
        capture_output=True, timeout=60, check=False)
    assert read.returncode == 0, read.stderr.decode()
    assert read.stdout.decode().splitlines() == ["0|k|over-sasl-ssl", "1||by-certificate"]
    # Without SASL (TLS alone, no certificate): nothing is served, the gateway goes on.
    consumer = Consumer({"bootstrap.servers": cluster.plan.kafka_addresses,
                         "security.protocol": "SSL", "ssl.ca.location": str(tls / "ca.pem"),
                         "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition("ktls", 0, 0)])
        assert all(m is None or m.error() is not None
                   for m in (consumer.poll(0.5) for _ in range(4)))
    finally:
        consumer.close()
    env = {"ESTREAM_TLS_CA": str(tls / "ca.pem"), "ESTREAM_TOKEN_FILE": str(tls / "token")}
    assert cli(cluster, "read", "ktls-0", env=env).stdout == "over-sasl-ssl\nby-certificate\n"


# About 8 s: in `make chaos` (the suite's time); test_up's restart that keeps the data runs in
# every `make test`. Its own stream: `make chaos` (-m slow) runs none of the tests above that
# make one.
@pytest.mark.slow
def test_a_restart_keeps_the_certificates(cluster: UpCluster) -> None:
    tls = cluster.data_dir / "tls"
    env = {"ESTREAM_TLS_CA": str(tls / "ca.pem"), "ESTREAM_TOKEN_FILE": str(tls / "token")}
    assert cli(cluster, "stream", "create", "kept", env=env).returncode == 0
    assert cli(cluster, "append", "kept", env=env, stdin="a\nb\n").returncode == 0
    ca = (tls / "ca.pem").read_bytes()
    cluster.stop()
    cluster.start()
    assert (tls / "ca.pem").read_bytes() == ca
    read = cli(cluster, "read", "kept", env=env)
    assert (read.returncode, read.stdout) == (0, "a\nb\n"), read.stderr
