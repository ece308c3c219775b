#!/usr/bin/env bash
# A real dstack server (dstack[server]==0.22.5, the version the captures come from) in its own
# virtual environment, for tests/test_live_server.py, which starts and stops its own server on
# 127.0.0.1. Nothing is started here. Idempotent: exits at once when the venv already has that
# version. Quiet unless the install fails. DSTACK_SERVER_VENV overrides the location.
set -euo pipefail
venv="${DSTACK_SERVER_VENV:-/opt/dstack-server-venv}"
version="0.22.5"

if [ -x "$venv/bin/dstack" ] && [ "$("$venv/bin/python" -c 'import dstack.version as v; print(v.__version__)' 2> /dev/null)" = "$version" ]; then
    exit 0
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { python3 -m venv "$venv" &&
    "$venv/bin/pip" install --quiet --disable-pip-version-check "dstack[server]==$version"; } > "$log" 2>&1; then
    grep -v "^WARNING: Location .* is ignored" "$log" | tail -n 30 >&2
    echo "dstack.sh: could not install dstack[server]==$version into $venv" >&2
    exit 1
fi
