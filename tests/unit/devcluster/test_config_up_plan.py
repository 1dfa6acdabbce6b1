"""`estream up`'s pure parts: the cluster plan (ports, peers, dirs) and restart backoff."""

from __future__ import annotations

from pathlib import Path

import pytest

from estream.devcluster.certs import ClusterTls
from estream.devcluster.cmdline import NEW_CLUSTER
from estream.devcluster.up import PlanError, plan_cluster, restart_delay_s
from pd.shell.cli import build_parser as pd_parser


def test_default_plan_matches_the_default_pd_addresses() -> None:
    plan = plan_cluster(Path("/d"), 3, 3, "127.0.0.1", 7100)
    assert plan.pd_addresses == "127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102"
    assert plan.admin_urls == (
        "http://127.0.0.1:7120",
        "http://127.0.0.1:7121",
        "http://127.0.0.1:7122",
    )
    pd1 = plan.pd[1]
    assert pd1.args == (
        "--id", "1", "--listen", "127.0.0.1:7101", "--raft", "127.0.0.1:7111",
        "--peers", "127.0.0.1:7110,127.0.0.1:7112", "--http", "127.0.0.1:7121",
        "--data-dir", "/d/pd-1", "--object-store", "file:///d/objects",
    )  # fmt: skip
    rs2 = plan.range_servers[2]
    assert rs2.args == (
        "--listen", "127.0.0.1:7132", "--pd", plan.pd_addresses, "--data-dir", "/d/rs-2",
        "--http", "127.0.0.1:7202",
    )  # fmt: skip


def test_every_port_is_distinct() -> None:
    plan = plan_cluster(Path("d"), 9, 70, "h", 20000)
    ports = [c.address for c in plan.children] + [c.http for c in plan.children]
    ports += [c.args[c.args.index("--raft") + 1] for c in plan.pd]
    assert len(ports) == len(set(ports)) == 9 * 3 + 70 * 2


def test_single_pd_node_has_no_peers() -> None:
    plan = plan_cluster(Path("d"), 1, 1, "h", 7100)
    args = plan.pd[0].args
    assert args[args.index("--peers") + 1] == ""


@pytest.mark.parametrize(
    ("pd", "rs", "base"), [(2, 3, 7100), (0, 3, 7100), (11, 3, 7100), (3, 0, 7100),
                           (3, 71, 7100), (3, 3, 65500)]
)  # fmt: skip
def test_bad_plans_rejected(pd: int, rs: int, base: int) -> None:
    with pytest.raises(PlanError):
        plan_cluster(Path("d"), pd, rs, "h", base)


def test_backoff_doubles_and_caps() -> None:
    delays = [restart_delay_s(n) for n in range(1, 10)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert max(delays) == 10.0
    assert delays == sorted(delays)


def test_pd_nodes_join_once_the_cluster_was_bootstrapped() -> None:
    first = plan_cluster(Path("d"), 3, 3, "127.0.0.1", 7100)
    assert all("--join" not in pd.args for pd in first.pd)  # the first start bootstraps
    later = plan_cluster(Path("d"), 3, 3, "127.0.0.1", 7100, join=True)
    assert all("--join" in pd.args for pd in later.pd)
    assert all("--join" not in rs.args for rs in later.range_servers)


def test_a_new_clusters_pd_nodes_say_new_cluster_at_their_first_start_only() -> None:
    new = plan_cluster(Path("d"), 3, 3, "127.0.0.1", 7100)
    for pd in new.pd:
        first = pd_parser().parse_args(pd.argv(first=True)[4:])  # (after `-m MODULE pd`)
        assert first.new_cluster and not first.join  # an empty node may stand: it bootstraps
        assert NEW_CLUSTER not in pd.argv()  # a restart (the supervisor's): empty, it waits
    assert not any(c.first_args for c in (*new.range_servers, *new.kafka))
    bootstrapped = plan_cluster(Path("d"), 3, 3, "127.0.0.1", 7100, join=True)
    assert all(NEW_CLUSTER not in pd.argv(first=True) for pd in bootstrapped.pd)
    alone = plan_cluster(Path("d"), 1, 3, "127.0.0.1", 7100)  # no peer to wait for anyway
    assert NEW_CLUSTER not in alone.pd[0].argv(first=True)


def test_one_kafka_gateway_at_b_plus_40_by_default() -> None:
    plan = plan_cluster(Path("/d"), 3, 3, "127.0.0.1", 7100)
    assert plan.kafka_addresses == "127.0.0.1:7140"
    (gateway,) = plan.kafka
    assert gateway.kind == "kafka" and gateway in plan.children
    assert gateway.args == ("--listen", "127.0.0.1:7140", "--pd", plan.pd_addresses,
                            "--http", "127.0.0.1:7150")
    three = plan_cluster(Path("/d"), 3, 3, "h", 7100, kafka_gateways=3)
    assert three.kafka_addresses == "h:7140,h:7141,h:7142"
    assert plan_cluster(Path("/d"), 3, 3, "h", 7100, kafka_gateways=0).kafka == ()


def test_no_kafka_gateway_where_range_servers_reach_its_port() -> None:
    plan = plan_cluster(Path("d"), 3, 11, "h", 7100)  # rs-10 listens on B+40
    assert plan.kafka == ()
    with pytest.raises(PlanError):
        plan_cluster(Path("d"), 3, 11, "h", 7100, kafka_gateways=1)
    with pytest.raises(PlanError):
        plan_cluster(Path("d"), 3, 3, "h", 7100, kafka_gateways=11)


def test_every_port_is_distinct_with_kafka_gateways() -> None:
    plan = plan_cluster(Path("d"), 9, 10, "h", 20000, kafka_gateways=10)
    ports = [c.address for c in plan.children] + [c.http for c in plan.children]
    ports += [c.args[c.args.index("--raft") + 1] for c in plan.pd]
    assert len(ports) == len(set(ports)) == 9 * 3 + 10 * 2 + 10 * 2


def test_tls_clusters_run_a_kafka_gateway_with_the_members_security() -> None:
    tls = ClusterTls(Path("/d/tls"))
    plan = plan_cluster(Path("/d"), 3, 3, "127.0.0.1", 7100, tls=tls)
    (gateway,) = plan.kafka
    assert gateway.args[:6] == ("--listen", "127.0.0.1:7140", "--pd", plan.pd_addresses,
                                "--http", "127.0.0.1:7150")
    assert gateway.args[6:] == tls.member_args()
    assert "--token-file" in gateway.args and "--tls-cert" in gateway.args


def test_up_host_is_an_ipv4_address_names_resolved() -> None:
    """``--host localhost`` never became ready (servers register as 127.0.0.1, readiness
    compared with localhost); IPv6 was printed as ``::1:P`` and reported "in use"."""
    from estream.devcluster.up import build_parser

    parser = build_parser()
    assert parser.parse_args(["--host", "localhost"]).host == "127.0.0.1"
    assert parser.parse_args(["--host", "127.0.0.3"]).host == "127.0.0.3"
    for bad in ("::1", "::"):
        with pytest.raises(SystemExit) as stop:
            parser.parse_args(["--host", bad])
        assert stop.value.code == 2
