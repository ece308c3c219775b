#!/usr/bin/env bash
# PostgreSQL server binaries for tests/test_postgres.py, which starts its own throwaway cluster
# from /usr/lib/postgresql/*/bin (no service is started here). Idempotent: exits 0 at once when
# initdb, pg_ctl and psql are already there. Debian packages only; the package's default
# "main" cluster is not created (nothing listens on 5432 afterwards).
set -euo pipefail

have_postgres() {
    compgen -G '/usr/lib/postgresql/*/bin/initdb' > /dev/null &&
        compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' > /dev/null &&
        command -v psql > /dev/null
}

if have_postgres; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo > /dev/null && sudo -n true 2> /dev/null; then
        exec sudo -n bash "$0" "$@"
    fi
    echo "postgres.sh: PostgreSQL is not installed and this user cannot install it" \
        "(tests/test_postgres.py will skip)" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt_get() {  # quiet: the output is shown only when apt-get fails
    if ! apt-get -q -y -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-confdef \
        -o Dpkg::Options::=--force-confold "$@" > "$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "postgres.sh: apt-get $* failed" >&2
        exit 1
    fi
}

apt_get update
# postgresql-common first, to switch off the automatic "main" cluster before the server package
# would create (and start) it.
apt_get install --no-install-recommends postgresql-common
conf=/etc/postgresql-common/createcluster.conf
if [ -f "$conf" ]; then
    sed -ri 's/^#?\s*create_main_cluster\s*=.*/create_main_cluster = false/' "$conf"
    grep -q '^create_main_cluster = false' "$conf" || echo 'create_main_cluster = false' >> "$conf"
fi
apt_get install --no-install-recommends postgresql postgresql-client

if ! have_postgres; then
    echo "postgres.sh: installed the postgresql package but found no initdb/pg_ctl/psql" >&2
    exit 1
fi
