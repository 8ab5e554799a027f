"""Running the pipeline's jobs on a SLURM cluster, through submitit.

The reproduce drivers (scripts/reproduce/*.sh --slurm) and scripts/train.sh --slurm write
a job graph and hand it to this module, which submits it at once with SLURM
dependencies and returns; --status and --cancel read what it recorded. See
docs/slurm.md.

    python -m fairseq_localness.slurm submit --graph FILE --state-dir DIR [options] [--dry-run]
    python -m fairseq_localness.slurm status --graph FILE --state-dir DIR
    python -m fairseq_localness.slurm cancel --state-dir DIR

The graph (tab-separated lines, written by scripts/reproduce/slurm.sh):

    ROW  <row> <seed> <run dir> <score file> <dataset>
    JOB  <key> <kind> <row> <seed> <nodes> <tasks per node> <gpus per node> <keys it needs, space-separated>
    CMD  <key> <a shell command, quoted for bash>

kind: prepare (a dataset's data, once), train (one row and seed: nodes x tasks, one
fairseq-train per task, started by fairseq from SLURM's environment), eval (average,
decode, score), final (the significance tests and the table, after every evaluation,
whatever became of it). A train job is checkpointable: when SLURM warns it of its time
limit or of a preemption (SIGUSR2, --signal-delay seconds ahead), submitit requeues it,
and a job requeued by anyone (scontrol requeue, a node failure) runs its command again,
which resumes from the row's checkpoint_last.pt (train.sh). Requeues are counted
(SLURM_RESTART_COUNT) and bounded (--max-requeues).

Every job records its state in DIR/jobs/<key>.json (running, done, failed with its
log's last line); DIR/submitted.json maps each key to its job id and log. A job's log
is DIR/logs/<job id>_<task>_log.err: its commands' output and errors (fairseq's
progress, "Loaded checkpoint ... (epoch E @ U updates)" after a requeue, distributed
init), submitit's and SLURM's messages.
"""
import argparse
import fcntl
import getpass
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

PROG = "slurm"
LIVE = {"PENDING": "queued", "REQUEUED": "queued", "REQUEUE_HOLD": "queued", "REQUEUE_FED": "queued",
        "CONFIGURING": "running", "RUNNING": "running", "COMPLETING": "running", "SUSPENDED": "queued",
        "STAGE_OUT": "running", "RESIZING": "running", "SIGNALING": "running", "RESV_DEL_HOLD": "queued"}
ENDED = {"COMPLETED": "done", "FAILED": "failed", "TIMEOUT": "failed", "CANCELLED": "cancelled",
         "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "BOOT_FAIL": "failed", "DEADLINE": "failed",
         "PREEMPTED": "failed", "REVOKED": "cancelled", "SPECIAL_EXIT": "failed"}


class UsageError(Exception):
    """A bad input: printed as 'PROG: error: MESSAGE', exit status 2, nothing submitted."""


# ------------------------------------------------------------------ the graph
class Job:
    def __init__(self, key, kind, row, seed, nodes, tasks, gpus, needs):
        self.key, self.kind, self.row, self.seed = key, kind, row, seed
        self.nodes, self.tasks, self.gpus = int(nodes), int(tasks), int(gpus)
        self.needs = needs.split()
        self.commands = []


def read_graph(path):
    """(rows, jobs): rows a list of (row, seed, run dir, score file, dataset); jobs a dict key -> Job,
    in the order of the file (each job after the jobs it needs)."""
    rows, jobs = [], {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if fields[0] == "ROW":
                if tuple(fields[1:]) not in rows:
                    rows.append(tuple(fields[1:]))
            elif fields[0] == "JOB":
                if fields[1] not in jobs:
                    jobs[fields[1]] = Job(*fields[1:9])
            elif fields[0] == "CMD":
                jobs[fields[1]].commands.append(fields[2])
    for job in jobs.values():
        job.needs = [k for k in job.needs if k in jobs]
    return rows, {k: j for k, j in jobs.items() if j.commands}


def safe(key):
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", key)


# ------------------------------------------------------------------ what runs in a job
def _last_line(path):
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read().splitlines()[-200:] if line.strip()]
    except OSError:
        return ""
    lines = [line for line in lines if not line.startswith("submitit ")]
    return lines[-1] if lines else ""


