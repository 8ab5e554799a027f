"""Learning curves from fairseq-train logs (Song et al. 2019, Fig. 4: development-set
BLEU on the left axis and loss on the right axis as training progresses).

Reads the validation records of each system's training log (see
:mod:`fairseq_localness.analysis.logs`): the validation loss, and the validation
BLEU when the model was trained with fairseq's ``--eval-bleu`` (for example
``--eval-bleu --eval-bleu-args '{"beam": 4}' --eval-bleu-detok space
--eval-bleu-remove-bpe sentencepiece``). ``--train-loss`` adds the training loss
of the ``train_inner`` records.

Outputs in ``--output-dir``: ``learning_curves.csv`` (system, subset, num_updates,
epoch, metric, value; one row per logged value), ``learning_curves.json`` (the
best validation value of each metric per system) and ``learning_curves.png``
(x: updates; solid lines: BLEU, left axis, when logged; dashed lines: validation
loss, right axis; one colour per system).

Example (the demo's systems; a directory stands for its ``train.log``)::

    python -m fairseq_localness.analysis.learning_curves \\
        --log transformer=runs/demo/systems/transformer --log hysan=runs/demo/systems/hysan \\
        --output-dir analysis/curves
"""
import argparse
from typing import Dict, List

from fairseq_localness.analysis import common as C
from fairseq_localness.analysis.logs import parse_log

METRICS = ("bleu", "loss", "nll_loss", "ppl")


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis learning_curves",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--log", action="append", required=True, metavar="NAME=LOG",
                   help="a system's fairseq-train log (or a directory with train.log); repeatable")
    p.add_argument("--subset", default=None, help="validation subset to plot (default: the first one logged)")
    p.add_argument("--train-loss", action="store_true", help="also plot the training loss (train_inner records)")
    C.add_output_args(p)
    return p


def curve_rows(name: str, log, subset: str, train_loss: bool) -> List[Dict]:
    rows = []
    for r in log.of_kind(subset):
        for metric in METRICS:
            if metric in r:
                rows.append({"system": name, "subset": subset, "num_updates": int(r["num_updates"]),
                             "epoch": int(r.get("epoch", 0)), "metric": metric, "value": r[metric]})
    if train_loss:
        for r in log.of_kind("train_inner"):
            if "loss" in r:
                rows.append({"system": name, "subset": "train", "num_updates": int(r["num_updates"]),
                             "epoch": int(r.get("epoch", 0)), "metric": "loss", "value": r["loss"]})
    return rows


def plot(rows: List[Dict], names: List[str], path: str, title: str):
    plt = C.pyplot()
    has_bleu = any(r["metric"] == "bleu" for r in rows)
    fig, ax_bleu = plt.subplots(figsize=(7, 4))
    ax_loss = ax_bleu.twinx() if has_bleu else ax_bleu
    handles = []
    for k, name in enumerate(names):
        def series(subset_is_train: bool, metric: str):
            pts = sorted((r["num_updates"], r["value"]) for r in rows
                         if r["system"] == name and r["metric"] == metric and (r["subset"] == "train") == subset_is_train)
            return [p[0] for p in pts], [p[1] for p in pts]

        if has_bleu:
            xs, ys = series(False, "bleu")
            if xs:
                handles += ax_bleu.plot(xs, ys, "-o", ms=3, color=f"C{k}", label=f"{name} BLEU")
        xs, ys = series(False, "loss")
        if xs:
            handles += ax_loss.plot(xs, ys, "--", color=f"C{k}", label=f"{name} valid loss")
        xs, ys = series(True, "loss")
        if xs:
            handles += ax_loss.plot(xs, ys, ":", color=f"C{k}", alpha=0.6, label=f"{name} train loss")
    ax_bleu.set_xlabel("updates")
    if has_bleu:
        ax_bleu.set_ylabel("BLEU (solid)")
        ax_loss.set_ylabel("loss (dashed)")
    else:
        ax_loss.set_ylabel("loss")
    ax_bleu.legend(handles=handles, fontsize=7, loc="center right")
    ax_bleu.set_title(title, fontsize=9)
    fig.tight_layout()
    return C.save_figure(fig, path)


def main(args):
    out_dir = C.ensure_dir(args.output_dir)
    systems = C.parse_named(args.log, "--log")
    rows, best = [], {}
    for name, path in systems:
        log = parse_log(path)
        subsets = log.valid_subsets
        subset = args.subset or (subsets[0] if subsets else None)
        if subset is None or subset not in subsets:
            raise C.AnalysisError(
                f"{name}: {log.path} has no validation records{'' if subset is None else ' for subset ' + repr(subset)} "
                f"(found: {subsets or 'none'}); logs must be written with --log-format simple or json"
            )
        rs = curve_rows(name, log, subset, args.train_loss)
        rows += rs
        valid = [r for r in rs if r["subset"] == subset]
        best[name] = {"log": log.path, "subset": subset, "last_update": log.last_update}
        for metric in METRICS:
            vals = [(r["value"], r["num_updates"]) for r in valid if r["metric"] == metric]
            if vals:
                v, u = (max if metric == "bleu" else min)(vals)
                best[name][f"best_{metric}"] = v
                best[name][f"best_{metric}_update"] = u
    C.write_csv(f"{out_dir}/learning_curves.csv", rows, ["system", "subset", "num_updates", "epoch", "metric", "value"])
    plot(rows, [n for n, _ in systems], f"{out_dir}/learning_curves.png", "learning curves")
    C.write_json(f"{out_dir}/learning_curves.json", best)
    return best


def cli_main(argv=None):
    return C.run_cli("learning_curves", main, argv, get_parser())


if __name__ == "__main__":
    cli_main()
