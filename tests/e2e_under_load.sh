#!/usr/bin/env bash
# The end-to-end suite under a CPU load generator: stress-ng keeps one busy worker per core while
# pytest runs, and the load average is printed before, every minute, and after. Timed assertions in
# tests/ are ratios to a baseline taken in the same test or bounds only a hang crosses; this shows they
# hold on a loaded machine. Usage: bash tests/e2e_under_load.sh [pytest args]  (needs stress-ng:
# apt-get install stress-ng). Ends only the processes it started, by PID.
set -u
cd "$(dirname "$0")/.."
command -v stress-ng >/dev/null || { echo "stress-ng is missing: apt-get install stress-ng" >&2; exit 2; }
workers=$(nproc)
stress-ng --cpu "$workers" --timeout 5400s --quiet &
stress=$!
( for _ in $(seq 1 90); do sleep 60; echo "[load] $(date +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; done ) &
ticker=$!
trap 'kill "$stress" "$ticker" 2>/dev/null' EXIT
sleep 5
echo "[load] start $(date +%T) $(cut -d' ' -f1-3 /proc/loadavg) (stress-ng: $workers busy workers on $workers cores)"
python3 -m pytest -q -p no:cacheprovider -m "e2e and not comfy and not browser" "$@"
status=$?
echo "[load] end $(date +%T) $(cut -d' ' -f1-3 /proc/loadavg); pytest exit $status"
exit $status
