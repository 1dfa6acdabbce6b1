#!/usr/bin/env bash
# Installs the Debian packages the tests need, only when they are missing. Idempotent.
set -euo pipefail
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # headless: tests the /ui console
command -v promtool >/dev/null 2>&1 || need+=(prometheus)  # promtool: checks /metrics and alert rules
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
