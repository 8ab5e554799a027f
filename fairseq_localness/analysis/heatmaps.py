"""Per-branch attention heatmaps of chosen sentences (Song et al. 2019, Fig. 5).

Runs the encoder of one or more checkpoints on chosen sentences and draws, for one
encoder layer, the attention distribution of every branch its self-attention
computes: HySAN's ``global`` / ``forward`` / ``backward`` / ``local<k>``, the hybrid
model's ``global`` / ``local``, the Gaussian-biased distribution of
``localness_transformer`` (``gaussian``), the DC module's two FI units
(``fi_local/global``, ``fi_global/global``). Fig. 5 compares a model trained with
positional embeddings and one trained without (``--no-token-positional-embeddings``):
pass both checkpoints, ``--labels Pos NoPos``; each becomes a row of the figure.

Sentences: ``--ids`` picks sentences of a split of DATA by their line number;
``--sentence`` gives raw sentences, segmented with ``--bpe`` (e.g. ``--bpe
sentencepiece --sentencepiece-model DATA/sentencepiece.bpe.model``). Each sentence is
encoded alone (no padding). Heads are averaged (``--head mean``, the default) or one
head is shown (``--head 3``, 1-based).

Outputs in ``--output-dir``: ``heatmaps.json`` (for each sentence its subword tokens
and, per model and branch, the ``n x n`` matrix: row = query, column = key, rows sum
to 1) and one ``heatmaps_<sentence>.png`` per sentence (rows: models, columns:
branches).

Example::

    python -m fairseq_localness.analysis.heatmaps data-bin/iwslt14.de-en \\
        --path ckpt/hysan/checkpoint_best.pt --path ckpt/hysan-nopos/checkpoint_best.pt \\
        --labels Pos NoPos --split test --ids 5 17 --layer 1 --output-dir analysis/heatmaps
"""
import argparse
from typing import Dict, List, Tuple

