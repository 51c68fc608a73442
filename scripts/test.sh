#!/usr/bin/env bash
# The project's test command: makes sure the real parts the tests talk to are present, then runs pytest.
#   bash scripts/test.sh               the full suite (installs chromium/bubblewrap, starts PostgreSQL/Redis)
#   bash scripts/test.sh --quick       pure and single-process tests only: no root, services or browser
#   bash scripts/test.sh --under-load  the full suite with 4 CPU-bound busy loops running beside it
# Further arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

# Bytecode is cached (some images set PYTHONDONTWRITEBYTECODE): without it every xdist worker
# re-parses and re-rewrites the asserts of every test module at collection (about 6 s each).
unset PYTHONDONTWRITEBYTECODE

mode=full
case "${1:-}" in
  --quick) mode=quick; shift ;;
  --under-load) mode=load; shift ;;
esac

if [ "$mode" = quick ]; then
  exec python3 -m pytest -q -n "${CPN_TEST_WORKERS:-2}" --quick "$@"
fi

if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium for the dashboard test" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! command -v bwrap >/dev/null 2>&1; then
  echo "installing Debian's bubblewrap for the sandbox tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null
fi
if ! command -v slurmctld >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
  echo "installing Debian's slurm-wlm and munge for the Slurm backend tests" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
pg_isready -q -h 127.0.0.1 -p 5432 || pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 \
  --save "" --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log

if [ "$mode" = load ]; then
  # Other tenants' work: 4 busy loops for the whole run, ended with it.
  loops=()
  for _ in 1 2 3 4; do
    python3 -c 'while True: pass' &
    loops+=("$!")
  done
  trap 'kill "${loops[@]}" 2>/dev/null || true' EXIT
fi

# Three workers (CPN_TEST_WORKERS), on two cores too: the multi-process tests run in turn in two
# groups, each on a worker of its own (tests/conftest.py: SERIAL_PATHS, JOBS_GROUP_PATHS), the
# rest wherever a worker is free. With two, one serial group's waits on heartbeats, timeouts and
# peers left a core idle (1.5 of 2 busy; 1.75 with three). The 25 slowest tests are listed
# at the end (the serial group is the run's critical path).
status=0
python3 -m pytest -q -n "${CPN_TEST_WORKERS:-3}" --dist loadgroup --durations=25 "$@" || status=$?
exit "$status"
