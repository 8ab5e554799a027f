"""What the cluster says: its SLURM commands and partitions, and the state of each
submitted job (SLURM's queue, read once per command and checked, and the state the job
recorded itself)."""
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

from fairseq_localness.slurm import SlurmError, UsageError
from fairseq_localness.slurm.graph import safe

TIMEOUT_ENV = "FAIRSEQ_LOCALNESS_SLURM_TIMEOUT"


def _timeout(text):
    """The seconds of :data:`TIMEOUT_ENV` (30 where unset), or None where it is not a
    number of seconds > 0 (:func:`check_timeout` says so)."""
    try:
        seconds = float(text if text is not None else "30")
    except ValueError:
        return None
    return seconds if 0 < seconds < float("inf") else None


# How long a SLURM command may take to answer (seconds; FAIRSEQ_LOCALNESS_SLURM_TIMEOUT).
TIMEOUT = _timeout(os.environ.get(TIMEOUT_ENV))


def check_timeout():
    """A UsageError, in one line, where :data:`TIMEOUT_ENV` is not a number of seconds > 0."""
    if TIMEOUT is None:
        raise UsageError(f"{TIMEOUT_ENV}={os.environ.get(TIMEOUT_ENV)!r}: expected a number of seconds > 0 (how "
                         "long a SLURM command may take to answer; 30 where unset)")


# SLURM's largest time limit: minutes in 32 bits, below INFINITE and NO_VAL (slurm.h).
MAX_MINUTES = 0xFFFFFFFD
# The width of the job's name in squeue's listing (the run's names are far shorter).
NAME_WIDTH = 255

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
    "SPECIAL_EXIT": ("queued", "held after its requeue (SPECIAL_EXIT): 'scontrol release' starts it"),
    "CANCELLED": ("cancelled", ""), "REVOKED": ("cancelled", "revoked"),
}
LIVE = ("queued", "running", "ending")
# the states of a job that ended without its result: the jobs that need it never start
LOST = ("failed", "cancelled")
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


def load_registry(state_dir):
    """``submitted.json`` of a state directory: the jobs submitted from it; {} where there
    is none. A registry that cannot be read is a SlurmError, never "nothing submitted":
    that would submit every job again beside the live ones and forget them."""
    path = os.path.join(state_dir, "submitted.json")
    try:
        with open(path) as f:
            registry = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise SlurmError(f"{path}: cannot be read ({' '.join(str(e).split())[:120]}); it records the jobs submitted "
                         f"from {state_dir}: restore it, or cancel those jobs (squeue --me: names starting "
                         f"'{job_prefix(state_dir)}') and remove it; nothing was submitted, cancelled or "
                         "recorded") from None
    if not isinstance(registry, dict) or not all(isinstance(r, dict) and "job_id" in r for r in registry.values()):
        raise SlurmError(f"{path}: not a registry of submitted jobs (expected {{key: {{job_id: ...}}}}); nothing "
                         "was submitted, cancelled or recorded")
    return registry


def job_prefix(state_dir, path=os.path.abspath):
    """The start of the name of every job submitted from ``state_dir``: ``fl-`` and 6 hex
    digits of its absolute path (``fl-1a2b3c-``; ``path``: how the path is made
    absolute)."""
    return "fl-" + hashlib.sha1(path(state_dir).encode()).hexdigest()[:6] + "-"


def job_prefixes(state_dir):
    """The prefixes a job submitted from ``state_dir`` may carry: of its absolute path as
    given now, and with its links resolved (the same directory reached another way)."""
    return tuple({job_prefix(state_dir), job_prefix(state_dir, os.path.realpath)})


def _name_is(record, name, state_dir):
    """Whether ``name`` (from the queue) is the name of the registry's job ``record``:
    the name recorded at its submission; for a registry written before names were
    recorded, a name of the state directory's (:func:`job_prefixes`)."""
    if record.get("name"):
        return name == record["name"][:NAME_WIDTH]
    return name.startswith(job_prefixes(state_dir))


