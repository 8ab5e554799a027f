"""What the cluster says: its SLURM commands and partitions, and the state of each
submitted job (SLURM's queue, read once per command and checked, and the state the job
recorded itself)."""
import getpass
import json
import os
import re
import shutil
import subprocess

from fairseq_localness.slurm import SlurmError, UsageError
from fairseq_localness.slurm.graph import safe

# How long a SLURM command may take to answer (seconds; FAIRSEQ_LOCALNESS_SLURM_TIMEOUT).
TIMEOUT = float(os.environ.get("FAIRSEQ_LOCALNESS_SLURM_TIMEOUT", "30"))
# SLURM's largest time limit: minutes in 32 bits, below INFINITE and NO_VAL (slurm.h).
MAX_MINUTES = 0xFFFFFFFD

# SLURM's job states (squeue(1), JOB STATE CODES), each mapped once: what --status calls
# it (queued, running, ending: live; done; failed; cancelled) and, where SLURM's word
# says more than that, the words --status adds.
STATES = {
    "PENDING": ("queued", ""), "REQUEUED": ("queued", "requeued"), "REQUEUE_HOLD": ("queued", "requeued, held"),
    "REQUEUE_FED": ("queued", "requeued"), "RESV_DEL_HOLD": ("queued", "held: its reservation was deleted"),
    "SUSPENDED": ("queued", "suspended"), "STOPPED": ("queued", "stopped"),
    "CONFIGURING": ("running", "its nodes are starting"), "RUNNING": ("running", ""),
    "RESIZING": ("running", "resizing"), "SIGNALING": ("running", "being signalled"),
    "COMPLETING": ("ending", "SLURM is ending it (COMPLETING)"), "STAGE_OUT": ("ending", "staging out"),
    "COMPLETED": ("done", ""),
    "FAILED": ("failed", "SLURM: FAILED (a command failed)"),
    "TIMEOUT": ("failed", "SLURM: TIMEOUT (past its time limit)"),
    "NODE_FAIL": ("failed", "SLURM: NODE_FAIL (its node failed)"),
    "OUT_OF_MEMORY": ("failed", "SLURM: OUT_OF_MEMORY (past its --mem)"),
    "BOOT_FAIL": ("failed", "SLURM: BOOT_FAIL (its node did not boot)"),
    "DEADLINE": ("failed", "SLURM: DEADLINE (past its deadline)"),
    "PREEMPTED": ("failed", "SLURM: PREEMPTED (stopped for another job)"),
    "SPECIAL_EXIT": ("failed", "SLURM: SPECIAL_EXIT"),
    "CANCELLED": ("cancelled", ""), "REVOKED": ("cancelled", "revoked"),
}
LIVE = ("queued", "running", "ending")
# squeue's reasons (squeue(1), JOB REASON CODES) that --status puts in words; "None" says nothing
REASONS = {"None": "", "Dependency": "waiting for the jobs it needs", "BeginTime": "waiting for its start time",
           "DependencyNeverSatisfied": "a job it needs failed or was cancelled", "Priority": "waiting for its turn",
           "Resources": "waiting for resources", "JobHeldUser": "held (scontrol release starts it)",
           "JobHeldAdmin": "held by an administrator", "NonZeroExitCode": "", "RaisedSignal": "killed by a signal",
           "TimeLimit": "", "Prolog": "", "BadConstraints": "no node has its --constraint"}


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


def ask(cmd):
    """The standard output of a SLURM command; SlurmError, in one line, when it fails or does
    not answer within TIMEOUT seconds."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{cmd[0]} did not answer within {TIMEOUT:g} s (is the cluster up? 'scontrol ping'); "
                         "nothing was submitted, cancelled or recorded") from None
    except OSError as e:
        raise SlurmError(f"{cmd[0]} cannot run ({e.strerror}); nothing was submitted, cancelled or recorded") from None
    if p.returncode:
        said = " ".join((p.stderr or p.stdout).split())[-200:] or "no message"
        raise SlurmError(f"{cmd[0]} failed (exit status {p.returncode}: {said}); nothing was submitted, cancelled "
                         "or recorded")
    return p.stdout


def partitions():
    """{name: time limit in minutes or None} of the cluster's partitions; the default's name first."""
    parts = {}
    for line in ask(["sinfo", "-h", "-o", "%P %l"]).split("\n"):
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


_LINE = re.compile(r"(\d+)(?:_\S*)?\s+([A-Z_]+)\s+(\d+|N/A)(?:\s+(.*))?")


def read_queue():
    """{job id: (SLURM state, restarts, reason)} of this user's jobs that SLURM still knows
    (squeue -t all: the queued, the running and those that ended a few minutes ago); a line
    that is not squeue's is a SlurmError."""
    out = ask(["squeue", "-h", "-t", "all", "-u", getpass.getuser(), "-O",
               "JobID:30,State:24,RestartCnt:8,Reason:80"])
    queue = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line.strip())
        if not m or m.group(2) not in STATES:
            raise SlurmError(f"squeue answered {line.strip()[:80]!r}, not a job id, one of SLURM's job states, a "
                             "restart count and a reason; nothing was submitted, cancelled or recorded")
        queue[m.group(1)] = (m.group(2), int(m.group(3)) if m.group(3).isdigit() else 0, (m.group(4) or "").strip())
    return queue


class State:
    """A submitted job now: what (queued, running, ending, done, failed, cancelled), its
    restarts and the words that say why."""

    def __init__(self, what, restarts=0, why=""):
        self.what, self.restarts, self.why = what, restarts, why

    @property
    def live(self):
        return self.what in LIVE


def job_states(state_dir, registry, queue):
    """{key: State} of the submitted jobs (registry: submitted.json's), from one reading of
    the queue (read_queue) and the jobs' records: a job SLURM knows is what SLURM says (its
    record tells why a job failed); one it no longer knows is what it recorded, or failed if
    it started and recorded no end, or cancelled if it never started."""
    states = {}
    for key, rec in registry.items():
        mine = load_json(os.path.join(state_dir, "jobs", safe(key) + ".json"))
        if mine.get("job_id") != rec["job_id"]:
            mine = {}
        restarts = mine.get("restarts", 0)
        if rec["job_id"] in queue:
            word, sq_restarts, reason = queue[rec["job_id"]]
            what, words = STATES[word]
            restarts = max(restarts, sq_restarts)
            if what in LIVE:
                reason = REASONS.get(reason, reason)
            else:  # (an ended job's reason is the last one it waited for: only a failed dependency says why)
                reason = REASONS[reason] if reason == "DependencyNeverSatisfied" else ""
            if what in LIVE:
                states[key] = State(what, restarts, "; ".join(w for w in (words, reason) if w))
            elif mine.get("state") in ("done", "failed") and (what == "done") == (mine["state"] == "done"):
                states[key] = State(mine["state"], restarts, mine.get("message", ""))
            else:
                states[key] = State(what, restarts, "; ".join(w for w in (words, reason) if w))
        elif mine.get("state") in ("done", "failed"):
            states[key] = State(mine["state"], restarts, mine.get("message", ""))
        elif mine.get("state") == "running":
            states[key] = State("failed", restarts, "it started and ended without a result (killed?)")
        else:
            states[key] = State("cancelled", restarts, "it never started")
    return states
