#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when they are missing. Idempotent.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # headless: tests the /ui console
command -v promtool >/dev/null 2>&1 || need+=(prometheus)  # promtool: checks /metrics and alert rules
# systemd-analyze verifies deploy/systemd's units. Installing the package in a container
# only unpacks it: it does not become PID 1 (that is systemd-sysv) and starts nothing.
command -v kcat >/dev/null 2>&1 || need+=(kcat)  # the Kafka gateway's tests: a real Kafka client
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
