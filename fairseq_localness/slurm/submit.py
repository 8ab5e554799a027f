"""Submitting a job graph: the options checked against the cluster, each job's
resources and dependencies, the jobs that are neither done nor queued nor running
submitted through submitit (or, with --dry-run, printed)."""
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import time

from fairseq_localness.slurm import UsageError
from fairseq_localness.slurm.cluster import job_states, load_json, need_slurm, partitions
from fairseq_localness.slurm.graph import read_graph, safe
from fairseq_localness.slurm.jobs import FinalStep, Step, TrainStep


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
