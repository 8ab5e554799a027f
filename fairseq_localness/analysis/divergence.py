"""Jensen-Shannon divergence between the two FI units of every Dual Contextual layer
(the DC paper, Sect. 7.2, eq. 10-13, Fig. 4).

For each checkpoint (e.g. Enc-DC models trained with different kernel sizes ``f``,
as in Fig. 4), runs the model teacher-forced over a split and computes, per DC layer
``l``, ``dv_l = JS(alpha_g || alpha_l)`` averaged over every real query token, and
``E_d`` (eq. 13), the mean of ``dv_l`` over a side's DC layers. The computation is
:func:`dc_divergence` below, with the divergence of
:func:`fairseq_localness.modules.dual_context.reduced_js` (heads reduced by eq. 10's
element-wise maximum, renormalised; natural logarithm, so ``0 <= dv <= ln 2``) that
the module also logs during validation; ``--head-reduce mean`` averages the heads
instead, ``per_head`` averages the per-head divergences.

Outputs in ``--output-dir``: ``divergence.csv`` (model, layer, dv; the ``E_d_*``
rows are eq. 13), ``divergence.json``, and ``divergence.png``: (a) ``dv_l`` per
layer, one line per model; (b) ``E_d`` per model.

Example (Fig. 4, Enc-DC with f = 2 ... 8)::

    python -m fairseq_localness.analysis.divergence data-bin/wmt14_en_de \\
        --path ckpt/f2/checkpoint_best.pt --path ckpt/f3/checkpoint_best.pt ... \\
        --labels f=2 f=3 ... --split valid --output-dir analysis/divergence
"""
import argparse
from collections import defaultdict
from typing import Dict, Iterable, List

