#!/usr/bin/env bash
# The project's test command: makes sure the real parts the tests talk to are present, then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium for the dashboard test" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! command -v bwrap >/dev/null 2>&1; then
  echo "installing Debian's bubblewrap for the sandbox tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi
pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 \
  --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log

# Two workers (CPN_TEST_WORKERS): the multi-process tests run in turn on one (tests/conftest.py,
# SERIAL_PATHS), the rest on the other meanwhile; the 25 slowest tests are listed at the end
# (the serial group is the run's critical path).
exec python3 -m pytest -q -n "${CPN_TEST_WORKERS:-2}" --dist loadgroup --durations=25 "$@"
