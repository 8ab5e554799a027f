"""Submitting a job graph: the options checked against the cluster, each job's
resources and dependencies, the jobs that are neither done nor queued nor running
submitted through submitit (or, with --dry-run, printed)."""
import contextlib
import io
import json
import os
import shutil
import sys
import time

from fairseq_localness.atomic import write_text
from fairseq_localness.slurm import CONTROL_CHARACTERS, SlurmError, UsageError, check_slurm_arg, cluster
from fairseq_localness.slurm.cluster import (
    MAX_MINUTES, ask, job_prefix, load_registry, locked, need_slurm, partitions, read_run,
)
from fairseq_localness.slurm.graph import read_graph, safe, write_rows
from fairseq_localness.slurm.jobs import FinalStep, Step, TrainStep
from fairseq_localness.slurm.times import time_minutes


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
        extra["kill-on-invalid-dep"] = "yes"
    if job.kind == "train":
        extra["requeue"] = True
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


# sbatch's input variables (sbatch(1), INPUT ENVIRONMENT VARIABLES) override the options
# of the job's script, where submitit writes the graph's: those of an option the graph
# sets are refused (SBATCH_ARRAY_INX=0-1 queued two trainings of one row; SBATCH_TIMELIMIT
# and SBATCH_NO_REQUEUE left a job queued for ever past its partition's limit, unable to
# requeue), and those of an option of the driver's must agree with it where it is given
GRAPH_VARIABLES = {
    "SBATCH_ARRAY_INX": "array", "SBATCH_CLUSTERS": "clusters", "SBATCH_ERROR": "error", "SBATCH_OUTPUT": "output",
    "SBATCH_OPEN_MODE": "open-mode", "SBATCH_SIGNAL": "signal", "SBATCH_REQUEUE": "requeue",
    "SBATCH_NO_REQUEUE": "no-requeue", "SBATCH_WAIT": "wait", "SBATCH_JOB_NAME": "job-name", "SBATCH_GPUS": "gpus",
    "SBATCH_GPUS_PER_NODE": "gpus-per-node", "SBATCH_GPUS_PER_TASK": "gpus-per-task", "SBATCH_GRES": "gres",
    "SBATCH_MEM_PER_CPU": "mem-per-cpu", "SBATCH_MEM_PER_GPU": "mem-per-gpu", "SBATCH_CPUS_PER_GPU": "cpus-per-gpu",
    "SBATCH_WCKEY": "wckey", "SBATCH_TIMELIMIT": "time", "SBATCH_EXPORT": "export",
    "SBATCH_GET_USER_ENV": "get-user-env", "SLURM_CLUSTERS": "clusters",
}
OPTION_VARIABLES = {"SBATCH_PARTITION": "partition", "SBATCH_ACCOUNT": "account", "SBATCH_QOS": "qos",
                    "SBATCH_CONSTRAINT": "constraint", "SBATCH_MEM_PER_NODE": "mem"}


def check_sbatch_environment(args):
    """The environment's sbatch variables (:data:`GRAPH_VARIABLES`, :data:`OPTION_VARIABLES`):
    none of an option the graph sets (a UsageError naming it); one of the driver's
    options the same as the option where that is given, and taken as the option where it
    is not (``SBATCH_PARTITION``: the partition whose time limit --time is checked against)."""
    for variable, option in GRAPH_VARIABLES.items():
        if os.environ.get(variable):
            why = {"job-name": "name the jobs otherwise than the run follows them in the queue",
                   "clusters": "submit to another cluster than the one whose queue the run reads",
                   "time": "give the jobs another time limit than --time (or the partition's) that the run checked",
                   "export": "run the jobs without the environment they are submitted from"}.get(
                       option, f"set --{option}, which the job graph sets itself or which contradicts what it "
                       "sets")
            raise UsageError(f"{variable}={os.environ[variable]!r} is set: sbatch would {why} (its variables "
                             f"override the options of a job's script); expected it unset (env -u {variable} ...)")
    for variable, option in OPTION_VARIABLES.items():
        value, given = os.environ.get(variable), getattr(args, option, None)
        if not value:
            continue
        if given is None:
            setattr(args, option, value)
        elif str(given) != value:
            raise UsageError(f"{variable}={value!r} is set and --{option} is {given!r}: sbatch would take the "
                             f"variable's (its variables override the options of a job's script); expected the same "
                             f"value, or either one alone")


