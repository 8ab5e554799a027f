"""--status (one line per row and seed, and the table's job), --cancel (the live jobs of
the selected rows and seeds) and a local run's check (busy) of the jobs submitted from a
state directory. Each reads SLURM's queue once (cluster.read_queue)."""
import os
import re
import shutil
import sys

from fairseq_localness.slurm import UsageError
from fairseq_localness.slurm.cluster import (
    LOST, ask, job_prefix, load_json, load_registry, locked, need_slurm, read_run,
)
from fairseq_localness.slurm.graph import read_graph


def last_update(log):
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    m = re.findall(r'num_updates"?: "?(\d+)', text)
    return int(m[-1]) if m else None


def row_keys(registry, row, seed, dataset):
    """The keys of a row's jobs: its dataset's prepare job, its training, its evaluation."""
    mine = [k for k, r in registry.items() if r["kind"] in ("train", "eval") and (r["row"], r["seed"]) == (row, seed)]
    return [k for k in registry if k == f"prepare:{dataset}"] + sorted(mine, key=lambda k: ("train" not in k, k))


def row_state(keys, states, registry, score_exists):
    """A row's state in words, and the key of the job that matters now (its log is shown)."""
    if not keys:
        return "not submitted", None
    if score_exists and not any(states[k].live for k in keys):
        return "done", keys[-1]
    # a failed or cancelled job first (the jobs after it cannot finish the row), then the live ones
    for what in ("failed", "cancelled", "running", "ending", "queued"):
        k = next((k for k in keys if states[k].what == what), None)
        if k:
            s = states[k]
            if what in LOST:
                job = f"{k.split(':')[0]} job {registry[k]['job_id']}"
                return f"{what} ({job}" + (f": {s.why}" if s.why else "") + ")", k
            return what + (f" ({s.why})" if s.why else ""), k
    return "incomplete (its jobs ended, its score is missing; --slurm submits it again)", keys[-1]


def _strangers_line(args, found):
    """What --status and --cancel say of :func:`~.cluster.strangers`."""
    return (f"{args.prog}: {len(found)} live job(s) named for {args.state_dir} ('{job_prefix(args.state_dir)}...') "
            f"that its submitted.json does not record: {', '.join(f'{j} ({n})' for j, n in found)}; if they are "
            f"this run's (a submission interrupted after sbatch queued them), "
            f"'scancel {' '.join(j for j, _ in found)}'")


def status(args):
    rows, jobs = read_graph(args.graph)
    if not os.path.isdir(args.state_dir):
        print(f"{args.prog}: nothing submitted from {args.state_dir} yet")
        return
    with locked(args.state_dir, exclusive=False):  # (a submission in progress ends first)
        registry = load_registry(args.state_dir)
        if not registry:
            print(f"{args.prog}: nothing submitted from {args.state_dir} yet")
            return
        need_slurm()
        states, found = read_run(args.state_dir, registry)
    if found:
        print(_strangers_line(args, found))
    in_rows = set()
    for row, seed, run_dir, score, dataset in rows:
        keys = row_keys(registry, row, seed, dataset)
        in_rows.update(keys)
        bleu = load_json(score).get("score") if os.path.exists(score) else None
        state, now = row_state(keys, states, registry, bleu is not None)
        restarts = max([states[k].restarts for k in keys if k.startswith("train:")] or [0])
        if restarts:
            times = f"requeued {restarts} time{'s' if restarts > 1 else ''}"
            state += f" ({times})" if state == "done" else f", {times}"
        upd = last_update(os.path.join(run_dir, "train.log"))
        print(f"{row} seed {seed}: {state}; jobs {' '.join(registry[k]['job_id'] for k in keys) or '-'}; "
              f"update {upd if upd is not None else '-'}; BLEU {'%.2f' % bleu if bleu is not None else '-'}; "
              f"log {registry[now]['log'] if now else '-'}")
    if not rows:  # (train.sh --slurm: one job, no rows)
        for key in jobs:
            if key in registry:
                s = states[key]
                print(f"{key}: {s.what}" + (f" ({s.why})" if s.why else "")
                      + (f", requeued {s.restarts} time{'s' if s.restarts > 1 else ''}" if s.restarts else "")
                      + f"; job {registry[key]['job_id']}; log {registry[key]['log']}")
    if "final" in registry:
        s = states["final"]
        print(f"table: {s.what}" + (f" ({s.why})" if s.why else "")
              + f"; job {registry['final']['job_id']}; log {registry['final']['log']}")


