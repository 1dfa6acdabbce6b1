"""The one process launcher: real PD nodes and range servers on loopback.

``estream up`` (:mod:`up`, a foreground supervisor), the tests and the benchmarks all start
estream processes through this package, one way each:

- command lines: :mod:`cmdline` (``pd_args``, ``rangeserver_args``, ``up_args``);
- a child: :mod:`process` (:class:`~estream.devcluster.process.ManagedProcess`, readiness
  by :func:`~estream.devcluster.process.poll_until`, stopped by PID with
  :func:`~estream.devcluster.process.stop_processes`; ``run_cli`` for a short command);
- one kind each: :mod:`pd` and :mod:`rangeserver`; a whole cluster with its faults (pause,
  wipe, crash, heal; a proxy per range server if the caller brings one): :mod:`cluster`;
  ``estream up`` as a child: :mod:`upcluster`;
- around them: :mod:`certs` (throw-away PKI), :mod:`seaweed` (an S3 server), :mod:`spark`
  (a local Spark session). Fault tools (the fault proxy, log damage) are test code in
  ``tests/harness``: the wheel ships none.
"""
