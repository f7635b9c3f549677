#!/usr/bin/env bash
# HAProxy, the router of `chatcache cluster` (tests/serve/test_cluster.py).
# Installs it from Debian's packages when this machine lacks it; the test fails without it.
set -euo pipefail
if ! command -v haproxy >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy
fi