@contextlib.contextmanager
def locked(state_dir, exclusive=True):
    """The state directory's lock (``state_dir/lock``), held for the block: exclusive for
    what submits or cancels, shared for what only reads (``--status``, a local run's
    check); a submission in progress finishes before any of them reads the registry
    (waiting for it is said once on stderr). Opened for reading where shared (NFS's
    emulation of ``flock`` by ``fcntl`` needs it) and for reading and writing where
    exclusive; a lock that cannot be opened or taken is a SlurmError in one line."""
    path = os.path.join(state_dir, "lock")
    try:
        os.makedirs(state_dir, exist_ok=True)
        fd = os.open(path, (os.O_RDWR if exclusive else os.O_RDONLY) | os.O_CREAT, 0o666)
    except OSError as e:
        raise SlurmError(f"{path}: the lock of the state directory cannot be opened ({e.strerror or e}); expected "
                         "a directory this user can write (or read, for --status and a local run)") from None
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the submission in progress from {state_dir} (its lock, {path})", file=sys.stderr)
            fcntl.flock(fd, mode)
        except OSError as e:
            raise SlurmError(f"{path}: the lock of the state directory cannot be taken ({e.strerror or e})") from None
        yield
    finally:
        os.close(fd)


def need_slurm():
    missing = [c for c in ("sbatch", "squeue", "scontrol", "scancel", "sinfo") if shutil.which(c) is None]
    if missing:
        raise UsageError(f"--slurm: no SLURM commands on PATH ({', '.join(missing)} not found); expected a machine "
                         "that submits to a SLURM cluster (or scripts/slurm/local_cluster.sh start for a local one)")


def command_environment(command):
    """This process's environment without what changes what the SLURM ``command`` lists
    or acts on (its own input variables, ``SQUEUE_*``, ``SINFO_*``, ``SCANCEL_*``,
    ``SACCT_*``, ``SCONTROL_*``: a partition, account, QOS, names, states, user or format
    of the user's own; and ``SLURM_CLUSTERS``): squeue lists every job of the run, sinfo
    every partition, and scancel cancels the jobs it is given, on the cluster whose queue
    the run reads, whatever the user's shell sets for their own use of them."""
    own = os.path.basename(command).upper() + "_"
    return {k: v for k, v in os.environ.items() if not k.startswith(own) and k != "SLURM_CLUSTERS"}


def ask(cmd):
    """The standard output of a SLURM command, run in :func:`command_environment`;
    SlurmError, in one line, when it fails or does not answer within TIMEOUT seconds."""
    check_timeout()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=command_environment(cmd[0]))
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
    for line in ask(["sinfo", "-a", "-h", "-o", "%P %l"]).split("\n"):  # (-a: hidden ones too)
        if line.strip():
            name, limit = line.split()
            parts[name.rstrip("*")] = minutes_of(limit)
            if name.endswith("*"):
                parts["<default>"] = parts[name.rstrip("*")]
    return parts