from fairseq_localness.analysis.batches import batch_iterator
from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_checkpoint_args, add_output_args, labels_for, logger, run_cli, start_tool,
)
from fairseq_localness.analysis.outputs import progress, write_json
from fairseq_localness.analysis.plotting import pyplot, save_figure
from fairseq_localness.analysis.segmentation import add_segmenter_args, encode_lines, segmenter_from_args


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis heatmaps", description=__doc__.split("\n\n")[0])
    add_checkpoint_args(p, multiple=True)
    p.add_argument("--split", default="valid", help="split the --ids refer to (default: valid)")
    p.add_argument("--ids", type=int, nargs="+", default=None, help="sentence ids (0-based line numbers) of --split")
    p.add_argument("--sentence", action="append", default=None, help="a raw sentence (repeatable)")
    add_segmenter_args(p)
    p.add_argument("--layer", type=int, default=1, help="encoder layer, 1-based (default: 1)")
    p.add_argument("--head", default="mean", help="'mean' over heads (default) or a 1-based head number")
    p.add_argument("--max-tokens-shown", type=int, default=60,
                   help="longer sentences are drawn without tick labels (default: 60)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("heatmaps", main, argv, get_parser())


def recorded(model, run) -> Dict[str, Dict[str, "object"]]:
    """Call ``run()`` (a forward pass of ``model``, no gradients) inside an
    :class:`~fairseq_localness.modules.observe.AttentionRecorder` and return what each
    module recorded, its calls merged into one dict (a later call's keys win):
    ``{module name: {record key: tensor}}``, float32 CPU tensors."""
    import torch

    from fairseq_localness.modules.observe import AttentionRecorder

    with AttentionRecorder(model) as rec, torch.no_grad():
        run()
    result: Dict[str, Dict[str, object]] = {}
    for name, calls in rec.records.items():
        merged: Dict[str, object] = {}
        for call in calls:
            merged.update(call)
        result[name] = merged
    return result


def branch_attention(model, **net_input) -> Dict[str, Dict[str, "object"]]:
    """Run ``model(**net_input)`` and return every branch distribution of every
    attention sublayer with branches (HySAN's, the hybrid's, ...) and the gates of its
    fusion, for Song et al.'s Fig. 5 heatmaps.

    Returns ``{sublayer name: {"probs_<branch>": B x H x Tq x Tk, "gate_<branch>": B x Tq}}``
    (float32, CPU; the keys of :mod:`fairseq_localness.modules.observe`) from the
    (one) forward call, e.g. ``out["encoder.layers.0.self_attn"]["probs_backward"]``: a
    fusion's records (``...self_attn.fusion``) are merged into its sublayer's.
    """
    result: Dict[str, Dict[str, object]] = {}
    for name, values in recorded(model, lambda: model(**net_input)).items():
        sublayer = name[: -len(".fusion")] if name.endswith(".fusion") else name
        result.setdefault(sublayer, {}).update(values)
    return result


def branch_maps(model, src_tokens, layer: int, head, use_cuda: bool) -> Dict[str, "object"]:
    """``{branch: n x n}`` (float CPU tensors) of encoder layer ``layer`` (1-based) for
    one sentence (``src_tokens``: 1-D, with EOS)."""
    import torch

    from fairseq_localness.modules.observe import PROBS_PREFIX, branch_of

    src = src_tokens.unsqueeze(0)
    lengths = torch.tensor([src.size(1)])
    if use_cuda:
        src, lengths = src.cuda(), lengths.cuda()
    prefix = f"encoder.layers.{layer - 1}.self_attn"
    maps = {}
    for module, values in recorded(model, lambda: model.encoder(src, src_lengths=lengths)).items():
        if not (module == prefix or module.startswith(prefix + ".")):
            continue
        suffix = module[len(prefix):].lstrip(".")
        for name, value in values.items():
            branch = branch_of(name, PROBS_PREFIX)
            if branch is None:
                continue
            probs = value[0]  # H x n x n
            m = probs.mean(0) if head == "mean" else probs[int(head) - 1]
            if suffix and not suffix.startswith("branches"):
                branch = f"{suffix}/{branch}"
            maps[branch] = m.float().cpu()
    return maps


def recorded_layers(model) -> List[int]:
    """Encoder layers whose self-attention records distributions (1-based)."""
    from fairseq_localness.modules.observe import Observable

    out = set()
    for name, module in model.named_modules():
        if isinstance(module, Observable) and name.startswith("encoder.layers.") and ".self_attn" in name:
            out.add(int(name.split(".")[2]) + 1)
    return sorted(out)


def plot_sentence(tokens: List[str], maps: Dict[str, Dict[str, "object"]], labels: List[str], path: str,
                  title: str, max_shown: int):
    return save_figure(sentence_figure(tokens, maps, labels, title, max_shown), path)


def sentence_figure(tokens: List[str], maps: Dict[str, Dict[str, "object"]], labels: List[str], title: str,
                    max_shown: int):
    """One panel per model (rows) and branch (columns), each with its colorbar: the
    colour scale of a panel runs from 0 to that branch's largest weight."""
    plt = pyplot()
    branches = list(dict.fromkeys(b for label in labels for b in maps[label]))
    n = len(tokens)
    size = min(3.2, max(2.0, 0.18 * n))
    fig, axes = plt.subplots(len(labels), len(branches), figsize=((size + 0.5) * len(branches) + 0.8,
                                                                  size * len(labels) + 0.6), squeeze=False)
    for i, label in enumerate(labels):
        for j, branch in enumerate(branches):
            ax = axes[i][j]
            m = maps[label].get(branch)
            if m is None:
                ax.axis("off")
                continue
            im = ax.imshow(m.numpy(), cmap="Blues", vmin=0.0, vmax=max(float(m.max()), 1e-6), aspect="equal")
            cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
            cbar.ax.tick_params(labelsize=5)
            cbar.set_label("attention weight", fontsize=5)
            if n <= max_shown:
                ax.set_xticks(range(n))
                ax.set_yticks(range(n))
                ax.set_xticklabels(tokens, rotation=90, fontsize=5)
                ax.set_yticklabels(tokens, fontsize=5)
            else:
                ax.set_xticks([])
                ax.set_yticks([])
            ax.set_title(f"{label}: {branch}" if len(labels) > 1 else branch, fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def main(args):
    out_dir = start_tool(args)
    if not args.ids and not args.sentence:
        raise AnalysisError("give sentences with --ids (of --split) and/or --sentence")
    if args.head != "mean" and not (args.head.isdigit() and int(args.head) >= 1):
        raise AnalysisError(f"--head {args.head!r}: expected 'mean' or a head number >= 1")
    labels = labels_for(args.path, args.labels)
    segmenter = segmenter_from_args(args) if args.sentence else None
    sentences: List[dict] = []
    results: Dict[Tuple[int, str], Dict[str, object]] = {}
    for path, label in zip(args.path, labels):
        model, cfg, task, use_cuda = load_checkpoint(path, args.data, args.cpu)
        layers = recorded_layers(model)
        if args.layer not in layers:
            raise AnalysisError(
                f"--layer {args.layer}: {label} records attention distributions in encoder layers "
                f"{layers or 'none'} (fairseq's own attention layers are not recorded)"
            )
        if args.head != "mean" and int(args.head) > cfg.model.encoder_attention_heads:
            raise AnalysisError(f"--head {args.head}: {label} has {cfg.model.encoder_attention_heads} heads")
        dictionary = task.source_dictionary
        items = []
        if args.ids:
            dataset, _ = batch_iterator(task, args.split, 1)
            for i in args.ids:
                if not 0 <= i < len(dataset):
                    raise AnalysisError(f"--ids {i}: split {args.split!r} has {len(dataset)} sentences")
                items.append((f"{args.split}{i}", dataset[i]["source"]))
        if args.sentence:
            encoded, unk = encode_lines(args.sentence, dictionary, segmenter)
            if unk > 0.2:
                logger.warning("%.0f%% of the subwords of --sentence are unknown to %s's dictionary: check --bpe",
                               100 * unk, label)
            items += [(f"s{k + 1}", t) for k, t in enumerate(encoded)]
        for k, (name, tokens) in enumerate(progress(items, desc=f"heatmaps {label}", disable=args.no_progress)):
            if len(sentences) <= k:
                sentences.append({"sentence": name, "tokens": [dictionary[t] for t in tokens.tolist()]})
            results[(k, label)] = branch_maps(model, tokens, args.layer, args.head, use_cuda)
        del model
    out = {"layer": args.layer, "head": args.head, "checkpoints": dict(zip(labels, args.path)), "sentences": []}
    for k, sent in enumerate(sentences):
        maps = {label: results[(k, label)] for label in labels}
        out["sentences"].append(dict(sent, models={
            label: {b: [[round(float(v), 6) for v in row] for row in m.tolist()] for b, m in maps[label].items()}
            for label in labels
        }))
        plot_sentence(sent["tokens"], maps, labels, f"{out_dir}/heatmaps_{sent['sentence']}.png",
                      f"encoder layer {args.layer}, heads: {args.head}, sentence {sent['sentence']}",
                      args.max_tokens_shown)
    write_json(f"{out_dir}/heatmaps.json", out)
    return out


if __name__ == "__main__":
    cli_main()
