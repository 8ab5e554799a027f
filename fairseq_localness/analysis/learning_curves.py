"""Learning curves from fairseq-train logs (Song et al. 2019, Fig. 4: development-set
BLEU on the left axis and loss on the right axis as training progresses).

Reads the validation records of each system's training log (see
:mod:`fairseq_localness.analysis.logs`; ``scripts/train.sh`` writes them as JSON):
the validation loss, and the validation BLEU when the model was trained with
fairseq's ``--eval-bleu`` (for example ``--eval-bleu --eval-bleu-args '{"beam": 4}'
--eval-bleu-detok space --eval-bleu-remove-bpe sentencepiece``). ``--train-loss``
adds the training loss of the ``train_inner`` records.

Several runs of one system (its seeds): give ``--log NAME=LOG`` once per run with the
same NAME. The plot then draws, per system and metric, the mean over its runs with a
band of plus or minus one standard deviation (n - 1 in the denominator), on the
updates where every run logged a value (runs with the same schedule validate at the
same updates; otherwise each run is interpolated linearly onto the updates the runs
share in their common range).

Outputs in ``--output-dir``: ``learning_curves.csv`` (system, run, subset,
num_updates, epoch, metric, value; one row per logged value; run: the run's index
within its system, from 1), ``learning_curves_mean.csv`` (system, subset, metric,
num_updates, mean, sd, runs), ``learning_curves.json`` (per system: the best
validation value of each metric and the update where it was reached, per run, and
their mean and standard deviation over the runs) and ``learning_curves.png`` (x:
updates; solid lines: BLEU, left axis, when logged; dashed lines: validation loss,
right axis; one colour per system; shaded: the band).

Example (the demo's systems with two seeds each; a directory stands for its
``train.log``)::

    fairseq-localness-analysis learning_curves \\
        --log transformer=runs/demo/systems/transformer/seed1 \\
        --log transformer=runs/demo/systems/transformer/seed2 \\
        --log hysan=runs/demo/systems/hysan/seed1 --log hysan=runs/demo/systems/hysan/seed2 \\
        --output-dir analysis/curves
"""
import argparse
import math
from typing import Dict, List, Sequence, Tuple

from fairseq_localness.analysis.cli_args import AnalysisError, add_output_args, group_named, parse_named, run_cli
from fairseq_localness.analysis.outputs import ensure_dir, write_csv, write_json
from fairseq_localness.analysis.plotting import finish_figure, pyplot
from fairseq_localness.analysis.logs import parse_log