def minutes_of(limit):
    """Minutes of sinfo's time limit (``[days-][hours:]minutes:seconds``; sinfo leaves out
    the leading fields that are 0: ``30:00``), None for ``infinite``."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", limit)
    if not m:
        return None  # infinite
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return ((d * 24 + h) * 60 + mi) + (s > 0)


_LINE = re.compile(r"(\d+)(?:[_+]\S*)?\s+([A-Z_]+)\s+(\d+|N/A)(?:\s+(.*))?")


class Queue(dict):
    """{job id: (SLURM state, restarts, reason)} as :func:`read_queue` reads it, with
    ``names``: {job id: the job's name}."""

    def __init__(self, entries=(), names=None):
        super().__init__(entries)
        self.names = dict(names or {})


def user():
    """The account this process runs as, by its number (not $USER or $LOGNAME, which
    squeue does not go by; a number, which squeue takes, also where the account has no
    entry in the password database, as in a container)."""
    return str(os.getuid())


def read_queue(known=None):
    """This user's jobs that SLURM still knows (squeue -t all, over every partition, hidden
    ones too: the queued, the running and those that ended a few minutes ago), as a
    :class:`Queue`. A line that is not squeue's is a SlurmError where its job is one of
    ``known`` (job ids: the registry's), or wherever ``known`` is None; another job of
    the user's that the line does not describe (a heterogeneous job's ``200+0`` parses)
    is left out."""
    out = ask(["squeue", "-h", "-a", "-t", "all", "-u", user(), "-O",
               f"JobID:30,State:24,RestartCnt:8,Name:{NAME_WIDTH},Reason:80"])
    queue = Queue()
    for line in out.splitlines():
        if not line.strip():
            continue
        m = _LINE.fullmatch(line.strip())
        if not m or m.group(2) not in STATES:
            first = re.match(r"\d+", line.strip())
            if known is None or (first and first.group(0) in known):
                raise SlurmError(f"squeue answered {line.strip()[:80]!r}, not a job id, one of SLURM's job states, "
                                 "a restart count, a reason and a name; nothing was submitted, cancelled or recorded")
            continue
        name, _, reason = (m.group(4) or "").strip().partition(" ")  # (ours have no space; the reason may)
        queue[m.group(1)] = (m.group(2), int(m.group(3)) if m.group(3).isdigit() else 0, reason.strip())
        queue.names[m.group(1)] = name
    return queue


def strangers(state_dir, registry, queue):
    """The live jobs in ``queue`` named for ``state_dir`` (:func:`job_prefix`) that the
    registry does not record (by id and name: a job that SLURM gave a recorded job's id,
    its ids restarted or wrapped around, is not that job), as ``[(job id, name)]``: a
    submission interrupted after
    sbatch queued a job and before the registry recorded it (sbatch's answer lost, the
    command killed), or a registry restored from an older copy. Submitting or running
    beside them would run a training twice."""
    prefixes, recorded = job_prefixes(state_dir), {}
    for record in registry.values():
        recorded.setdefault(record["job_id"], []).append(record)
    return [(job, name) for job, name in getattr(queue, "names", {}).items()
            if name.startswith(prefixes) and STATES[queue[job][0]][0] in LIVE
            and not any(_name_is(record, name, state_dir) for record in recorded.get(job, ()))]


def read_run(state_dir, registry):
    """The registry's jobs now, from one reading of the queue: ``(states, strangers)``,
    :func:`job_states` and :func:`strangers` of it (a failing squeue is a SlurmError
    before either)."""
    queue = read_queue({r["job_id"] for r in registry.values()})
    return job_states(state_dir, registry, queue), strangers(state_dir, registry, queue)


class State:
    """A submitted job now: what (queued, running, ending, done, failed, cancelled), its
    restarts and the words that say why."""

    def __init__(self, what, restarts=0, why=""):
        self.what, self.restarts, self.why = what, restarts, why

    @property
    def live(self):
        return self.what in LIVE

    @property
    def lost(self):
        return self.what in LOST


def job_states(state_dir, registry, queue):
    """{key: State} of the submitted jobs (registry: submitted.json's), from one reading of
    the queue (read_queue) and the jobs' records: a job SLURM knows is what SLURM says (its
    record tells why a job failed); one it no longer knows is what it recorded, or failed if
    it started and recorded no end, or cancelled if it never started. A job id in the
    queue under another name than the job's (:func:`_name_is`; where the queue has names)
    is another job that SLURM gave the same id (its ids restarted or wrapped around),
    not this one."""
    states = {}
    names = getattr(queue, "names", None)
    for key, rec in registry.items():
        mine = load_json(os.path.join(state_dir, "jobs", safe(key) + ".json"))
        if mine.get("job_id") != rec["job_id"]:
            mine = {}
        restarts = mine.get("restarts", 0)
        ours = rec["job_id"] in queue and (names is None or _name_is(rec, names.get(rec["job_id"], ""), state_dir))
        if ours:
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
