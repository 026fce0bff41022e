#!/usr/bin/env bash
# A real single-node SLURM cluster for the tests (docs/scaling.md, tests/test_slurm.py).
#
#   tests/cluster/slurm.sh start DIR   install the packages if missing, write DIR/slurm.conf
#                                      for one node on 127.0.0.1, start munged, slurmctld and
#                                      slurmd, wait until sinfo shows the node idle; again on
#                                      the same DIR: start those that stopped, same config
#   tests/cluster/slurm.sh stop DIR    stop exactly the daemons started in DIR (their pids)
#   tests/cluster/slurm.sh env DIR     print the environment a client needs (SLURM_CONF, and
#                                      PATH with the srun wrapper first)
#
# Debian's slurmctld, slurmd, slurm-client 22.05 and munge; proctrack/linuxproc, task/none,
# no accounting (sacct exists but has no database: the trap docs/scaling.md describes), the
# node declares one GPU in gres.conf without a device (jobs that ask for none run as usual;
# sbatch --test-only checks GPU requests). Needs root to install and to run slurmd. Exit
# status 3: the packages are missing and cannot be installed (the tests skip with the reason
# from stderr).
set -euo pipefail

cmd=${1:?usage: slurm.sh start|stop|env DIR}
dir=${2:?usage: slurm.sh start|stop|env DIR}
PACKAGES=(slurmctld slurmd slurm-client munge)

install_packages() {
    local missing=()
    for bin in slurmctld slurmd sinfo sbatch munged; do
        command -v "$bin" >/dev/null 2>&1 || [[ -x /usr/sbin/$bin ]] || missing+=("$bin")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        echo "slurm.sh: ${missing[*]} missing and cannot install (${PACKAGES[*]}) without root and apt-get" >&2
        exit 3
    fi
    if ! DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
        --no-install-recommends "${PACKAGES[@]}" >"$dir/apt.log" 2>&1; then
        echo "slurm.sh: apt-get install ${PACKAGES[*]} failed (log: $dir/apt.log)" >&2
        exit 3
    fi
}

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

write_config() {
    local cpus mem_mb ctl_port d_port
    cpus=$(nproc)
    mem_mb=$(awk '/MemTotal/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    ctl_port=$(free_port)
    d_port=$(free_port)
    mkdir -p "$dir/state" "$dir/spool"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=crosslip-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctl_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=300
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
GresTypes=gpu
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:1 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
    cat >"$dir/gres.conf" <<CONF
NodeName=localhost Name=gpu File=/dev/null
CONF
}

wait_until() {  # tries seconds check args...: run the check until it passes, at most tries times
    local tries=$1 pause=$2
    shift 2
    for _ in $(seq "$tries"); do
        "$@" && return 0
        sleep "$pause"
    done
    return 1
}

running() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

node_idle() { [[ $(sinfo -h -N -o %T 2>/dev/null) == idle ]]; }

start_daemon() {  # name pidfile command...: start unless running; fail loudly if it does not stay up
    local name=$1 pidfile=$2
    shift 2
    [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null && return 0
    "$@" >>"$dir/$name.out" 2>&1
    wait_until 50 0.1 running "$pidfile" && return 0
    echo "slurm.sh: $name did not start; its log:" >&2
    tail -20 "$dir/$name.log" "$dir/$name.out" >&2 2>/dev/null || true
    return 1
}

write_srun_wrapper() {
    # snakemake-executor-plugin-slurm-jobstep 0.6 removes every SLURM_* variable but the
    # job's ids from the environment of the srun it runs inside each job, SLURM_CONF
    # included, so srun would look for the config at the default path only. A wrapper
    # first in PATH gives it back (docs/scaling.md: the same on a cluster whose config is
    # not at the default path).
    # The real srun, PATH searched without $dir/bin: a second start from a client shell
    # (PATH from `slurm.sh env`) would otherwise find the wrapper and make it exec itself.
    local real="" entry
    local IFS=:
    for entry in $PATH; do
        [[ $entry != "$dir/bin" && -x $entry/srun ]] && { real=$entry/srun; break; }
    done
    [[ -n $real ]] || { echo "slurm.sh: srun not found in PATH" >&2; return 1; }
    mkdir -p "$dir/bin"
    printf '#!/bin/sh\nexport SLURM_CONF=%s\nexec %s "$@"\n' "$dir/slurm.conf" "$real" \
        >"$dir/bin/srun"
    chmod 755 "$dir/bin/srun"
}

start() {
    mkdir -p "$dir"
    chmod 700 "$dir"
    install_packages
    [[ -s $dir/slurm.conf ]] || write_config  # a second start brings back what stopped
    write_srun_wrapper
    export SLURM_CONF=$dir/slurm.conf
    [[ -s $dir/munge.key ]] || { dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none; chmod 400 "$dir/munge.key"; }
    start_daemon munged "$dir/munged.pid" /usr/sbin/munged --force --socket="$dir/munge.socket" \
        --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" \
        --seed-file="$dir/munged.seed"
    start_daemon slurmctld "$dir/slurmctld.pid" /usr/sbin/slurmctld -f "$SLURM_CONF"
    start_daemon slurmd "$dir/slurmd.pid" /usr/sbin/slurmd -f "$SLURM_CONF" -N localhost
    if wait_until 120 0.5 node_idle; then
        echo "slurm.sh: node idle (SLURM_CONF=$SLURM_CONF)"
        return 0
    fi
    echo "slurm.sh: the node did not become idle (sinfo: $(sinfo -h -N -o %T 2>&1))" >&2
    tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 2>/dev/null || true
    return 1
}

stop() {
    local name pid
    for name in slurmd slurmctld munged; do
        [[ -s $dir/$name.pid ]] || continue
        pid=$(cat "$dir/$name.pid")
        kill "$pid" 2>/dev/null || continue
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
}

case $cmd in
start) start ;;
stop) stop ;;
env) printf 'SLURM_CONF=%s\nPATH=%s:%s\n' "$dir/slurm.conf" "$dir/bin" "$PATH" ;;
*) echo "usage: slurm.sh start|stop|env DIR" >&2; exit 2 ;;
esac
