#!/usr/bin/env bash
# Undo start-slurm.sh DIR: cancel every job, stop slurmd/slurmctld (and munged if it started it),
# kill what is left in the node namespaces, delete the namespaces and the bridge.
set -uo pipefail
dir=$(cd "${1:?usage: stop-slurm.sh DIR}" 2>/dev/null && pwd) || exit 0
# the namespaces, bridge and munged are shared by name: another folder's live SLURM keeps them
current=$(cat /run/jc-slurm-test.dir 2>/dev/null) || current=$dir
export SLURM_CONF=$dir/slurm.conf
[ -f "$SLURM_CONF" ] && timeout 10 scancel --full --quiet --user "$(id -un)" 2>/dev/null
# every daemon at once: TERM, then KILL what is left after 5 s (slurmctld saves its state first)
pids=() alive=()
for f in "$dir"/slurmd-*.pid "$dir/slurmctld.pid"; do
  [ -e "$f" ] && pid=$(cat "$f" 2>/dev/null) && kill "$pid" 2>/dev/null && pids+=("$pid")
done
for _ in $(seq 20); do
  alive=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  [ ${#alive[@]} = 0 ] && break
  sleep 0.25
done
for pid in "${alive[@]}"; do kill -9 "$pid" 2>/dev/null; done
if [ "$current" = "$dir" ]; then
  for ns in $(ip netns list 2>/dev/null | awk '/^jcslurm-node/{print $1}'); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns"
  done
  ip link del jcslurm0 2>/dev/null
  if [ -f "$dir/munged.ours" ]; then
    pkill_pid=$(cat /run/munge/munged.pid 2>/dev/null) && kill "$pkill_pid" 2>/dev/null
    rm -f "$dir/munged.ours"
  fi
  rm -f /run/jc-slurm-test.dir /run/jc-slurm-test.owner
fi
rm -f "$dir"/*.pid
exit 0
