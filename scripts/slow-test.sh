#!/usr/bin/env bash
# `make test` on a machine made slower: the check a developer runs before calling the suite
# stable (a CI machine can be 2.5x slower than the one the suite was measured on).
#
#   make test-slow                 # CPU quota of 0.8 cores for the whole suite
#   make test-slow CPUS=0.5 PYTEST_ARGS="-m process"
#   bash scripts/slow-test.sh CMD ARGS...    # any other command slowed the same way
#
# How it slows the machine, said in one line when it starts:
#   - root with cgroups: the suite, and everything it starts, in a cgroup of its own with a CPU
#     quota of CPUS cores (v1 cpu.cfs_quota_us, or v2 cpu.max), under this shell's own cgroup;
#     the grading sandboxes nest inside it (lab_utils.grading.sandbox), so they are slowed too.
#     The cgroup is removed at the end.
#   - otherwise (or SLOW_BY=busy): BUSY busy loops (default 3) at the same priority beside the
#     suite, stopped at the end; on 2 cores that leaves the suite about 0.8 of a core when it
#     wants two.
# Prints the suite's wall time at the end; exits with the command's status.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CPUS=${CPUS:-0.8}
BUSY=${BUSY:-3}
SLOW_BY=${SLOW_BY:-quota}
[ $# -gt 0 ] || set -- make test
say() { printf '==> slow-test: %s\n' "$*"; }
die() { printf 'slow-test: %s\n' "$*" >&2; exit 2; }

awk -v c="$CPUS" 'BEGIN { exit !(c + 0 > 0.05) }' || die "CPUS must be a number of cores above 0.05, got CPUS=$CPUS"
case "$BUSY" in '' | *[!0-9]*) die "BUSY must be a whole number of busy loops, got BUSY=$BUSY" ;; esac
case "$SLOW_BY" in quota | busy) ;; *) die "SLOW_BY must be quota or busy, got SLOW_BY=$SLOW_BY" ;; esac

CG="" BUSY_PIDS=()
cleanup() {
  local pid
  for pid in "${BUSY_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${BUSY_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done  # gone before this script is
  if [ -n "$CG" ] && [ -d "$CG" ]; then
    for _ in $(seq 50); do rmdir "$CG" 2>/dev/null && break; sleep 0.1; done  # its last tasks leave asynchronously
    [ ! -d "$CG" ] || printf 'slow-test: could not remove %s (processes left in it: %s)\n' "$CG" "$(cat "$CG/cgroup.procs")" >&2
  fi
}
trap cleanup EXIT

# A cgroup with a quota, as root (v1: this shell's cpu cgroup; v2: the unified root).
make_cgroup() {
  [ "$(id -u)" = 0 ] || return 1
  local own
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    grep -qw cpu /sys/fs/cgroup/cgroup.controllers || return 1
    echo +cpu >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || return 1
    CG=/sys/fs/cgroup/labs-slow-$$
    mkdir "$CG" || return 1
    echo "$(awk -v c="$CPUS" 'BEGIN { printf "%d", c * 100000 }') 100000" >"$CG/cpu.max"
  else
    own=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ { print $3; exit }' /proc/self/cgroup)
    [ -n "$own" ] && [ -d "/sys/fs/cgroup/cpu$own" ] || return 1
    CG=/sys/fs/cgroup/cpu${own%/}/labs-slow-$$
    mkdir "$CG" || return 1
    awk -v c="$CPUS" -v p="$(cat "$CG/cpu.cfs_period_us")" 'BEGIN { printf "%d\n", c * p }' >"$CG/cpu.cfs_quota_us"
  fi
}

cd "$ROOT"
start=$(date +%s)
if [ "$SLOW_BY" = quota ] && make_cgroup; then
  say "$* runs in cgroup ${CG#/sys/fs/cgroup/} with a CPU quota of $CPUS cores (of $(nproc))"
  set +e
  bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$CG" "$@"
  rc=$?
  set -e
else
  CG=""
  [ "$SLOW_BY" = busy ] || say "no cgroup can be made here (not root, or no cpu controller): busy loops instead"
  say "$* runs beside $BUSY busy loops"
  for _ in $(seq "$BUSY"); do
    bash -c 'while :; do :; done' &
    BUSY_PIDS+=($!)
  done
  set +e
  "$@"
  rc=$?
  set -e
fi
say "$* exited $rc after $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s"
exit "$rc"
