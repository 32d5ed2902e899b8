#!/usr/bin/env bash
# The server-side decomposition of the PostgreSQL cycle quoted in BENCHMARKS.md ("Where
# we miss", PostgreSQL): pgbench (a C client, so the rates are the server's) runs the
# backend's acquire and release statements, written out by hand, and variants that each
# take one cost away. Each client cycles over 16 names of its own, as the bench's tasks do.
#
# Usage: docs/bench/pgbench/run.sh [postgres URL]   (default: scripts/servers' database)
# Creates and leaves a schema "pgb" in that database (setup.sql drops it first).
set -euo pipefail
cd "$(dirname "$0")"
url=${1:-}
if [[ -z $url ]]; then
    # shellcheck disable=SC1091
    source ../../../.servers/env
    url=$ANYLOCK_TEST_POSTGRES_URL
fi
bin=$(printf "%s\n" /usr/lib/postgresql/*/bin | sort -V | tail -1)
psql -q "$url" -f setup.sql
for round in 1 2; do
    for script in floor ours ours_nonotify ours_nounique_nonotify ours_nocreate_nonotify upsert_token; do
        tps=$("$bin/pgbench" -n -M prepared -c 64 -j 2 -T 5 -f "$script.sql" "$url" 2>&1 |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p')
        printf '%-26s round %s: %s cycles/s\n' "$script" "$round" "$tps"
    done
done
