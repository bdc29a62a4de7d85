#!/bin/bash
# A single-node Slurm cluster on this machine for the opt-in test of `azp-sandbox slurm`
# (AZP_SANDBOX_HEAVY_TESTS=1 cargo test --test autoscale): munge, slurmctld and slurmd
# from Debian's packages, all on 127.0.0.1, started as plain daemons (no systemd needed),
# one partition "debug" holding this node. Idempotent: a running cluster is left as is.
# Needs root. Stop it with: scripts/setup-slurm.sh --stop
set -euo pipefail

conf=/etc/slurm/slurm.conf
marker="# written by azp-sandbox scripts/setup-slurm.sh"

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-slurm.sh: run as root (sudo)" >&2
    exit 1
fi

if [ "${1:-}" = "--stop" ]; then
    for p in slurmd slurmctld munged; do
        [ -f "/run/azp-slurm/$p.pid" ] && kill "$(cat "/run/azp-slurm/$p.pid")" 2>/dev/null || true
    done
    exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null || ! command -v sbatch >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi

node=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/azp-slurm /run/munge /var/lib/munge /var/log/munge

if [ -f "$conf" ] && ! grep -qF "$marker" "$conf"; then
    echo "setup-slurm.sh: $conf exists and was not written by this script: not touching a real cluster" >&2
    exit 1
fi
cat > "$conf.new" <<CONF
$marker
ClusterName=azp-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/azp-slurm/slurmctld.pid
SlurmdPidFile=/run/azp-slurm/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
MinJobAge=30
KillWait=10
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
# cgroup.conf is read by slurmd 22.05 even with the plugins above.
[ -f /etc/slurm/cgroup.conf ] || printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' > /etc/slurm/cgroup.conf
mv "$conf.new" "$conf"

if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
chmod 700 /etc/munge /var/lib/munge /var/log/munge
chmod 400 /etc/munge/munge.key
chmod 755 /run/munge

alive() { [ -f "/run/azp-slurm/$1.pid" ] && kill -0 "$(cat "/run/azp-slurm/$1.pid")" 2>/dev/null; }

if ! munge -n >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid
    cp /run/munge/munged.pid /run/azp-slurm/munged.pid 2>/dev/null || true
fi
for i in $(seq 50); do munge -n >/dev/null 2>&1 && break; sleep 0.1; done
munge -n | unmunge >/dev/null || { echo "setup-slurm.sh: munge does not work" >&2; exit 1; }

alive slurmctld || /usr/sbin/slurmctld
alive slurmd || /usr/sbin/slurmd
for i in $(seq 100); do
    state=$(sinfo --noheader --nodes="$node" --format=%t 2>/dev/null | head -n 1 || true)
    case "$state" in
        idle|mix|alloc) echo "setup-slurm.sh: node $node is $state in partition debug"; exit 0 ;;
        down*|drain*) scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.3
done
echo "setup-slurm.sh: node $node did not come up (state '$state'); see /var/log/slurm/" >&2
exit 1
