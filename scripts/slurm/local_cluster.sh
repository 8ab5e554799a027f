#!/usr/bin/env bash
# A one-machine SLURM cluster for the tests (tests/test_slurm.py) and for trying the
# --slurm options of the reproduce drivers and train.sh: Debian's slurm-wlm and munge,
# a slurm.conf for this host (its short hostname, CPU count and memory), munged,
# slurmctld and slurmd, all started as root. State, spool and logs under
# $LOCAL_SLURM_DIR (default /tmp/fairseq-localness-slurm).
#
# Usage: local_cluster.sh install|start|stop|status
#   install  apt-get install slurm-wlm munge where sbatch or munged is missing (root)
#   start    install, write the configuration, start the daemons and wait until the
#            node is idle; does nothing when the cluster already answers (idempotent)
#   stop     stop the daemons this script started (their pid files)
#   status   print sinfo's line for the node; exit status 1 when the cluster is down
#
# The configuration: one node, one partition 'debug' (the default; time limits up to
# 1 hour), cons_tres on cores, linuxproc process tracking, no accounting (a job
# completion log in $LOCAL_SLURM_DIR/jobcomp.log), jobs requeueable (JobRequeue=1),
# KillWait 5 s so that a requeue or time limit stops a job quickly.
set -euo pipefail
PROG="$(basename "$0")"
DIR="${LOCAL_SLURM_DIR:-/tmp/fairseq-localness-slurm}"
CONF_DIR=/etc/slurm
CONF="$CONF_DIR/slurm.conf"

die() { echo "${PROG}: error: $*" >&2; exit 2; }

need_root() {
    (( EUID == 0 )) || die "$1 needs root (slurmd and munged run as root here); expected to run as root"
}

cluster_up() {
    timeout 10 sinfo -h -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc|comp)'
}

install() {
    if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v munged >/dev/null; then
        return 0
    fi
    need_root install
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    local host cpus mem
    host="$(hostname -s)"
    cpus="$(nproc --all)"
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    mkdir -p "$CONF_DIR" "$DIR/state" "$DIR/spool"
    cat > "$CONF" <<CONF
# written by scripts/slurm/local_cluster.sh for the one-machine test cluster
ClusterName=localness
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# a requeued job may start again after cred_expire s (default 120)
AuthInfo=cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
ReturnToService=2
JobRequeue=1
KillWait=5
MinJobAge=600
InactiveLimit=0
Waittime=0
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/jobcomp.log
SlurmdParameters=config_overrides
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=60 State=UP
CONF
}

start_munge() {
    if [[ ! -s /etc/munge/munge.key ]]; then
        mkdir -p /etc/munge
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        runuser -u munge -- /usr/sbin/munged
    fi
    local k
    for k in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    die "munged did not start (see /var/log/munge/munged.log)"
}

alive() {  # alive PIDFILE
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

start() {
    if cluster_up; then
        echo "${PROG}: running: $(sinfo -h -o '%N %t, %c CPUs, partition %P')"
        return 0
    fi
    need_root start
    install
    write_conf
    start_munge
    alive "$DIR/slurmctld.pid" || /usr/sbin/slurmctld
    alive "$DIR/slurmd.pid" || /usr/sbin/slurmd
    local k
    for k in $(seq 60); do
        if cluster_up; then
            echo "${PROG}: started: $(sinfo -h -o '%N %t, %c CPUs, partition %P')"
            return 0
        fi
        # a node left down by an earlier run comes back
        scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
        sleep 0.5
    done
    die "the cluster did not come up within 30 s (see $DIR/slurmctld.log and $DIR/slurmd.log)"
}

stop() {
    local f pid
    for f in "$DIR/slurmd.pid" "$DIR/slurmctld.pid"; do
        if alive "$f"; then
            pid="$(cat "$f")"
            kill "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        fi
    done
    echo "${PROG}: stopped slurmd and slurmctld (munged left running)"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    stop) stop ;;
    status)
        if cluster_up; then sinfo -h -o '%N %t, %c CPUs, partition %P'; else echo "${PROG}: not running"; exit 1; fi ;;
    *) die "expected one of: install start stop status; got '${1:-}'" ;;
esac