def check(args):
    """The options and the cluster: SLURM's commands, the partition, --time against its limit
    (and SLURM's), every --slurm-arg (check_slurm_arg)."""
    if args.signal_delay < 10:
        raise UsageError(f"--signal-delay: expected a whole number >= 10, got '{args.signal_delay}'")
    check_sbatch_environment(args)
    for name in ("partition", "mem", "account", "qos", "constraint"):
        value = getattr(args, name, None)
        if value and CONTROL_CHARACTERS.search(str(value)):
            raise UsageError(f"--{name.replace('_', '-')}: {str(value)!r} has a line break or another control "
                             "character; each of sbatch's options is one line of the job's script: expected a value "
                             "without one")
    if args.time and not isinstance(args.time, int):
        try:
            args.time = time_minutes(args.time, args.signal_delay)
        except ValueError as e:
            raise UsageError(str(e)) from None
    if args.time and args.time > MAX_MINUTES:
        raise UsageError(f"--time: {args.time} minutes is past SLURM's largest time limit ({MAX_MINUTES} minutes); "
                         "expected at most that, or no --time for the partition's limit")
    for a in args.slurm_arg:
        check_slurm_arg(a)
    need_slurm()
    parts = partitions()
    named = args.partition.split(",") if args.partition else []  # (sbatch takes a list: the first that can)
    unknown = [p for p in named if p not in parts]
    if unknown:
        raise UsageError(f"--partition: unknown partition '{unknown[0]}'; this cluster's: "
                         f"{' '.join(p for p in parts if p != '<default>')}")
    # (a time within the limit of one of the partitions listed runs there; without --time a job
    # gets the smallest limit, which each of them takes)
    limits = [parts[p] for p in named] if named else [parts.get("<default>")]
    limit = None if None in limits else max(limits)
    if args.time and limit and args.time > limit:
        which = args.partition if named else "(default)"
        raise UsageError(f"--time {args.time}: longer than partition {which}'s limit of "
                         f"{limit} minutes; expected at most {limit}")
    args.time_minutes = args.time or min((x for x in limits if x), default=None) or 7 * 24 * 60


def write_json(path, value):
    write_text(path, json.dumps(value, indent=1))


def submit(args):
    """Submit the graph's jobs that are not live (queued, running or ending: never twice),
    whatever their records say (the graph holds the steps whose outputs are missing), and the
    table job again when anything else is submitted, after every live job of the state
    directory (every submission's rows)."""
    state_dir = os.path.abspath(args.state_dir)
    if "\n" in state_dir or "\r" in args.state_dir:
        raise UsageError(f"--work-dir: {args.state_dir!r} has a line break; SLURM's job scripts take one line per "
                         "option: expected a directory without one")
    if "%" in state_dir or "\\" in state_dir:
        raise UsageError(f"{state_dir!r}, the run's SLURM state directory, has a '%' or a "
                         "backslash; sbatch reads the jobs' log paths as patterns ('%j' is the job id, a backslash "
                         "turns the patterns off), so the logs would be written elsewhere than the run reads them: "
                         "expected a --work-dir (train.sh: --save-dir) whose absolute path has neither")
    check(args)
    rows, jobs = read_graph(args.graph)
    args.name = job_prefix(args.state_dir)[:-1]
    if args.dry_run:
        return _submit(args, rows, jobs, state_dir)
    with locked(state_dir):  # one submission at a time: no duplicate jobs
        return _submit(args, rows, jobs, state_dir)


