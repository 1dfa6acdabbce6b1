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
# The pure tiers take a few minutes; the second lane then runs the real-process modules listed
# in `late` below (self-contained ones: each starts its own cluster), which the first lane
# leaves out. The two lanes' test processes take separate port ranges (ESTREAM_PORT_SLICE,
# estream/devcluster/process.py), so neither can take a port the other checked free.
#
# The second lane's output is printed after the first's; the exit status is non-zero if either
# lane failed. Arguments go to both lanes' real-process pytest runs.
set -uo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
second_log=$(mktemp "${TMPDIR:-/tmp}/estream-second-lane.XXXXXX")

late=(
    tests/integration/test_up.py
    tests/integration/test_operate.py
    tests/integration/test_pd_cluster.py
    tests/integration/test_kafka.py
    tests/integration/test_rangeserver.py
    tests/integration/test_writer_faults.py
    tests/integration/test_console.py
    tests/integration/test_cli.py
    tests/integration/test_cli_ranges.py
    tests/integration/test_kafka_groups.py
    tests/integration/test_object_tier.py
    tests/integration/test_striped_reads.py
    tests/integration/test_object_reads.py
    tests/integration/test_resource_exhaustion.py
    tests/integration/test_pd_commit_rule.py
    tests/integration/test_object_damage.py
    tests/integration/test_deploy_commands.py
)
ignore_late=()
for module in "${late[@]}"; do ignore_late+=("--ignore=$module"); done

second_lane() {
    # Each pytest runs as a child this shell waits for, so a SIGTERM (the trap below) stops
    # the one running, not only this shell.
    local child pure_status late_status
    trap 'kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit 143' TERM
    ESTREAM_PORT_SLICE=1/2 "$python" -m pytest tests/unit tests/fuzz tests/sim \
        -p no:cacheprovider --durations=15 &
    child=$!
    wait "$child"
    pure_status=$?
    ESTREAM_PORT_SLICE=1/2 "$python" -m pytest "${late[@]}" -p no:cacheprovider "$@" &
    child=$!
    wait "$child"
    late_status=$?
    echo "second lane: tests/unit + tests/fuzz + tests/sim exit ${pure_status}; ${#late[@]} late modules exit ${late_status}"
    [ "$pure_status" -eq 0 ] && [ "$late_status" -eq 0 ]
}
second_lane "$@" >"$second_log" 2>&1 &
second=$!
# An interrupted run (Ctrl-C, a CI time-out's SIGTERM) stops the second lane too.
trap 'kill -TERM "$second" 2>/dev/null; wait "$second" 2>/dev/null; rm -f "$second_log"' EXIT

# Everything but the pure tiers and the late modules (a new test folder runs here unless added
# to the pure lane).
ESTREAM_PORT_SLICE=0/2 "$python" -m pytest tests --ignore=tests/unit --ignore=tests/fuzz \
    --ignore=tests/sim "${ignore_late[@]}" "$@"
real_status=$?
wait "$second"
second_status=$?

echo
echo "================ the second lane: tests/unit tests/fuzz tests/sim, then the late modules ================"
cat "$second_log"
echo "lanes: first (real processes) exit ${real_status}; second exit ${second_status}"
if [ "$real_status" -ne 0 ]; then exit "$real_status"; fi
exit "$second_status"
