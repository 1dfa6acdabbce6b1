"""The PD launcher's command lines: ``--new-cluster`` (an empty node may stand for
election) only when asked for, i.e. at a new cluster's first start, never on a restart."""

from __future__ import annotations

from pathlib import Path

from estream.devcluster.pd import PdNodeProcess


def node() -> PdNodeProcess:
    return PdNodeProcess(id="1", rpc="127.0.0.1:7100", raft="127.0.0.1:7200",
                         http="127.0.0.1:7300", data_dir=Path("/nonexistent/pd1"),
                         peers=["127.0.0.1:7201"], log_path=Path("/nonexistent/pd1.log"),
                         extra_args=["--log-level", "INFO"])


def test_a_restart_is_never_a_new_cluster() -> None:
    assert "--new-cluster" not in node().args()


def test_a_first_start_says_new_cluster_after_the_node_flags() -> None:
    args = node().args(new_cluster=True)
    assert args[-3:] == ["--log-level", "INFO", "--new-cluster"]