class Step:
    """A job's commands (bash), one after the other; the job fails at the first that fails.
    Run by submitit in every task of the job (train jobs: one per process); the job's state
    is written by task 0."""

    def __init__(self, key, commands, state_dir, max_requeues=0):
        self.key, self.commands, self.state_dir, self.max_requeues = key, commands, state_dir, max_requeues

    def _write(self, **state):
        if int(os.environ.get("SLURM_PROCID", "0")) != 0 and state.get("state") != "failed":
            return  # (task 0 writes the job's state; any task its failure)
        path = os.path.join(self.state_dir, "jobs", safe(self.key) + ".json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        state.update(job_id=os.environ.get("SLURM_JOB_ID", ""), restarts=int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                     time=time.time())
        with open(path + ".tmp", "w") as f:
            json.dump(state, f)
        os.replace(path + ".tmp", path)

    def __call__(self):
        import submitit

        log = str(submitit.JobEnvironment().paths.stderr)
        restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
        if restarts > self.max_requeues:
            message = (f"requeued {restarts} times, more than --max-requeues {self.max_requeues}; "
                       f"submit again to go on from the last checkpoint")
            self._write(state="failed", message=message, log=log)
            raise RuntimeError(message)
        self._write(state="running", log=log)
        if restarts:
            print(f"{self.key}: requeued ({restarts} of at most {self.max_requeues}); the command resumes from "
                  "the last checkpoint", file=sys.stderr, flush=True)
        stopping = []
        # SLURM stops a job it requeues or cancels with SIGTERM (then SIGKILL): the command
        # ends, and this task waits to be stopped instead of reporting a failure
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        for cmd in self.commands:
            print("+ " + cmd, file=sys.stderr, flush=True)
            # (its output in the job's one log: fairseq logs to stdout, "Loaded checkpoint ..." included)
            child = subprocess.Popen(["bash", "-c", cmd], start_new_session=True, stdout=sys.stderr,
                                     preexec_fn=lambda: signal.signal(signal.SIGUSR2, signal.SIG_IGN))
            try:
                rc = child.wait()
            finally:  # (submitit's requeue on SIGUSR2 leaves through here)
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGTERM)
                    try:
                        child.wait(30)
                    except subprocess.TimeoutExpired:
                        os.killpg(child.pid, signal.SIGKILL)
            if rc != 0:
                if stopping:  # stopped by SLURM (a requeue, a cancel, another task's failure)
                    time.sleep(60)  # (SLURM's SIGKILL usually comes first)
                    raise RuntimeError(f"{self.key}: stopped by SLURM (SIGTERM)")
                sys.stderr.flush()
                message = _last_line(log) or f"exit status {rc}"
                self._write(state="failed", message=f"exit status {rc}: {message}", log=log)
                raise RuntimeError(f"{self.key}: '{cmd}' failed with exit status {rc}: {message}")
        self._write(state="done", log=log)
        return "done"


try:  # the train jobs are checkpointable: requeued with the same command on a timeout or preemption
    from submitit.helpers import Checkpointable
except ImportError:  # (submitit is only needed where jobs are submitted or run)
    Checkpointable = object


class TrainStep(Step, Checkpointable):
    """A row's training: on SIGUSR2 (time limit or preemption) submitit calls checkpoint(),
    which requeues this same step: train.sh resumes from the row's last checkpoint."""

    def checkpoint(self, *args, **kwargs):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