def cancel(args):
    """Cancel the live jobs of the rows and seeds of the graph (those the driver's --only and
    --seeds select; train.sh's one job): their trainings and evaluations, their dataset's
    prepare job when no other row's live job needs it, the table's when no other row's
    job is left queued or running."""
    rows, jobs = read_graph(args.graph)
    need_slurm()
    if not os.path.isdir(args.state_dir):
        print(f"{args.prog}: cancelled 0 job(s): nothing submitted from {args.state_dir}")
        return
    with locked(args.state_dir):  # (a submission in progress ends first: its jobs are then in the registry)
        _cancel(args, rows, jobs)


def _cancel(args, rows, jobs):
    registry = load_registry(args.state_dir)
    states, found = read_run(args.state_dir, registry)
    selected = {(r[0], r[1]) for r in rows}
    if rows:
        mine = {k for k, r in registry.items() if r["kind"] in ("train", "eval") and (r["row"], r["seed"]) in selected}
    else:
        mine = {k for k in jobs if k in registry}
    others = [k for k, r in registry.items() if k not in mine and r["kind"] in ("train", "eval")]
    for dataset in {r[4] for r in rows}:  # (a job submitted without its dataset recorded keeps it)
        needed = any(states[o].live and registry[o].get("dataset", dataset) == dataset for o in others)
        if f"prepare:{dataset}" in registry and not needed:
            mine.add(f"prepare:{dataset}")
    if "final" in registry and not any(states[o].live for o in others):
        mine.add("final")
    live = [k for k in registry if k in mine and states[k].live]
    if live:
        ask(["scancel", *(registry[k]["job_id"] for k in live)])
    kept = sum(1 for k in registry if k not in mine and states[k].live)
    print(f"{args.prog}: cancelled {len(live)} job(s)" + (": " + ", ".join(f"{k} (job {registry[k]['job_id']})"
                                                                             for k in live) if live else "")
          + (f"; {kept} job(s) of other rows left queued or running" if kept else ""))
    if found:
        print(_strangers_line(args, found))


def busy(args):
    """A local run's check: stop, naming the job, when a row it would run (lines 'row<TAB>seed<TAB>dataset'
    on standard input) has a queued or running job submitted from the state directory."""
    if not os.path.isdir(args.state_dir):
        return
    with locked(args.state_dir, exclusive=False):  # (a submission in progress ends first)
        registry = load_registry(args.state_dir)
    wanted = [line.rstrip("\n").split("\t") for line in sys.stdin if line.strip()]
    if shutil.which("squeue") is None:
        if not registry:
            return
        raise UsageError(f"{args.state_dir}/submitted.json records jobs submitted to SLURM, and squeue is not on PATH "
                         "to tell whether they still run; run where SLURM is, or remove that directory if they ended")
    states, found = read_run(args.state_dir, registry)
    if found:
        raise UsageError(f"{', '.join(f'job {j} ({n})' for j, n in found)}: live on the cluster, named for "
                         f"{args.state_dir}, and not recorded in its submitted.json (a submission interrupted after "
                         "sbatch queued them?); one trainer per run directory: scancel them or wait for them, then run")
    for row, seed, dataset in wanted:
        for key in row_keys(registry, row, seed, dataset):
            s = states[key]
            if s.live:
                raise UsageError(f"row '{row}' seed {seed}: its {key.split(':')[0]} job {registry[key]['job_id']} is "
                                 f"{s.what} on the cluster ({args.state_dir}); one trainer per run directory: wait "
                                 "for it, or --cancel it (with the same --only and --seeds) before running locally")

