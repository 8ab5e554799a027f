"""--status (one line per row and seed, and the table's job) and --cancel (the
queued and running jobs) of a submitted graph."""
import os
import re
import subprocess

from fairseq_localness.slurm.cluster import job_states, load_json, need_slurm
from fairseq_localness.slurm.graph import read_graph


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