class FinalStep(Step):
    """The significance tests and the table: the commands that can run (a test whose rows
    failed is left out), each row without results marked failed (RUN/FAILED) first."""

    def __init__(self, key, commands, state_dir, rows, table_command):
        super().__init__(key, commands, state_dir)
        self.rows, self.table_command = rows, table_command

    def __call__(self):
        registry = load_json(os.path.join(self.state_dir, "submitted.json"))
        for row, seed, run_dir, score, _ in self.rows:
            failed = os.path.join(run_dir, "FAILED")
            if os.path.exists(score):
                if os.path.exists(failed):
                    os.remove(failed)
                continue
            reasons = []
            for kind in ("prepare", "train", "eval"):
                for key, rec in registry.items():
                    if rec.get("kind") != kind or (kind != "prepare" and (rec["row"], rec["seed"]) != (row, seed)):
                        continue
                    st = load_json(os.path.join(self.state_dir, "jobs", safe(key) + ".json"))
                    if st.get("state") == "failed":
                        reasons.append(f"{kind} job {rec['job_id']}: {st.get('message', '')}")
            os.makedirs(run_dir, exist_ok=True)
            with open(failed, "w") as f:
                f.write((reasons[0] if reasons else "no results: a job it needed failed or was cancelled") + "\n")
        ok = True
        for cmd in self.commands:
            print("+ " + cmd, file=sys.stderr, flush=True)
            if subprocess.run(["bash", "-c", cmd], stdout=sys.stderr).returncode != 0:
                ok = False  # a test of a failed row: the table says it
        print("+ " + self.table_command, file=sys.stderr, flush=True)
        rc = subprocess.run(["bash", "-c", self.table_command], stdout=sys.stderr).returncode
        self._write(state="done" if rc == 0 else "failed", message="" if rc == 0 else f"the table: exit status {rc}")
        if rc:
            raise RuntimeError(f"the table failed (exit status {rc})")
        return "done" if ok else "done (some tests could not run)"


# ------------------------------------------------------------------ the cluster
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


# ------------------------------------------------------------------ submit
def resources(job, opts):
    """submitit's SlurmExecutor parameters of a job."""
    params = dict(job_name=f"{opts.name}-{safe(job.key)}", nodes=job.nodes if job.kind == "train" else 1,
                  ntasks_per_node=job.tasks if job.kind == "train" else 1, signal_delay_s=opts.signal_delay,
                  time=opts.time_minutes)
    gpus = job.gpus if job.kind == "train" else (1 if job.gpus and job.kind == "eval" else 0)
    if gpus:
        params["gpus_per_node"] = gpus
    for name in ("partition", "cpus_per_task", "mem", "account", "qos", "constraint"):
        if getattr(opts, name):
            params[name] = getattr(opts, name)
    extra = dict(a.split("=", 1) for a in opts.slurm_arg)
    if job.kind in ("train", "eval"):
        extra.setdefault("kill-on-invalid-dep", "yes")
    if job.kind == "train":
        extra.setdefault("requeue", True)
    params["additional_parameters"] = extra
    return params


def describe(params, deps):
    keys = ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "mem", "time", "partition", "account",
            "qos", "constraint")
    words = [f"{k.replace('_', '-')}={params[k]}" for k in keys if params.get(k) not in (None, "")]
    words += [f"{k}={v}" for k, v in params["additional_parameters"].items()]
    if deps:
        words.append("dependency=" + deps)
    return " ".join(words)


