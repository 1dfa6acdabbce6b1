"""The ``estream`` command: dispatches to the server processes and the user commands.

``estream rangeserver ...`` runs :mod:`rangeserver.shell.cli`, ``estream pd ...`` runs
:mod:`pd.shell.cli`, ``estream kafka ...`` runs the Kafka gateway
:mod:`estream.kafka.shell.cli`, ``estream up ...`` runs the local-cluster supervisor
:mod:`estream.devcluster.up`; everything else is a user command over the SDK
(:mod:`estream.cli.user`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def _hypothesis_hidden() -> Iterator[None]:
    """Import the Kafka gateway without hypothesis: kio imports it, if installed, only to
    register test strategies for its types (``kio.static._phantom``, on every kio import),
    which was about half of the gateway's import time (0.6 of 1.2 s on a loaded 2-core
    machine). ``None`` in ``sys.modules`` makes that import fail as if hypothesis were
    absent, which kio handles; the entry is removed afterwards (a later import of
    hypothesis works; kio's types just have no strategies in this process)."""
    if "hypothesis" in sys.modules:
        yield
        return
    sys.modules["hypothesis"] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if "hypothesis" in sys.modules and sys.modules["hypothesis"] is None:
            del sys.modules["hypothesis"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "rangeserver":
        from rangeserver.shell.cli import main as rangeserver_main

        return rangeserver_main(args[1:])
    if args and args[0] == "pd":
        from pd.shell.cli import main as pd_main

        return pd_main(args[1:])
    if args and args[0] == "kafka":
        with _hypothesis_hidden():
            from estream.kafka.shell.cli import main as kafka_main

        return kafka_main(args[1:])
    if args and args[0] == "certs":
        from estream.devcluster.certs import main as certs_main

        return certs_main(args[1:])
    if args and args[0] == "up":
        from estream.devcluster.up import main as up_main

        return up_main(args[1:])
    from estream.cli.user import main as user_main

    return user_main(args)


if __name__ == "__main__":
    sys.exit(main())
