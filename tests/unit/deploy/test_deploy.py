"""deploy/: every file parses, and says what an operator relies on (no process started).

Kubernetes: PodDisruptionBudgets, one pod per host and zone spread, the Secret's files on
the command lines, startup/liveness on /healthz and readiness on /readyz, requests and
limits. systemd: no restart loop on exit 2, hardening. Monitoring: every metric the alert
rules and the Grafana dashboard name is one the code exports. Running the command lines,
promtool and systemd-analyze: tests/integration/test_deploy_commands.py.
"""

from __future__ import annotations

import configparser
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"


def load_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_docs() -> list[dict[str, Any]]:
    return [d for p in sorted((DEPLOY / "k8s").glob("*.yaml")) for d in load_yaml(p)]


def statefulsets() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in k8s_docs() if d["kind"] == "StatefulSet"}


def systemd_unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    parser.read(DEPLOY / "systemd" / name)
    return parser


def test_every_toml_yaml_and_json_parses() -> None:
    tomls = sorted(DEPLOY.rglob("*.toml"))
    yamls = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    jsons = sorted(DEPLOY.rglob("*.json"))
    assert len(tomls) >= 4 and len(yamls) >= 7 and jsons
    for path in tomls:
        assert tomllib.loads(path.read_text()), path
    for path in yamls:
        assert load_yaml(path), path
    for path in jsons:
        assert json.loads(path.read_text()), path