def _submit(args, rows, jobs, state_dir):
    reg_path = os.path.join(state_dir, "submitted.json")
    registry = load_registry(state_dir)
    states, found = read_run(state_dir, registry)  # (a failing squeue stops here: nothing submitted)
    if found:
        raise SlurmError(f"{', '.join(f'job {j} ({n})' for j, n in found)}: queued or running, named for {state_dir}, "
                         f"and not recorded in {reg_path} (a submission interrupted after sbatch queued them?); "
                         f"submitting now could run a training twice: 'scancel {' '.join(j for j, _ in found)}' if "
                         "they are this run's, or wait for them to end; nothing was submitted, cancelled or recorded")
    datasets = {(r[0], r[1]): r[4] for r in rows}
    # the plan: what is live stays; the rest of the graph is submitted, the table last
    live = {k for k in jobs if k != "final" and k in states and states[k].live}
    short = [k for k in jobs if k in live and jobs[k].kind == "prepare" and "commands" in registry[k]
             and not set(jobs[k].commands) <= set(registry[k]["commands"])]
    if short:
        named = ", ".join(f"{k} (job {registry[k]['job_id']}, {states[k].what})" for k in short)
        raise SlurmError(
            f"{named}: live, {'it prepares' if len(short) == 1 else 'they prepare'} this dataset for other rows, "
            "without all that these rows need (another direction or vocabulary); they would wait for it and find "
            "their data missing: submit them once it has ended (--status shows it); nothing was submitted, "
            "cancelled or recorded")
    replaced = waiting_for_resubmitted(jobs, states, live, registry)
    live -= replaced
    kept = [(k, states[k].what) for k in jobs if k in live]
    todo = [k for k in jobs if k != "final" and k not in live]
    final = states.get("final")
    if "final" in jobs and (todo or final is None or final.lost):
        todo.append("final")
    elif "final" in jobs:
        kept.append(("final", final.what))
    if len(todo) > args.max_jobs:
        raise UsageError(f"{len(todo)} jobs to submit, more than --max-jobs {args.max_jobs} (a guard against "
                         f"flooding the queue); give --max-jobs {len(todo)} to submit them")
    ids = {k: registry[k]["job_id"] for k in registry
           if k in states and states[k].live and k != "final" and k not in replaced}
    previous = {registry[k]["job_id"] for k in todo if k in registry}  # (the job ids replaced now)
    new, train_k, cancelled = [], 0, []
    if not args.dry_run:  # (the graph kept for reading, the rows for the table job)
        if os.path.abspath(args.graph) != os.path.join(state_dir, "graph.tsv"):
            shutil.copyfile(args.graph, os.path.join(state_dir, "graph.tsv"))
        write_rows(state_dir, rows)
        if "final" in todo and final is not None and final.what == "queued":
            # the table waits for the new jobs too: the queued one is replaced, first (cancelling a replaced
            # job could otherwise end the last job it waits for and start it); a running one ends as it is
            _cancel(registry, "final", "the queued table job", new, cancelled)
    for key in todo:
        job = jobs[key]
        if job.kind == "final":  # after every live job of the state directory, whichever submission's
            dep = "afterany:" + ":".join(ids[k] for k in ids) if ids else ""
        else:
            after = [ids[k] for k in job.needs if k in ids]  # (recorded: waiting_for_resubmitted)
            dep = "afterok:" + ":".join(after) if after else ""
        params = resources(job, args)
        if job.kind == "train" and args.max_running:
            params["job_name"] = f"{args.name}-train-lane{train_k % args.max_running}"
            dep = ",".join(d for d in (dep, "singleton") if d)
            train_k += 1
        if job.kind == "final":
            cmds = [c for c in job.commands if not c.startswith("#table ")]
            if final is not None and final.what == "queued":  # (the tests of the table job it replaces, too)
                cmds = [c for c in registry["final"].get("commands", []) if c not in cmds] + cmds
            table = [c[len("#table "):] for c in job.commands if c.startswith("#table ")][0]
            step = FinalStep(key, cmds, state_dir, table)
        elif job.kind == "train":
            step = TrainStep(key, job.commands, state_dir, args.max_requeues)
        else:
            step = Step(key, job.commands, state_dir)
        if args.dry_run:
            print(f"job {key} ({job.kind}): {describe(params, dep)}" + (
                f" (replacing queued job {registry[key]['job_id']}, which waits for a job that failed, was "
                "cancelled or was submitted again)" if key in replaced else ""))
            for c in job.commands:
                print("    " + (c[len('#table '):] if c.startswith("#table ") else c))
            ids[key] = f"<{key}>"
            new.append(key)
            continue
        if dep:
            params["dependency"] = dep
        if key in replaced:  # (a queued job for the new job it needs)
            _cancel(registry, key, f"the queued {key} job", new, cancelled)
        try:
            ids[key] = sbatch(step, params, state_dir, args.max_requeues, key, new)
        except SlurmError as e:
            if not cancelled:
                raise
            raise SlurmError(f"{e}; cancelled to be replaced: {', '.join(cancelled)}; submit again to finish") from None
        registry[key] = dict(job_id=ids[key], name=params["job_name"], kind=job.kind, row=job.row, seed=job.seed,
                             dataset=datasets.get((job.row, job.seed), ""),
                             log=os.path.join(state_dir, "logs", f"{ids[key]}_0_log.err"), submitted=time.time())
        if job.kind == "final":
            registry[key]["commands"] = cmds
        else:
            registry[key]["after"] = after
        if job.kind == "prepare":  # (what a later submission sharing the job needs of it: the check above)
            registry[key]["commands"] = list(job.commands)
        write_json(reg_path, registry)
        new.append(key)
        print(f"{args.prog}: submitted {key}: job {ids[key]}" + (f" (after {dep})" if dep else ""), file=sys.stderr)
    left = stranded(jobs, states, registry, previous)
    left_line = (f"{len(left)} queued job(s) of rows not in this submission wait, directly or through "
                 f"one another, for a job that {'would be' if args.dry_run else 'is'} submitted again now (they would "
                 f"not wait for the new one) or that failed or was cancelled (SLURM cancels them): {', '.join(left)}; "
                 "submit their rows again (the driver without --only and --seeds, or with theirs) to replace them"
                 ) if left else ""
    if args.dry_run:
        for key, st in kept:
            print(f"job {key}: {st}, not submitted again")
        if left:
            print(f"# {left_line}")
        print(f"# {len(new)} job(s) to submit, {len(kept)} queued, running or done; nothing submitted (--dry-run)")
        return
    print(f"{args.prog}: {len(new)} job(s) submitted, {len(kept)} queued, running or done"
          + (f": {', '.join(k + ' ' + s for k, s in kept)}" if kept else "")
          + (f"; {len(replaced)} queued job(s) cancelled and submitted again after the new job(s) they wait for: "
             f"{', '.join(k for k in jobs if k in replaced)}" if replaced else "")
          + (f"; {left_line}" if left else "")
          + f"; '{args.prog} ... --status' shows them, '{args.prog} ... --cancel' cancels them", file=sys.stderr)


