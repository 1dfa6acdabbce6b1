#!/usr/bin/env bash
# `make test`: the whole suite in two lanes at once.
#
# The real-process tiers (tests/integration, tests/chaos) mostly wait: on processes starting,
# elections, fsyncs, sockets; they keep about 0.9 of a core busy on the 2-core CI machine. The
# pure tiers (tests/unit, tests/fuzz, tests/sim: codecs, state machines, the simulator in
# virtual time) only compute, about two minutes of one core. Run beside the first, they leave
# the suite's critical path (its 25-minute budget). Nothing in the pure lane binds a port or
# starts a process, and nothing in either lane times a CPU (tests/conftest.py: property tests
# have no deadline).
#
# The pure lane's output is printed after the real-process lane's; the exit status is
# non-zero if either lane failed. Arguments go to the real-process lane's pytest, which runs every
# test folder but the pure ones.
set -uo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
pure_log=$(mktemp "${TMPDIR:-/tmp}/estream-pure-lane.XXXXXX")

"$python" -m pytest tests/unit tests/fuzz tests/sim -p no:cacheprovider --durations=15 \
    >"$pure_log" 2>&1 &
pure=$!
# An interrupted run (Ctrl-C, a CI time-out's SIGTERM) stops the pure lane too.
trap 'kill -TERM "$pure" 2>/dev/null; wait "$pure" 2>/dev/null; rm -f "$pure_log"' EXIT

# Everything but the pure tiers (a new test folder runs here unless added to the pure lane).
"$python" -m pytest tests --ignore=tests/unit --ignore=tests/fuzz --ignore=tests/sim "$@"
real_status=$?
wait "$pure"
pure_status=$?

echo
echo "================ the pure lane: tests/unit tests/fuzz tests/sim ================"
cat "$pure_log"
echo "lanes: tests/integration + tests/chaos exit ${real_status}; tests/unit + tests/fuzz + tests/sim exit ${pure_status}"
if [ "$real_status" -ne 0 ]; then exit "$real_status"; fi
exit "$pure_status"