def test_k8s_statefulsets_have_pvcs_headless_services_and_probes() -> None:
    docs = k8s_docs()
    headless = {d["metadata"]["name"] for d in docs
                if d["kind"] == "Service" and d["spec"].get("clusterIP") == "None"}
    sets = statefulsets()
    assert set(sets) == {"estream-pd", "estream-rs"}
    for sts in sets.values():
        assert sts["spec"]["serviceName"] in headless
        assert sts["spec"]["replicas"] == 3
        assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
        container = sts["spec"]["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        startup = container["startupProbe"]
        assert startup["httpGet"]["path"] == "/healthz"
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "replay time"
        assert "http" in ports
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][kind]), kind
    rs = sets["estream-rs"]["spec"]["template"]["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in rs["ports"]}["http"]
    assert f"--http 0.0.0.0:{port}" in rs["command"][-1]


@pytest.mark.parametrize("name", ["estream-pd", "estream-rs"])
def test_k8s_pods_spread_over_hosts_and_zones_with_a_disruption_budget(name: str) -> None:
    spec = statefulsets()[name]["spec"]["template"]["spec"]
    (rule,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert rule["topologyKey"] == "kubernetes.io/hostname"
    assert rule["labelSelector"]["matchLabels"] == {"app": name}
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone" and spread["maxSkew"] == 1
    budgets = [d for d in k8s_docs() if d["kind"] == "PodDisruptionBudget"
               and d["spec"]["selector"]["matchLabels"] == {"app": name}]
    assert len(budgets) == 1 and budgets[0]["spec"]["maxUnavailable"] == 1


def test_k8s_secret_is_mounted_and_used_for_the_raft_password_and_tokens() -> None:
    (secret,) = [d for d in k8s_docs() if d["kind"] == "Secret"]
    assert set(secret["stringData"]) == {"raft-password", "tokens", "cluster-secret"}
    name = secret["metadata"]["name"]
    for sts_name, sts in statefulsets().items():
        spec = sts["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        container = spec["containers"][0]
        (mount,) = [m for m in container["volumeMounts"]
                    if volumes.get(m["name"], {}).get("secret", {}).get("secretName") == name]
        assert mount["readOnly"] is True
        command = container["command"][-1]
        assert f"--token-file {mount['mountPath']}/tokens" in command
        assert f"--secret-file {mount['mountPath']}/cluster-secret" in command  # members
        if sts_name == "estream-pd":
            assert f"--password-file {mount['mountPath']}/raft-password" in command


@pytest.mark.parametrize("unit", ["estream-pd.service", "estream-rangeserver.service"])
def test_systemd_units_do_not_restart_on_damage_and_are_hardened(unit: str) -> None:
    service = systemd_unit(unit)["Service"]
    assert service["Restart"] == "on-failure"
    assert service["RestartPreventExitStatus"] == "2", "damaged data: exit 2, no restart loop"
    assert service["ExecStart"].startswith("/opt/estream/bin/estream ")
    for key, value in {"NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "ReadWritePaths": "/var/lib/estream", "PrivateTmp": "yes",
                       "ProtectHome": "yes", "CapabilityBoundingSet": ""}.items():
        assert service[key] == value, key


@pytest.mark.parametrize("name", ["pd-0.toml", "pd-1.toml", "pd-2.toml", "rangeserver.toml"])
def test_configs_name_their_secret_files(name: str) -> None:
    doc = tomllib.loads((DEPLOY / "config" / name).read_text())
    assert doc["token_file"] == "/etc/estream/tokens"
    assert doc["secret_file"] == "/etc/estream/cluster-secret"  # the member credential
    if name.startswith("pd"):
        assert doc["password_file"] == "/etc/estream/raft-password"
    else:
        assert doc["http"].endswith(":7140")


def exported_metric_names() -> set[str]:
    """Every ``estream_*`` name the code registers (as written in the source), with the
    suffixes a counter or histogram adds."""
    names: set[str] = set()
    sources = [*ROOT.glob("pd/**/*.py"), *ROOT.glob("rangeserver/**/*.py"),
               *ROOT.glob("estream/**/*.py")]
    for path in sources:
        for name in re.findall(r'"(estream_[a-z0-9_]+)"', path.read_text()):
            base = name.removesuffix("_total")
            names |= {name, base + "_total", base + "_bucket", base + "_sum", base + "_count"}
    return names


def referenced_metric_names(text: str) -> set[str]:
    return set(re.findall(r"\b(estream_[a-z0-9_]+)\b", text)) - {"estream_pd", "estream_rs"}


def test_alert_rules_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_metric_names()
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
    dashboard = (DEPLOY / "grafana" / "estream-dashboard.json").read_text()
    for text in (rules, dashboard):
        missing = referenced_metric_names(text) - exported
        assert not missing, missing
    alerts = {r["alert"] for g in yaml.safe_load(rules)["groups"] for r in g["rules"]}
    assert {"EstreamPDNoLeader", "EstreamRangeServerDown", "EstreamUnderReplicatedRanges",
            "EstreamStuckWriter", "EstreamDiskNearlyFull"} <= alerts


def test_the_dashboard_has_a_datasource_variable_and_queries_in_every_panel() -> None:
    doc = json.loads((DEPLOY / "grafana" / "estream-dashboard.json").read_text())
    assert doc["uid"] and doc["title"] == "estream"
    assert [v["type"] for v in doc["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in doc["panels"]:
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]


def test_every_alert_fires_in_a_promtool_rule_test() -> None:
    """Each rule of alerts.yml has a case in alerts_test.yml where it fires (promtool runs
    them in tests/integration/test_deploy_commands.py)."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "alerts_test.yml").read_text())
    firing = {case["alertname"] for t in tests["tests"] for case in t["alert_rule_test"]
              if case["exp_alerts"]}
    assert alerts - firing == set()


def test_the_dashboard_shows_the_object_tier_and_the_reclaim_backlog() -> None:
    from pd.metrics import OFFLOAD_HELP
    from pd.shell.reclaimer import BACKLOG

    doc = json.loads((DEPLOY / "grafana" / "estream-dashboard.json").read_text())
    queried = {name for panel in doc["panels"] for t in panel["targets"]
               for name in referenced_metric_names(t["expr"])}
    wanted = set(OFFLOAD_HELP) | {BACKLOG}
    assert wanted - queried == set()


def test_the_kafka_gateway_is_deployed_like_the_servers() -> None:
    """systemd, compose and Kubernetes run ``estream kafka`` on 9092 with /metrics and
    /healthz on 7150, requiring SASL with the tokens where the others take them."""
    service = systemd_unit("estream-kafka.service")["Service"]
    assert service["ExecStart"].startswith("/opt/estream/bin/estream kafka ")
    assert "--token-file /etc/estream/tokens" in service["ExecStart"]
    assert service["Restart"] == "on-failure" and service["CapabilityBoundingSet"] == ""
    (compose,) = load_yaml(DEPLOY / "docker" / "docker-compose.yml")
    gateway = compose["services"]["kafka"]
    assert gateway["command"][0] == "kafka" and "9092:9092" in gateway["ports"]
    docs = k8s_docs()
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (svc,) = [d for d in docs if d["kind"] == "Service"
              and d["metadata"]["name"] == deployment["metadata"]["name"]]
    assert {p["port"] for p in svc["spec"]["ports"]} == {9092, 7150}
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--token-file /etc/estream/secrets/tokens" in container["command"][-1]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    (selected,) = monitor["spec"]["selector"]["matchExpressions"]
    assert deployment["metadata"]["name"] in selected["values"]
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")[0]
    assert "estream-kafka" in {job["job_name"] for job in scrape["scrape_configs"]}