from fairseq_localness.analysis.batches import iter_samples
from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_checkpoint_args, add_output_args, add_split_args, labels_for, run_cli, start_tool,
)
from fairseq_localness.analysis.layers import layer_sort_key
from fairseq_localness.analysis.outputs import write_csv, write_json
from fairseq_localness.analysis.plotting import finish_figure, pyplot
from fairseq_localness.modules.dual_context import HEAD_REDUCTIONS, DualContextModule, reduced_js
from fairseq_localness.modules.observe import QUERY_PADDING, AttentionRecorder, probs_key


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis divergence", description=__doc__.split("\n\n")[0])
    add_checkpoint_args(p, multiple=True)
    add_split_args(p)
    p.add_argument("--head-reduce", choices=HEAD_REDUCTIONS, default="max",
                   help="how eq. 10 reduces the heads (default: max, the paper's)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("divergence", main, argv, get_parser())


def dc_divergence(model, batches: Iterable, head_reduce: str = "max") -> Dict[str, float]:
    """Per-layer Jensen-Shannon divergence between the two FI units of every DC layer
    over a set of batches (Sect. 7.2, eq. 10-13).

    Args:
        model: a model containing
            :class:`~fairseq_localness.modules.dual_context.DualContextModule` layers
            (run in eval mode, teacher forcing).
        batches: fairseq samples (dicts with ``net_input``) or ``net_input`` dicts.
        head_reduce: eq. 10's reduction over heads (see
            :func:`~fairseq_localness.modules.dual_context.reduced_js`).

    Returns:
        ``{label: dv_l}`` with labels such as ``enc1``, ``dec2_self`` (the layers'
        metric prefixes), each the mean over every real (non-padding) query token of
        the per-query divergence; plus ``E_d_encoder`` / ``E_d_decoder`` (eq. 13, the
        mean over that side's DC layers) when the side has DC layers.
    """
    import torch

    if head_reduce not in HEAD_REDUCTIONS:
        raise ValueError(f"head reduction {head_reduce!r}: allowed: {', '.join(HEAD_REDUCTIONS)}")
    modules = [(name, m) for name, m in model.named_modules() if isinstance(m, DualContextModule)]
    if not modules:
        raise ValueError("the model has no Dual Contextual layer")
    was_training = model.training
    model.eval()
    sums: Dict[str, float] = defaultdict(float)
    counts: Dict[str, float] = defaultdict(float)
    try:
        for sample in batches:
            net_input = sample["net_input"] if "net_input" in sample else sample
            with AttentionRecorder(model) as rec, torch.no_grad():
                model(**net_input)
            for name, module in modules:
                label = module.metric_prefix or name
                p_l = rec.calls(module.fi_local)[-1][probs_key("global")]  # B x H x Tq x Tk
                p_g = rec.calls(module.fi_global)[-1][probs_key("global")]
                padding = rec.calls(module)[-1][QUERY_PADDING].bool()  # B x Tq
                js = reduced_js(p_l.double(), p_g.double(), head_reduce)  # B x Tq
                keep = ~padding & (p_g.sum(-1).amax(1) > 0)  # real queries with visible keys
                sums[label] += float(js[keep].sum())
                counts[label] += float(keep.sum())
    finally:
        model.train(was_training)
    result = {label: sums[label] / max(counts[label], 1.0) for label in sums}
    for side, prefix in (("encoder", "enc"), ("decoder", "dec")):
        values = [v for k, v in result.items() if k.startswith(prefix)]
        if values:
            result[f"E_d_{side}"] = sum(values) / len(values)  # eq. 13
    return result


def divergence_of(model, task, args, use_cuda: bool, label: str) -> dict:
    samples = iter_samples(task, args.split, batch_size=args.batch_size, max_sentences=args.max_sentences,
                           use_cuda=use_cuda, show_progress=not args.no_progress, desc=f"divergence {label}")
    try:
        return dc_divergence(model, samples, args.head_reduce)
    except ValueError as e:
        raise AnalysisError(f"{label}: {e} (the divergence needs a dc_transformer checkpoint)") from None


def plot(rows: List[dict], labels: List[str], path: str, title: str):
    plt = pyplot()
    layer_rows = [r for r in rows if not r["layer"].startswith("E_d")]
    ed_rows = [r for r in rows if r["layer"].startswith("E_d")]
    layers = sorted({r["layer"] for r in layer_rows}, key=layer_sort_key)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6), gridspec_kw={"width_ratios": [3, 2]})
    for k, label in enumerate(labels):
        xs = [i for i, layer in enumerate(layers) if any(r["model"] == label and r["layer"] == layer for r in layer_rows)]
        ys = [next(r["dv"] for r in layer_rows if r["model"] == label and r["layer"] == layers[i]) for i in xs]
        ax1.plot(xs, ys, marker="o", color=f"C{k}", label=label)
    ax1.set_xticks(range(len(layers)))
    ax1.set_xticklabels(layers)
    ax1.set_xlabel("layer")
    ax1.set_ylabel("dv = JS(alpha_g || alpha_l)")
    ax1.set_title("(a) divergence per layer", fontsize=9)
    ax1.set_ylim(bottom=0)
    if len(labels) > 1:
        ax1.legend(fontsize=7)
    sides = sorted({r["layer"] for r in ed_rows})
    width = 0.8 / max(len(sides), 1)
    for s, side in enumerate(sides):
        xs = [k + (s - (len(sides) - 1) / 2) * width for k, label in enumerate(labels)
              if any(r["model"] == label and r["layer"] == side for r in ed_rows)]
        ys = [next(r["dv"] for r in ed_rows if r["model"] == label and r["layer"] == side) for label in labels
              if any(r["model"] == label and r["layer"] == side for r in ed_rows)]
        ax2.bar(xs, ys, width=width * 0.9, color=f"C{s + 5}", label=side.replace("E_d_", ""))
    ax2.set_xticks(range(len(labels)))
    ax2.set_xticklabels(labels, rotation=30 if len(labels) > 3 else 0, fontsize=8)
    ax2.set_ylabel("E_d (eq. 13)")
    ax2.set_title("(b) mean divergence", fontsize=9)
    if len(sides) > 1:
        ax2.legend(fontsize=7)
    return finish_figure(fig, path, title)


def main(args):
    out_dir = start_tool(args)
    labels = labels_for(args.path, args.labels)
    rows = []
    for path, label in zip(args.path, labels):
        model, cfg, task, use_cuda = load_checkpoint(path, args.data, args.cpu)
        result = divergence_of(model, task, args, use_cuda, label)
        order = sorted((k for k in result if not k.startswith("E_d")), key=layer_sort_key)
        order += sorted(k for k in result if k.startswith("E_d"))
        rows += [{"model": label, "layer": k, "dv": result[k], "head_reduce": args.head_reduce} for k in order]
        del model
    write_csv(f"{out_dir}/divergence.csv", rows, ["model", "layer", "dv", "head_reduce"])
    plot(rows, labels, f"{out_dir}/divergence.png",
         f"Jensen-Shannon divergence between the FI units, {args.split} (heads: {args.head_reduce})")
    summary = {"checkpoints": dict(zip(labels, args.path)), "split": args.split, "head_reduce": args.head_reduce,
               "rows": rows}
    write_json(f"{out_dir}/divergence.json", summary)
    return summary


if __name__ == "__main__":
    cli_main()
