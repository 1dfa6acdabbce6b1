"""The one way to build an estream command line (``estream pd``, ``estream rangeserver``,
``estream kafka``, ``estream up``) for a child process: ``estream up``'s plan, the cluster
launcher, the tests and the benchmarks all build theirs here, so a flag is spelt in one place.

Each builder returns the arguments after the subcommand; :func:`estream_argv` puts the
interpreter and the subcommand in front (the child runs this interpreter's estream, the
same tree as the caller). Pure: builds strings only.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

ESTREAM: Final = (sys.executable, "-m", "estream.cli.main")
# ``estream pd``'s flag for the first start of a new cluster, every node empty: without it
# an empty node never stands for election. Never on a restart (a wiped node must wait for
# its peers' catalog).
NEW_CLUSTER: Final = "--new-cluster"


def estream_argv(subcommand: str, args: Sequence[str] = ()) -> list[str]:
    """``python -m estream.cli.main SUBCOMMAND ARGS...``."""
    return [*ESTREAM, subcommand, *args]


def pd_args(node_id: str, listen: str, raft: str, peers: Sequence[str], http: str,
            data_dir: Path, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """One PD node: its id, RPC, Raft and admin-HTTP addresses, the other nodes' Raft
    addresses (none for a one-node PD) and its data dir."""
    return ("--id", node_id, "--listen", listen, "--raft", raft, "--peers", ",".join(peers),
            "--http", http, "--data-dir", str(data_dir), *extra)


def rangeserver_args(listen: str, data_dir: Path, pd: str | None = None,
                     extra: Sequence[str] = ()) -> tuple[str, ...]:
    """One range server: where it listens (port 0: any; it prints ``listening on H:P``),
    the PD addresses it registers with (none: it runs alone) and its data dir."""
    return ("--listen", listen, *(("--pd", pd) if pd else ()), "--data-dir", str(data_dir),
            *extra)


def kafka_args(listen: str, pd: str, http: str | None = None,
               extra: Sequence[str] = ()) -> tuple[str, ...]:
    """One Kafka gateway: where it listens (port 0: any; it prints ``listening on H:P``),
    the PD addresses of its cluster, and where it serves /metrics and /healthz."""
    return ("--listen", listen, "--pd", pd, *(("--http", http) if http else ()), *extra)


def up_args(data_dir: Path, host: str, base_port: int, pd_nodes: int = 3,
            range_servers: int = 3, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """``estream up``: a whole local cluster under one supervisor."""
    return ("--data-dir", str(data_dir), "--host", host, "--base-port", str(base_port),
            "--pd-nodes", str(pd_nodes), "--range-servers", str(range_servers), *extra)
