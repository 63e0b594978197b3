#!/usr/bin/env bash
# System packages the pipeline tests need, on a fresh Debian 12 (bookworm) machine as root:
#   postgresql  tests/pipeline/test_mlflow_postgres.py  (initdb/postgres under /usr/lib/postgresql/<v>/bin)
#   chromium    tests/pipeline/test_browser_uis.py      (headless, driven over the DevTools protocol)
# Idempotent: apt runs only when a binary is missing. Measured: about 1 minute (apt-get update plus
# chromium's ~70 packages and postgresql on a machine that had neither browser nor server upgrades).
set -euo pipefail

need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)

if [ ${#need[@]} -eq 0 ]; then
    echo "system packages: postgresql and chromium already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "system packages: missing ${need[*]} and not root; the tests that need them will be skipped" >&2
    exit 0
fi

echo "system packages: installing ${need[*]}"
start=$(date +%s)
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# Debian's postgresql package starts a cluster of its own on port 5432 where a service manager
# runs; the tests start their own throwaway cluster and need none.
if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version name _; do
        pg_ctlcluster "$version" "$name" stop 2>/dev/null || true
    done
fi
echo "system packages: installed in $(( $(date +%s) - start )) s"