def time_minutes(value, delay):
    """--time in SLURM's formats (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS), in
    whole minutes; too short when less than 30 s remain before the warning."""
    m = re.fullmatch(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?", value)
    if not m:
        raise UsageError(f"--time: expected a SLURM time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS; "
                         f"got '{value}'")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:
        seconds = ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    elif c is not None:
        seconds = (a * 60 + b) * 60 + c
    elif b is not None:
        seconds = a * 60 + b
    else:
        seconds = a * 60
    if seconds - delay < 30:
        raise UsageError(f"--time {value}: too short for one validation: a job is told to save and requeue "
                         f"--signal-delay {delay} s before its limit; expected at least {delay + 30} s "
                         f"({-(-(delay + 30) // 60)} min), or a shorter --signal-delay")
    return -(-seconds // 60)


def check(args):
    """The options and the cluster: SLURM's commands, the partition, --time against its limit."""
    if args.signal_delay < 10:
        raise UsageError(f"--signal-delay: expected a whole number >= 10, got '{args.signal_delay}'")
    if args.time and not isinstance(args.time, int):
        args.time = time_minutes(args.time, args.signal_delay)
    for a in args.slurm_arg:
        if not re.fullmatch(r"[a-z][a-z0-9-]*=.*", a):
            raise UsageError(f"--slurm-arg: expected KEY=VALUE with an sbatch option's long name as KEY "
                             f"(e.g. exclude=node7, mail-type=END), got '{a}'")
    need_slurm()
    parts = partitions()
    if args.partition and args.partition not in parts:
        raise UsageError(f"--partition: unknown partition '{args.partition}'; this cluster's: "
                         f"{' '.join(p for p in parts if p != '<default>')}")
    limit = parts.get(args.partition or "<default>")
    if args.time and limit and args.time > limit:
        raise UsageError(f"--time {args.time}: longer than partition {args.partition or '(default)'}'s limit of "
                         f"{limit} minutes; expected at most {limit}")
    args.time_minutes = args.time or limit or 7 * 24 * 60


def submit(args):
    check(args)
    rows, jobs = read_graph(args.graph)
    args.name = "fl-" + hashlib.sha1(os.path.abspath(args.state_dir).encode()).hexdigest()[:6]
    os.makedirs(args.state_dir, exist_ok=True) if not args.dry_run else None
    lock = open(os.path.join(args.state_dir, "lock"), "w") if not args.dry_run else None
    if lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one submission at a time: no duplicate jobs
    reg_path = os.path.join(args.state_dir, "submitted.json")
    registry = load_json(reg_path)
    states = job_states(args.state_dir, {k: r for k, r in registry.items() if k in jobs})
    ids, new, kept, train_k = {}, [], [], 0
    for key, job in jobs.items():
        st = states.get(key, ("", 0, ""))[0]
        if st in ("queued", "running", "done") and not (key == "final" and new):
            kept.append((key, st))
            if st != "done":
                ids[key] = registry[key]["job_id"]
            continue
        if key == "final" and st == "queued" and new and not args.dry_run:
            # the table waits for the new jobs too: the queued one is replaced
            subprocess.run(["scancel", registry[key]["job_id"]], timeout=60)
        deps = [ids[k] for k in job.needs if k in ids]
        if job.kind == "final":
            dep = "afterany:" + ":".join(ids[k] for k in jobs if k != "final" and k in ids) if len(ids) else ""
        else:
            dep = "afterok:" + ":".join(deps) if deps else ""
        params = resources(job, args)
        if job.kind == "train" and args.max_running:
            params["job_name"] = f"{args.name}-train-lane{train_k % args.max_running}"
            dep = ",".join(d for d in (dep, "singleton") if d)
            train_k += 1
        if job.kind == "final":
            cmds = [c for c in job.commands if not c.startswith("#table ")]
            table = [c[len("#table "):] for c in job.commands if c.startswith("#table ")][0]
            step = FinalStep(key, cmds, os.path.abspath(args.state_dir), rows, table)
        elif job.kind == "train":
            step = TrainStep(key, job.commands, os.path.abspath(args.state_dir), args.max_requeues)
        else:
            step = Step(key, job.commands, os.path.abspath(args.state_dir))
        if args.dry_run:
            print(f"job {key} ({job.kind}): {describe(params, dep)}")
            for c in job.commands:
                print("    " + (c[len('#table '):] if c.startswith("#table ") else c))
            ids[key] = f"<{key}>"
            new.append(key)
            continue
        if dep:
            params["dependency"] = dep
        import submitit

        folder = os.path.join(os.path.abspath(args.state_dir), "logs")
        executor = submitit.SlurmExecutor(folder=folder, max_num_timeout=args.max_requeues)
        executor.update_parameters(**params)
        sjob = executor.submit(step)
        ids[key] = sjob.job_id
        registry[key] = dict(job_id=sjob.job_id, kind=job.kind, row=job.row, seed=job.seed,
                             log=str(sjob.paths.stderr).replace("%t", "0"), submitted=time.time())
        with open(reg_path + ".tmp", "w") as f:
            json.dump(registry, f, indent=1)
        os.replace(reg_path + ".tmp", reg_path)
        new.append(key)
        print(f"{args.prog}: submitted {key}: job {sjob.job_id}" + (f" (after {dep})" if dep else ""),
              file=sys.stderr)
    if args.dry_run:
        for key, st in kept:
            print(f"job {key}: {st}, not submitted again")
        print(f"# {len(new)} job(s) to submit, {len(kept)} done, queued or running; nothing submitted (--dry-run)")
        return
    print(f"{args.prog}: {len(new)} job(s) submitted, {len(kept)} done, queued or running"
          + (f": {', '.join(k + ' ' + s for k, s in kept)}" if kept else "")
          + f"; '{args.prog} ... --status' shows them", file=sys.stderr)


# ------------------------------------------------------------------ status and cancel
def last_update(log):
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    m = re.findall(r'num_updates"?: "?(\d+)', text)
    return int(m[-1]) if m else None


def status(args):
    rows, jobs = read_graph(args.graph)
    registry = load_json(os.path.join(args.state_dir, "submitted.json"))
    if not registry:
        print(f"{args.prog}: nothing submitted from {args.state_dir} yet")
        return
    need_slurm()
    states = job_states(args.state_dir, registry)
    for row, seed, run_dir, score, dataset in rows:
        mine = [k for k, r in registry.items() if r["kind"] in ("train", "eval") and (r["row"], r["seed"]) == (row, seed)]
        prep = [k for k in registry if k == f"prepare:{dataset}"]
        keys = prep + sorted(mine, key=lambda k: ("train" not in k, k))
        bleu = load_json(score).get("score") if os.path.exists(score) else None
        st = [states[k] for k in keys]
        restarts = max([s[1] for k, s in zip(keys, st) if k.startswith("train:")] or [0])
        failed = [(k, s) for k, s in zip(keys, st) if s[0] in ("failed", "cancelled")]
        if bleu is not None and not any(s[0] in ("queued", "running") for s in st):
            state = "done"
        elif failed:
            k, s = failed[0]
            state = f"failed ({k.split(':')[0]} job {registry[k]['job_id']} {s[0]}: {s[2]})"
        elif any(s[0] == "running" for s in st):
            state = "running"
        elif keys:
            state = "queued"
        else:
            state = "not submitted"
        if restarts and not state.startswith("done"):
            state += f", requeued {restarts} time{'s' if restarts > 1 else ''}"
        elif restarts:
            state += f" (requeued {restarts} time{'s' if restarts > 1 else ''})"
        upd = last_update(os.path.join(run_dir, "train.log"))
        active = next((k for k, s in zip(keys, st) if s[0] in ("running", "failed", "cancelled")), keys[-1] if keys else None)
        log = registry[active]["log"] if active else "-"
        print(f"{row} seed {seed}: {state}; jobs {' '.join(registry[k]['job_id'] for k in keys) or '-'}; "
              f"update {upd if upd is not None else '-'}; BLEU {'%.2f' % bleu if bleu is not None else '-'}; "
              f"log {log}")
    if "final" in registry:
        s = states["final"]
        print(f"table: {s[0]}; job {registry['final']['job_id']}; log {registry['final']['log']}")


def cancel(args):
    registry = load_json(os.path.join(args.state_dir, "submitted.json"))
    need_slurm()
    states = job_states(args.state_dir, registry)
    live = [registry[k]["job_id"] for k, s in states.items() if s[0] in ("queued", "running")]
    if live:
        subprocess.run(["scancel", *live], check=True, timeout=60)
    print(f"{args.prog}: cancelled {len(live)} job(s)" + (f": {' '.join(live)}" if live else ""))


def add_resources(s):
    s.add_argument("--partition")
    s.add_argument("--nodes", type=int, default=1)
    s.add_argument("--gpus-per-node", type=int, default=1)
    s.add_argument("--cpus-per-task", type=int)
    s.add_argument("--mem")
    s.add_argument("--time")
    s.add_argument("--account")
    s.add_argument("--qos")
    s.add_argument("--constraint")
    s.add_argument("--max-running", type=int)
    s.add_argument("--max-requeues", type=int, default=3)
    s.add_argument("--signal-delay", type=int, default=90)
    s.add_argument("--slurm-arg", action="append", default=[])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_localness.slurm", description=__doc__.split("\n")[0])
    p.add_argument("--prog", default=PROG)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("submit")
    c = sub.add_parser("check")
    s.add_argument("--graph", required=True)
    s.add_argument("--state-dir", required=True)
    s.add_argument("--dry-run", action="store_true")
    for s in (s, c):
        add_resources(s)
    for name in ("status", "cancel"):
        q = sub.add_parser(name)
        q.add_argument("--graph")
        q.add_argument("--state-dir", required=True)
    args = p.parse_args(argv)
    try:
        {"submit": submit, "status": status, "cancel": cancel, "check": check}[args.cmd](args)
    except UsageError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