METRICS = ("bleu", "loss", "nll_loss", "ppl")


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis learning_curves",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--log", action="append", required=True, metavar="NAME=LOG",
                   help="a run's fairseq-train log (or a directory with train.log); repeatable; the same NAME "
                   "several times: runs of one system (e.g. seeds), drawn as their mean with a band")
    p.add_argument("--subset", default=None, help="validation subset to plot (default: the first one logged)")
    p.add_argument("--train-loss", action="store_true", help="also plot the training loss (train_inner records)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("learning_curves", main, argv, get_parser())


def curve_rows(name: str, log, subset: str, train_loss: bool, run: int = 1) -> List[Dict]:
    rows = []
    for r in log.of_kind(subset):
        for metric in METRICS:
            if metric in r:
                rows.append({"system": name, "run": run, "subset": subset, "num_updates": int(r["num_updates"]),
                             "epoch": int(r.get("epoch", 0)), "metric": metric, "value": r[metric]})
    if train_loss:
        for r in log.of_kind("train_inner"):
            if "loss" in r:
                rows.append({"system": name, "run": run, "subset": "train", "num_updates": int(r["num_updates"]),
                             "epoch": int(r.get("epoch", 0)), "metric": "loss", "value": r["loss"]})
    return rows


def mean_band(series: Sequence[Sequence[Tuple[int, float]]]) -> List[Tuple[int, float, float, int]]:
    """Runs' curves ``[[(update, value), ...], ...]`` -> ``[(update, mean, sd, runs), ...]``.

    On the updates every run logged when there are any; otherwise each run is
    interpolated linearly onto the union of the runs' updates within the range all of
    them cover. ``sd``: sample standard deviation (0 for a single run)."""
    import numpy as np

    series = [sorted(dict(s).items()) for s in series if s]
    if not series:
        return []
    common = set(u for u, _ in series[0])
    for s in series[1:]:
        common &= set(u for u, _ in s)
    if common:
        grid = sorted(common)
        values = np.array([[dict(s)[u] for u in grid] for s in series], dtype=float)
    else:
        lo = max(s[0][0] for s in series)
        hi = min(s[-1][0] for s in series)
        grid = sorted({u for s in series for u, _ in s if lo <= u <= hi})
        if not grid:
            return []
        values = np.array([np.interp(grid, [u for u, _ in s], [v for _, v in s]) for s in series])
    mean = values.mean(axis=0)
    sd = values.std(axis=0, ddof=1) if len(series) > 1 else np.zeros_like(mean)
    return [(int(u), float(m), float(d), len(series)) for u, m, d in zip(grid, mean, sd)]


def mean_rows(rows: List[Dict], names: List[str]) -> List[Dict]:
    out = []
    for name in names:
        mine = [r for r in rows if r["system"] == name]
        for subset, metric in dict.fromkeys((r["subset"], r["metric"]) for r in mine):
            runs = sorted({r["run"] for r in mine})
            series = [[(r["num_updates"], r["value"]) for r in mine
                       if r["run"] == k and r["subset"] == subset and r["metric"] == metric] for k in runs]
            for u, m, d, n in mean_band(series):
                out.append({"system": name, "subset": subset, "metric": metric, "num_updates": u,
                            "mean": m, "sd": d, "runs": n})
    return out


def plot(means: List[Dict], names: List[str], path: str, title: str):
    plt = pyplot()
    has_bleu = any(r["metric"] == "bleu" for r in means)
    fig, ax_bleu = plt.subplots(figsize=(7, 4))
    ax_loss = ax_bleu.twinx() if has_bleu else ax_bleu
    handles = []
    for k, name in enumerate(names):
        def series(is_train: bool, metric: str):
            pts = sorted((r["num_updates"], r["mean"], r["sd"], r["runs"]) for r in means
                         if r["system"] == name and r["metric"] == metric and (r["subset"] == "train") == is_train)
            return ([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts], max((p[3] for p in pts), default=0))

        for ax, is_train, metric, style, label, alpha in (
                (ax_bleu, False, "bleu", "-o", "BLEU", 1.0), (ax_loss, False, "loss", "--", "valid loss", 1.0),
                (ax_loss, True, "loss", ":", "train loss", 0.6)):
            if metric == "bleu" and not has_bleu:
                continue
            xs, ys, sds, runs = series(is_train, metric)
            if not xs:
                continue
            suffix = f" (mean of {runs})" if runs > 1 else ""
            handles += ax.plot(xs, ys, style, ms=3, color=f"C{k}", alpha=alpha, label=f"{name} {label}{suffix}")
            if runs > 1:
                ax.fill_between(xs, [y - d for y, d in zip(ys, sds)], [y + d for y, d in zip(ys, sds)],
                                color=f"C{k}", alpha=0.15 * alpha, linewidth=0)
    ax_bleu.set_xlabel("updates")
    if has_bleu:
        ax_bleu.set_ylabel("BLEU (solid)")
        ax_loss.set_ylabel("loss (dashed)")
    else:
        ax_loss.set_ylabel("loss")
    ax_bleu.legend(handles=handles, fontsize=7, loc="center right")
    ax_bleu.set_title(title, fontsize=9)
    return finish_figure(fig, path)


def _mean_sd(values: List[float]) -> Tuple[float, float]:
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return m, sd


def main(args):
    out_dir = ensure_dir(args.output_dir)
    systems = group_named(parse_named(args.log, "--log", repeats=True))
    rows, best = [], {}
    for name, paths in systems:
        runs = []
        for k, path in enumerate(paths, start=1):
            log = parse_log(path)
            subsets = log.valid_subsets
            subset = args.subset or (subsets[0] if subsets else None)
            if subset is None or subset not in subsets:
                raise AnalysisError(
                    f"{name}: {log.path} has no validation records"
                    f"{'' if subset is None else ' for subset ' + repr(subset)} (found: {subsets or 'none'}); "
                    "logs must be written with --log-format json (scripts/train.sh) or simple")
            rs = curve_rows(name, log, subset, args.train_loss, run=k)
            rows += rs
            valid = [r for r in rs if r["subset"] == subset]
            run = {"log": log.path, "subset": subset, "last_update": log.last_update}
            for metric in METRICS:
                vals = [(r["value"], r["num_updates"]) for r in valid if r["metric"] == metric]
                if vals:
                    v, u = (max if metric == "bleu" else min)(vals)
                    run[f"best_{metric}"] = v
                    run[f"best_{metric}_update"] = u
            runs.append(run)
        entry = dict(runs[0]) if len(runs) == 1 else {"subset": runs[0]["subset"]}
        entry["runs"] = len(runs)
        if len(runs) > 1:
            entry["per_run"] = runs
            for metric in METRICS:
                vals = [r[f"best_{metric}"] for r in runs if f"best_{metric}" in r]
                if len(vals) == len(runs):
                    entry[f"best_{metric}"], entry[f"best_{metric}_sd"] = _mean_sd(vals)
        best[name] = entry
    names = [n for n, _ in systems]
    means = mean_rows(rows, names)
    write_csv(f"{out_dir}/learning_curves.csv", rows,
              ["system", "run", "subset", "num_updates", "epoch", "metric", "value"])
    write_csv(f"{out_dir}/learning_curves_mean.csv", means,
              ["system", "subset", "metric", "num_updates", "mean", "sd", "runs"])
    plot(means, names, f"{out_dir}/learning_curves.png",
         "learning curves" + (" (mean ± sd over runs)" if any(len(p) > 1 for _, p in systems) else ""))
    write_json(f"{out_dir}/learning_curves.json", best)
    return best


if __name__ == "__main__":
    cli_main()