def stranded(jobs, states, registry, previous):
    """The queued jobs of the registry that are not in this submission's graph ``jobs``
    (other rows', submitted before), as ``key (job id)`` in the registry's order, that
    wait (their recorded ``after``) for a job this submission submits again
    (``previous``: the job ids it replaces; they would not wait for the new one), for
    one that failed or was cancelled (SLURM cancels them: ``--kill-on-invalid-dep``),
    or for another job named here (an evaluation queued after a training that waits
    for a replaced job). This submission has not their steps to replace them; a
    submission of their rows does (:func:`waiting_for_resubmitted`). Jobs that wait for
    a job an earlier submission replaced were named by that one."""
    ended = set(previous) | {record["job_id"] for key, record in registry.items()
                             if key in states and states[key].lost}
    queued = [key for key in registry
              if key not in jobs and key != "final" and key in states and states[key].what == "queued"]
    left, grew = set(), True
    while grew:  # (the registry's order need not follow the dependencies)
        grew = False
        for key in queued:
            if key not in left and ended.intersection(registry[key].get("after") or ()):
                left.add(key)
                ended.add(registry[key]["job_id"])
                grew = True
    return [f"{key} (job {registry[key]['job_id']})" for key in queued if key in left]


def waiting_for_resubmitted(jobs, states, live, registry):
    """The queued jobs of ``jobs`` (the graph's, in its order) that wait for a job SLURM
    will never count as done, or not for the job the run now has: a job they need that
    failed, was cancelled or was never submitted (submitted now), one that is itself
    replaced, or one submitted again since they were queued (its job id not among those
    the registry records that they wait for, ``after``: a submission stopped halfway).
    Each is cancelled and submitted again after the new job it needs, as the table job
    is. A job it needs that is done (submitted again only where its outputs are missing)
    or live, and was queued before it, leaves it as it is."""
    replaced = set()
    for key, job in jobs.items():
        if key not in live or states[key].what != "queued":
            continue
        after = registry.get(key, {}).get("after")
        for need in job.needs:
            if need not in jobs:
                continue
            ended = need not in live and (need not in states or states[need].lost)
            moved = after is not None and need in registry and registry[need]["job_id"] not in after
            if need in replaced or ended or moved:
                replaced.add(key)
                break
    return replaced


