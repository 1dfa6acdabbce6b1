"""Which repairs the PD leader's repair loop tells operators of, how loudly, and in what
words.

Every replica a repair sets out to fix is counted by reason
(``estream_repair_replicas_total{reason}``, :mod:`pd.shell.repairer`). A replica dead,
damaged, sealed elsewhere or short is news: a warning. A repair of replicas that are only
absent from their servers' last listing, copied in place, is mostly a listing that missed a
replica made meanwhile (the copy finds it there): a soak made thousands, so they are
:func:`routine` and logged at debug (a range not sealed yet when the listing was asked for
is no longer judged by it: :class:`pd.replicareports.ServerListing`). So is a SEAL in place
of a replica whole but open: mostly a heartbeat sent between PD's seal and the writer's own
SEAL, which reaches it anyway (a nemesis run logged 44 such warnings on healthy servers).

A task fixes each missing replica either on a new server or on its own (its target is
itself: sealed, healed or copied in place, dropped first when ``drop_first`` names it);
:func:`describe` says which, so an in-place SEAL never reads "replacing b with b".

Pure: no I/O.
"""

from __future__ import annotations

from pd.repair import REASON_ABSENT, REASON_UNSEALED, RepairTask


def routine(task: RepairTask) -> bool:
    """Whether ``task`` only copies absent replicas in place or SEALs whole open ones there
    (logged at debug).

    >>> t = RepairTask("s", 1, 0, 0, 9, 1, ("a", "b"), ("a",), ("absent",), ("a",), ("b",))
    >>> from dataclasses import replace
    >>> routine(t), routine(replace(t, reasons=("dead",))), routine(replace(t, targets=("c",)))
    (True, False, False)
    >>> routine(replace(t, reasons=("unsealed",)))
    True
    """
    return (bool(task.reasons) and all(r in _ROUTINE for r in task.reasons)
            and task.new_replicas == task.replicas)


_ROUTINE = frozenset({REASON_ABSENT, REASON_UNSEALED})


def describe(task: RepairTask) -> str:
    """What ``task`` does to each replica it fixes, for the repair log.

    >>> t = RepairTask("s", 1, 0, 0, 9, 1, ("a", "b", "c"), ("c", "b", "a"),
    ...                ("dead", "unsealed", "missealed"), ("d", "b", "a"), ("b",), ("a",))
    >>> print(*describe(t).split("; "), sep=chr(10))
    replacing c (dead) with d
    sealing b in place (unsealed)
    dropping a and copying it again in place (missealed)
    >>> describe(RepairTask("s", 1, 0, 0, 9, 1, ("a", "b"), ("a",), ("absent",), ("a",), ("b",)))
    'copying a in place (absent)'
    """
    drop = set(task.drop_first)
    parts = []
    for missing, reason, target in zip(task.missing, task.reasons, task.targets, strict=False):
        if target != missing:
            parts.append(f"replacing {missing} ({reason}) with {target}")
        elif missing in drop:
            parts.append(f"dropping {missing} and copying it again in place ({reason})")
        elif reason == REASON_UNSEALED:
            parts.append(f"sealing {missing} in place ({reason})")
        else:
            parts.append(f"copying {missing} in place ({reason})")
    return "; ".join(parts) or "nothing"
