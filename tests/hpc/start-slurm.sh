#!/usr/bin/env bash
# A real SLURM for the tests: munged, slurmctld, and one slurmd per node, each node in its own
# network namespace (NodeName/NodeAddr per namespace), joined by a bridge on this machine.
#
# Usage (as root): start-slurm.sh DIR [NODES]
#   DIR    state, spool, logs, pid files and slurm.conf go here (use SLURM_CONF=DIR/slurm.conf);
#          nothing is written to /etc/slurm
#   NODES  number of nodes (default 2): node1..nodeN at 10.77.0.11.., the controller at 10.77.0.1
# Its own free ports (SlurmctldPort, SlurmdPort in slurm.conf), never the defaults, so that another
# SLURM on the machine can neither hold its ports nor answer its commands (each run with SLURM_CONF).
# Prints "pids: ..." of every daemon it started on its last line.  stop-slurm.sh DIR undoes it all.
#
# Debian's slurmctld/slurmd/munge packages (slurm 22.05) are installed when missing.  Partitions:
#   debug  every node, at most 1 hour a job, cores oversubscribable (2 cores hold several jobs)
#   short  every node, at most 1 minute a job (a longer walltime pends with PartitionTimeLimit)
set -euo pipefail
dir=$(mkdir -p "${1:?usage: start-slurm.sh DIR [NODES]}" && cd "$1" && pwd)
nodes=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
# One test SLURM per machine (the bridge, namespaces and subnet have fixed names): a live one of
# another test session (its caller and its slurmctld both alive) is waited for, never torn down;
# leftovers of a dead one (this folder's, or another's whose folder /run/jc-slurm-test.dir names) are.
other_live() {
  local other owner pid
  other=$(cat /run/jc-slurm-test.dir 2>/dev/null) || return 1
  [ "$other" != "$dir" ] || return 1
  owner=$(cat /run/jc-slurm-test.owner 2>/dev/null) && kill -0 "$owner" 2>/dev/null || return 1
  pid=$(cat "$other/slurmctld.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}
for _ in $(seq "${JC_SLURM_WAIT_S:-540}"); do other_live || break; sleep 1; done
if other_live; then
  echo "another test session (process $(cat /run/jc-slurm-test.owner)) runs the test SLURM in $(cat /run/jc-slurm-test.dir); run one at a time" >&2
  exit 3
fi
[ -f /run/jc-slurm-test.dir ] && bash "$here/stop-slurm.sh" "$(cat /run/jc-slurm-test.dir)" >/dev/null 2>&1
bash "$here/stop-slurm.sh" "$dir" >/dev/null 2>&1 || true
echo "$dir" >/run/jc-slurm-test.dir
echo "$PPID" >/run/jc-slurm-test.owner  # the test session that called this script

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

subnet=10.77.0
bridge=jcslurm0
ip link add "$bridge" type bridge
ip addr add "$subnet.1/24" dev "$bridge"
ip link set "$bridge" up
for i in $(seq "$nodes"); do
  ns=jcslurm-node$i
  ip netns add "$ns"
  ip link add "jcsl$i" type veth peer name eth0 netns "$ns"
  ip link set "jcsl$i" master "$bridge" up
  ip -n "$ns" addr add "$subnet.$((10 + i))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" route add default via "$subnet.1"
done

# Ports of its own, free now, never SLURM's defaults (6817/6818): a SLURM already running on this
# machine keeps its ports, and this one's commands (SLURM_CONF=DIR/slurm.conf) reach only this one.
free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("", 0))  # all addresses, as slurmctld binds: free on the bridge too
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}
read -r ctld_port slurmd_port <<<"$(free_ports 2)"

cpus=$(nproc)
mem=$(( $(free -m | awk '/Mem:/{print $2}') / 4 ))
rm -rf "$dir/state" "$dir"/spool-* "$dir/log"
mkdir -p "$dir/state" "$dir/log"
cat > "$dir/slurm.conf" <<CONF
ClusterName=jctest
SlurmctldHost=$(hostname -s)($subnet.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MinJobAge=30
KillWait=5
SlurmdTimeout=30
NodeName=node[1-$nodes] NodeAddr=$subnet.[$((10 + 1))-$((10 + nodes))] CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=node[1-$nodes] Default=YES LLN=YES MaxTime=01:00:00 State=UP OverSubscribe=FORCE:8
PartitionName=short Nodes=node[1-$nodes] LLN=YES MaxTime=00:01:00 State=UP OverSubscribe=FORCE:8
CONF
export SLURM_CONF=$dir/slurm.conf

[ -s /etc/munge/munge.key ] || mungekey --create
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge
if ! munge -n >/dev/null 2>&1; then
  su -s /bin/sh munge -c /usr/sbin/munged
  echo started >"$dir/munged.ours"  # stop-slurm.sh stops munged only if this script started it
fi
for _ in $(seq 40); do munge -n >/dev/null 2>&1 && break; sleep 0.25; done

/usr/sbin/slurmctld -f "$dir/slurm.conf"
for i in $(seq "$nodes"); do
  mkdir -p "$dir/spool-node$i"
  # nsenter, not `ip netns exec`: that one remounts /sys, and slurmd needs /sys/fs/cgroup
  nsenter --net="/run/netns/jcslurm-node$i" /usr/sbin/slurmd -f "$dir/slurm.conf" -N "node$i"
done
for _ in $(seq 120); do
  [ "$(sinfo -h -p debug -t idle -o %D 2>/dev/null | head -1)" = "$nodes" ] && break
  sleep 0.5
done
sinfo
# the controller that answers is this one (its cluster's name), not another SLURM on the machine
ours=$(scontrol show config 2>/dev/null | awk -F' *= *' '$1 == "ClusterName" {print $2}')
if [ "$ours" != jctest ] || ! kill -0 "$(cat "$dir/slurmctld.pid" 2>/dev/null)" 2>/dev/null; then
  echo "the test SLURM's controller did not start on port $ctld_port (the one answering is cluster '${ours:-none}'); see $dir/log/slurmctld.log" >&2
  exit 4
fi
echo "ports: slurmctld $ctld_port, slurmd $slurmd_port"
pids="$(cat "$dir/slurmctld.pid")"
for i in $(seq "$nodes"); do pids="$pids $(cat "$dir/slurmd-node$i.pid")"; done
echo "pids: $pids"
