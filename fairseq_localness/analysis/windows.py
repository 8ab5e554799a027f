"""Learned Gaussian centres and windows per layer and head (Yang et al. 2018, Fig. 3
and Fig. 2).

For every localized sublayer of one or more checkpoints (``localness_transformer``,
and ``hybrid_transformer``'s Gaussian baselines ``neighbor`` / ``local_h`` /
``local_s``), runs the model teacher-forced over a split and collects, for every real
query token and head, the predicted centre ``P_i`` and window ``D_i`` of eq. 6/10/11
and the query's position ``i`` and key length ``I`` (0-based positions, ``P in (0, I)``).

Outputs in ``--output-dir``:

* ``windows_per_layer.csv``: per model and layer, the number of (token, head)
  values and the mean, median, 10th/90th percentile of ``D``, the mean of ``D / I``,
  the mean centre offset ``P - i`` and its mean absolute value, the mean of ``P / I``;
* ``windows_per_head.csv``: per model, layer and head, mean / std / median of ``D``
  (Fig. 2; with ``--localness-window head`` each head has one learned ``D``);
* ``windows_points.csv``: a random sample (``--max-points`` per model and layer) of
  the individual (sentence, position, head, I, P, D) values behind the scatter plots;
* ``windows.png`` (Fig. 3): one column per layer; top, the predicted centre ``P``
  (y) against the window ``D`` (x) for the sampled points; bottom, the distribution
  of ``D``; one colour per model (the paper: layer- vs query-specific);
* ``heads.png`` (Fig. 2): per layer, the distribution of ``D`` of each head (one
  row of panels per model);
* ``windows.json``: the tables and settings.

Example (Fig. 3 of the paper compares the layer- and query-specific strategies)::

    python -m fairseq_localness.analysis.windows data-bin/wmt14_en_de \\
        --path ckpt/layer/checkpoint_best.pt --path ckpt/query/checkpoint_best.pt \\
        --labels layer-specific query-specific --split valid --max-sentences 1000 \\
        --output-dir analysis/windows
"""
import argparse
import random
from collections import defaultdict
from typing import Dict, List

