"""Which repairs the PD leader's repair loop tells operators of, and how loudly.

Every replica a repair sets out to fix is counted by reason
(``estream_repair_replicas_total{reason}``, :mod:`pd.shell.repairer`). A replica dead,
damaged, sealed elsewhere or short is news: a warning. A repair of replicas that are only
absent from their servers' last listing, copied in place, is mostly a listing that missed a
replica made meanwhile (the copy finds it there): a soak made thousands, so they are
:func:`routine` and logged at debug.

Pure: no I/O.
"""

from __future__ import annotations

from pd.repair import REASON_ABSENT, RepairTask


def routine(task: RepairTask) -> bool:
    """Whether ``task`` only copies absent replicas in place (logged at debug).

    >>> t = RepairTask("s", 1, 0, 0, 9, 1, ("a", "b"), ("a",), ("absent",), ("a",), ("b",))
    >>> from dataclasses import replace
    >>> routine(t), routine(replace(t, reasons=("dead",))), routine(replace(t, targets=("c",)))
    (True, False, False)
    """
    return (bool(task.reasons) and all(r == REASON_ABSENT for r in task.reasons)
            and task.new_replicas == task.replicas)
