"""What the cluster says: its SLURM commands and partitions, and the state of each
submitted job (SLURM's queue, and the state the job recorded itself)."""
import getpass
import json
import os
import re
import shutil
import subprocess

from fairseq_localness.slurm import UsageError
from fairseq_localness.slurm.graph import safe

LIVE = {"PENDING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued",
        "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "queued",
        "STAGE_OUT": "running", "RESIZING": "running", "SIGNALING": "running", "RESV_DEL_HOLD": "queued"}
ENDED = {"COMPLETED": "done", "FAILED": "failed", "TIMEOUT": "failed", "CANCELLED": "cancelled",
         "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed",
         "PREEMPTED": "failed", "REVOKED": "cancelled", "SPECIAL_EXIT": "failed"}



def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def need_slurm():
    missing = [c for c in ("sbatch", "squeue", "scontrol", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        raise UsageError(f"--slurm: no SLURM commands on PATH ({', '.join(missing)} not found); expected a machine "
                         "that submits to a SLURM cluster (or scripts/slurm/local_cluster.sh start for a local one)")


def partitions():
    """{name: time limit in minutes or None} of the cluster's partitions; the default's name first."""
    p = subprocess.run(["sinfo", "-h", "-o", "%P %l"], capture_output=True, text=True, timeout=60)
    if p.returncode:
        raise UsageError(f"--slurm: sinfo failed ({(p.stderr or p.stdout).strip()}); is the cluster up?")
    parts = {}
    for line in p.stdout.split("\n"):
        if line.strip():
            name, limit = line.split()
            parts[name.rstrip("*")] = minutes_of(limit)
            if name.endswith("*"):
                parts["<default>"] = parts[name.rstrip("*")]
    return parts


def minutes_of(limit):
    m = re.fullmatch(r"(?:(\d+)-)?(\d+):(\d+):(\d+)", limit)
    if not m:
        return None  # infinite
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) + (s > 0)


def squeue_states(job_ids):
    """{job id: (state, restarts, reason)} of the jobs SLURM still knows."""
    if not job_ids:
        return {}
    p = subprocess.run(["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-O",
                        "JobID:30,State:24,RestartCnt:8,Reason:80"], capture_output=True, text=True, timeout=60)
    out = {}
    for line in p.stdout.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0] in job_ids:
            out[parts[0]] = (parts[1], int(parts[2]) if parts[2].isdigit() else 0,
                             parts[3].strip() if len(parts) > 3 else "")
    return out


def job_states(state_dir, registry):
    """{key: (state, restarts, message)}: state one of queued, running, done, failed, cancelled."""
    live = squeue_states({rec["job_id"] for rec in registry.values()})
    states = {}
    for key, rec in registry.items():
        mine = load_json(os.path.join(state_dir, "jobs", safe(key) + ".json"))
        if mine.get("job_id") != rec["job_id"]:
            mine = {}
        restarts = mine.get("restarts", 0)
        if rec["job_id"] in live:
            sq, restarts, reason = live[rec["job_id"]]
            restarts = max(restarts, mine.get("restarts", 0))
            if sq in LIVE:
                states[key] = (LIVE[sq], restarts, reason)
                continue
            if mine.get("state") in ("done", "failed"):
                states[key] = (mine["state"], restarts, mine.get("message", ""))
            else:
                states[key] = (ENDED.get(sq, "failed"), restarts, reason if sq != "COMPLETED" else "")
            continue
        if mine.get("state") in ("done", "failed"):
            states[key] = (mine["state"], restarts, mine.get("message", ""))
        elif mine.get("state") == "running":
            states[key] = ("failed", restarts, "the job ended without a result (killed?)")
        else:
            states[key] = ("cancelled", restarts, "never ran")
    return states
