#!/usr/bin/env bash
# Starts N data-parallel workers of one command on this machine, the way
# torchrun does: each gets RANK and LOCAL_RANK (0..N-1), WORLD_SIZE=N,
# MASTER_ADDR (default 127.0.0.1) and MASTER_PORT (default: a random free port
# below the kernel's ephemeral range). For several machines, run the command on
# each yourself with the same MASTER_ADDR/MASTER_PORT/WORLD_SIZE and each
# worker's own RANK.
#
#   scripts/launch.sh 2 -- ./build/examples/tree_lstm --epochs 2
#
# Waits for every worker. If one fails, the others get SHEAF_LAUNCH_GRACE
# seconds (default 60) to stop by themselves (DataParallel's own errors name
# the failed rank), then are killed. Exit status: the first failure's, else 0.
set -uo pipefail
usage() { echo "usage: scripts/launch.sh N -- COMMAND [ARGS...]" >&2; exit 2; }
[ $# -ge 3 ] && [ "$2" = "--" ] || usage
n=$1; shift 2
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "launch.sh: N='$n' is not a positive integer" >&2; exit 2; }
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
# A port nobody listens on, below the kernel's ephemeral range: other programs'
# client sockets take ports in that range at any moment (a random port there
# once collided with a concurrent test's connection).
free_port() {
  local lo=32768 p=0
  read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  ((lo > 11000)) || lo=32768
  for _ in {1..50}; do
    p=$((10000 + RANDOM % (lo - 10000)))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || break
  done
  echo "$p"
}
export MASTER_PORT=${MASTER_PORT:-$(free_port)}
export WORLD_SIZE=$n
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r "$@" &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM
status=0
alive=("${pids[@]}")
while [ ${#alive[@]} -gt 0 ]; do
  wait -n -p done_pid "${alive[@]}"
  rc=$?
  rest=()
  for p in "${alive[@]}"; do [ "$p" != "$done_pid" ] && rest+=("$p"); done
  alive=("${rest[@]}")
  if [ $rc -ne 0 ] && [ $status -eq 0 ]; then
    status=$rc
    for ((r = 0; r < n; r++)); do [ "${pids[$r]}" = "$done_pid" ] && failed=$r; done
    echo "launch.sh: rank ${failed:-?} exited with status $rc" >&2
    ( sleep "${SHEAF_LAUNCH_GRACE:-60}"; kill -9 "${pids[@]}" 2>/dev/null ) &
    killer=$!
  fi
done
[ -n "${killer:-}" ] && kill "$killer" 2>/dev/null
exit $status