from fairseq_localness.analysis.batches import iter_sentence_stats
from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_checkpoint_args, add_output_args, add_split_args, labels_for, run_cli, start_tool,
)
from fairseq_localness.analysis.layers import layer_label, layer_sort_key
from fairseq_localness.analysis.outputs import write_csv, write_json
from fairseq_localness.analysis.plotting import finish_figure, pyplot
from fairseq_localness.modules.observe import CENTRE, QUERY_POSITION, VISIBLE_KEYS, WINDOW


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis windows", description=__doc__.split("\n\n")[0])
    add_checkpoint_args(p, multiple=True)
    add_split_args(p, default_max=1000)
    p.add_argument("--max-points", type=int, default=2000,
                   help="points per model and layer kept for the scatter plot and windows_points.csv (default: 2000)")
    p.add_argument("--seed", type=int, default=1, help="seed of the point sample (default: 1)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("windows", main, argv, get_parser())


def collect(model, task, split, *, max_sentences=None, batch_size=32, use_cuda=False, show_progress=True):
    """``{layer: {"module", "P", "D", "q_pos", "I", "head", "sent"}}`` flat lists over
    every real query token and head of the split."""
    import torch

    data: Dict[str, Dict[str, list]] = {}
    for sent in iter_sentence_stats(model, task, split, max_sentences=max_sentences, batch_size=batch_size,
                                    use_cuda=use_cuda, show_progress=show_progress, desc="windows"):
        for module, (side, values) in sent.modules.items():
            if CENTRE not in values or WINDOW not in values:
                continue
            label = layer_label(module)
            d = data.setdefault(label, {"module": module, "P": [], "D": [], "q_pos": [], "I": [], "head": [],
                                        "sent": []})
            P, D = values[CENTRE], values[WINDOW]  # H x n
            heads, n = D.shape
            q_pos = values[QUERY_POSITION].expand(heads, n) if QUERY_POSITION in values else \
                torch.arange(n).expand(heads, n)
            lengths = values[VISIBLE_KEYS].expand(heads, n) if VISIBLE_KEYS in values else \
                torch.full((heads, n), float(n))
            d["P"] += P.reshape(-1).tolist()
            d["D"] += D.reshape(-1).tolist()
            d["q_pos"] += q_pos.reshape(-1).tolist()
            d["I"] += lengths.reshape(-1).tolist()
            d["head"] += torch.arange(heads).repeat_interleave(n).tolist()
            d["sent"] += [sent.id] * (heads * n)
    return data


def _quantile(sorted_values: List[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(label: str, data: Dict[str, Dict[str, list]]):
    import statistics

    layer_rows, head_rows = [], []
    for layer in sorted(data, key=layer_sort_key):
        d = data[layer]
        n = len(d["D"])
        D_sorted = sorted(d["D"])
        offsets = [p - q for p, q in zip(d["P"], d["q_pos"])]
        layer_rows.append({
            "model": label, "layer": layer, "module": d["module"], "values": n,
            "window_mean": sum(d["D"]) / n, "window_median": _quantile(D_sorted, 0.5),
            "window_p10": _quantile(D_sorted, 0.1), "window_p90": _quantile(D_sorted, 0.9),
            "window_rel_mean": sum(w / i for w, i in zip(d["D"], d["I"])) / n,
            "centre_offset_mean": sum(offsets) / n,
            "centre_abs_offset_mean": sum(abs(o) for o in offsets) / n,
            "centre_rel_mean": sum(p / i for p, i in zip(d["P"], d["I"])) / n,
        })
        per_head = defaultdict(list)
        for h, w in zip(d["head"], d["D"]):
            per_head[h].append(w)
        for h in sorted(per_head):
            ws = per_head[h]
            head_rows.append({
                "model": label, "layer": layer, "head": h + 1, "values": len(ws),
                "window_mean": sum(ws) / len(ws), "window_std": statistics.pstdev(ws),
                "window_median": statistics.median(ws),
            })
    return layer_rows, head_rows


def sample_points(label: str, data, max_points: int, seed: int) -> List[dict]:
    rng = random.Random(seed)
    rows = []
    for layer in sorted(data, key=layer_sort_key):
        d = data[layer]
        idx = list(range(len(d["D"])))
        if len(idx) > max_points:
            idx = sorted(rng.sample(idx, max_points))
        for i in idx:
            rows.append({"model": label, "layer": layer, "sentence": d["sent"][i], "position": int(d["q_pos"][i]),
                         "head": d["head"][i] + 1, "I": d["I"][i], "P": d["P"][i], "D": d["D"][i]})
    return rows


def plot_windows(points: List[dict], models: List[str], path: str, title: str):
    plt = pyplot()
    layers = sorted({r["layer"] for r in points}, key=layer_sort_key)
    fig, axes = plt.subplots(2, len(layers), figsize=(2.8 * len(layers) + 0.6, 5.2), squeeze=False)
    top = max((r["D"] for r in points), default=1.0)
    for j, layer in enumerate(layers):
        for k, model in enumerate(models):
            pts = [r for r in points if r["layer"] == layer and r["model"] == model]
            if not pts:
                continue
            axes[0][j].scatter([r["D"] for r in pts], [r["P"] for r in pts], s=4, alpha=0.35, color=f"C{k}",
                               label=model, rasterized=True)
            axes[1][j].hist([r["D"] for r in pts], bins=30, range=(0, top), density=True, histtype="step",
                            color=f"C{k}", label=model)
        axes[0][j].set_title(layer, fontsize=9)
        axes[1][j].set_xlabel("window D")
    axes[0][0].set_ylabel("centre P")
    axes[1][0].set_ylabel("density")
    if len(models) > 1:
        axes[0][-1].legend(fontsize=7, markerscale=3)
    return finish_figure(fig, path, title)


def plot_heads(points: List[dict], models: List[str], path: str, title: str):
    plt = pyplot()
    layers = sorted({r["layer"] for r in points}, key=layer_sort_key)
    fig, axes = plt.subplots(len(models), len(layers), figsize=(2.6 * len(layers) + 0.6, 2.6 * len(models) + 0.4),
                             squeeze=False)
    for i, model in enumerate(models):
        for j, layer in enumerate(layers):
            ax = axes[i][j]
            pts = [r for r in points if r["layer"] == layer and r["model"] == model]
            heads = sorted({r["head"] for r in pts})
            if heads:
                parts = ax.boxplot([[r["D"] for r in pts if r["head"] == h] for h in heads], patch_artist=True,
                                   showfliers=False, widths=0.6,
                                   medianprops={"color": "black"})
                for h, box in enumerate(parts["boxes"]):
                    box.set_facecolor(f"C{h % 10}")
                    box.set_alpha(0.7)
                ax.set_xticks(range(1, len(heads) + 1))
                ax.set_xticklabels([str(h) for h in heads], fontsize=7)
            ax.set_title(f"{model}: {layer}" if len(models) > 1 else layer, fontsize=8)
            if i == len(models) - 1:
                ax.set_xlabel("head")
            if j == 0:
                ax.set_ylabel("window D")
    return finish_figure(fig, path, title)


def main(args):
    out_dir = start_tool(args)
    labels = labels_for(args.path, args.labels)
    layer_rows, head_rows, points = [], [], []
    for path, label in zip(args.path, labels):
        model, cfg, task, use_cuda = load_checkpoint(path, args.data, args.cpu)
        data = collect(model, task, args.split, max_sentences=args.max_sentences, batch_size=args.batch_size,
                       use_cuda=use_cuda, show_progress=not args.no_progress)
        if not data:
            raise AnalysisError(
                f"{path} records no Gaussian centres/windows: they come from localness_transformer and "
                "hybrid_transformer's neighbor/local_h/local_s variants"
            )
        rows, heads = summarize(label, data)
        layer_rows += rows
        head_rows += heads
        points += sample_points(label, data, args.max_points, args.seed)
        del model
    write_csv(f"{out_dir}/windows_per_layer.csv", layer_rows)
    write_csv(f"{out_dir}/windows_per_head.csv", head_rows)
    write_csv(f"{out_dir}/windows_points.csv", points)
    title = f"Gaussian centres and windows, {args.split}"
    plot_windows(points, labels, f"{out_dir}/windows.png", title)
    plot_heads(points, labels, f"{out_dir}/heads.png", f"window per head, {args.split}")
    summary = {"checkpoints": dict(zip(labels, args.path)), "split": args.split, "per_layer": layer_rows,
               "per_head": head_rows}
    write_json(f"{out_dir}/windows.json", summary)
    return summary


if __name__ == "__main__":
    cli_main()