def _cancel(registry, key, what, submitted, cancelled):
    """scancel the registry's job ``key`` (``what``: its words) to replace it; a failure is a
    SlurmError that names what was submitted and cancelled before it."""
    try:
        ask(["scancel", registry[key]["job_id"]])
    except SlurmError as e:
        done = f"submitted and recorded before it: {', '.join(submitted)}" if submitted else "nothing submitted"
        if cancelled:
            done += f"; cancelled to be replaced: {', '.join(cancelled)}"
        raise SlurmError(str(e).split("; nothing was submitted")[0] + f" (replacing {what} "
                         f"{registry[key]['job_id']}); {done}; submit again to finish") from None
    cancelled.append(f"{key} (job {registry[key]['job_id']})")


def _bounded_executor(folder, max_requeues):
    """submitit's ``SlurmExecutor`` whose sbatch runs under coreutils' ``timeout`` for
    :data:`~.cluster.TIMEOUT` seconds (exit status 124 past it): sbatch itself retries
    for as long as the controller says it is busy ("Slurm temporarily unable to accept
    job, sleeping and retrying"), with the state directory's lock held all the while."""
    import submitit

    class BoundedExecutor(submitit.SlurmExecutor):
        def _make_submission_command(self, submission_file_path):
            command = super()._make_submission_command(submission_file_path)
            # (--foreground: sbatch stays in the terminal's process group, so that Ctrl-C stops it too)
            limit = f"{cluster.TIMEOUT:.3f}"
            return ["timeout", "--foreground", "-k", "5", limit, *command] if shutil.which("timeout") else command

    return BoundedExecutor(folder=folder, max_num_timeout=max_requeues)


def sbatch(step, params, state_dir, max_requeues, key, submitted):
    """Submit one step through submitit; its job id. sbatch's refusal, or its silence
    past :data:`~.cluster.TIMEOUT` seconds, is a SlurmError in one line that names what
    was submitted before it."""
    executor = _bounded_executor(os.path.join(state_dir, "logs"), max_requeues)
    executor.update_parameters(**params)
    printed = io.StringIO()
    try:
        # submitit prints sbatch's refusal to stderr before it raises it: the refusal is said
        # once, in the error below; what a submission that goes through prints is passed on
        with contextlib.redirect_stderr(printed):
            job_id = executor.submit(step).job_id
    except Exception as e:  # (submitit: CalledProcessError, or its own error on sbatch's output)
        said = " ".join(str(getattr(e, "output", b"") or e).split())[-300:]
        refusal = str(e)
        sys.stderr.writelines(line + "\n" for line in printed.getvalue().splitlines()
                              if line.strip() and line.strip() not in refusal)  # (a warning, say)
        status = getattr(e, "returncode", getattr(e.__cause__, "returncode", None))  # (submitit: the cause's)
        if status in (124, 137, -9):  # (timeout's: past the limit; killed after it)
            raise SlurmError(f"sbatch did not answer within {cluster.TIMEOUT:g} s for {key} (a busy controller? "
                             "FAIRSEQ_LOCALNESS_SLURM_TIMEOUT sets the limit); a job it may have queued all the same "
                             "is named by the next submission or --status" + (
                                 f"; submitted before it: {', '.join(submitted)}" if submitted
                                 else "; nothing else submitted")) from None
        raise SlurmError(f"sbatch refused {key}: {said}" + (f"; submitted before it: {', '.join(submitted)}"
                                                            if submitted else "; nothing submitted")) from None
    sys.stderr.write(printed.getvalue())
    return job_id
