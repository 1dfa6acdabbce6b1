"""The one process launcher: real PD nodes and range servers on loopback.

``estream up`` (:mod:`up`, a foreground supervisor), the tests and the benchmarks all start
processes through this package: :mod:`process` (a child process stopped by PID),
:mod:`pd` and :mod:`rangeserver` (one kind each), :mod:`cluster` (a whole cluster with
fault injection: pause, wipe, damage, crash), :mod:`faultproxy` (exact interleavings).
"""
