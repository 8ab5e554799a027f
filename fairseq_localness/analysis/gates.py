"""Gate statistics of a trained model: the mean gate per layer (Xu et al. 2019,
Fig. 3) and per part-of-speech tag (Fig. 4).

Reads every gate the model records while running teacher-forced over a split:

* ``hybrid_transformer`` (``--hybrid-variant gate``): ``g_i`` of eq. 5, the weight of
  the *local* pattern in ``(1 - g_i) global_i + g_i local_i`` (eq. 4); with
  ``--hybrid-gate head`` the mean over heads;
* ``hysan_transformer`` (``--hysan-fusion gated``): the squeeze gate of each branch,
  ``SG(x_b)`` of eq. 14 averaged over the ``d`` channels, one series per branch.

Outputs in ``--output-dir``:

* ``gates_per_layer.csv`` (layer, series, module, tokens, mean, std) and
  ``gates_per_layer.png`` (Fig. 3: the mean over every real token of the split,
  end-of-sentence token included, as the training metric ``enc<n>_gate``);
* with ``--pos-tags``: ``gates_per_pos.csv`` (layer, series, tag, words, mean, std)
  and ``gates_per_pos.png`` (Fig. 4, for ``--pos-layer``, default the first encoder
  layer). The tag file has one line per sentence of the split (same order as the
  raw text that was binarized), one tag per word. A word's gate is the mean gate of
  its subwords. Subwords are matched to words by their characters when
  ``--pos-words`` gives the tokenized sentences the tags belong to, otherwise by the
  segmentation marks (sentencepiece ``▁``, subword-nmt ``@@``); sentences whose
  words and tags cannot be matched are skipped and counted in ``gates.json``;
* ``gates.json``: everything above plus the run's settings.

Example (the first encoder layer of a hybrid model, tags of the embedded corpus)::

    python -m fairseq_localness.analysis.pos_tags --input runs/demo/data/raw/valid.src \\
        --output valid.pos --words-output valid.words
    python -m fairseq_localness.analysis.gates runs/demo/data/bin \\
        --path runs/demo/systems/hybrid-gate/seed1/checkpoint_best.pt --split valid \\
        --pos-tags valid.pos --pos-words valid.words --output-dir analysis/gates
"""
import argparse
import math
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

from fairseq_localness.analysis.batches import iter_sentence_stats
from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_checkpoint_args, add_output_args, add_split_args, require_file, run_cli, start_tool,
)
from fairseq_localness.analysis.layers import layer_label, layer_sort_key
from fairseq_localness.analysis.outputs import read_lines, write_csv, write_json
from fairseq_localness.analysis.plotting import pyplot, save_figure
from fairseq_localness.analysis.segmentation import align_pieces_to_words, words_from_pieces
from fairseq_localness.modules.observe import GATE, GATE_PREFIX, REAL_TOKENS, branch_of


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis gates", description=__doc__.split("\n\n")[0])
    add_checkpoint_args(p)
    add_split_args(p)
    p.add_argument("--pos-tags", default=None, help="tag file: one line per sentence of the split, one tag per word")
    p.add_argument("--pos-words", default=None,
                   help="the tokenized sentences the tags belong to (one per line); aligns subwords to words "
                   "by characters (default: by the subword marks)")
    p.add_argument("--pos-layer", default="enc1", help="layer whose gates per tag are plotted (default: enc1)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("gates", main, argv, get_parser())


def gate_series(values: Dict[str, "object"]) -> Dict[str, "object"]:
    """The gate series among a module's recorded statistics of one sentence: ``gate``
    (hybrid, ``n`` or ``H x n`` -> mean over heads) and ``gate_<branch>`` (HySAN,
    ``n``, returned under the branch's name)."""
    out = {}
    for name, value in values.items():
        branch = branch_of(name, GATE_PREFIX)
        if name == GATE:
            out[GATE] = value.float().mean(0) if value.dim() == 2 else value.float()
        elif branch is not None:
            out[branch] = value.float()
    return out


def sentence_gates(call: Dict[str, "object"]) -> List["object"]:
    """The hybrid gates of one recorded forward call, one tensor per sentence with the
    padding removed: ``n`` (per-token gate) or ``H x n`` (per-head gate), in the order
    of the sentence's tokens.

    ``call`` is one entry of ``AttentionRecorder.records[<name of a GateFusion>]``
    (its ``gate`` and ``real`` records).
    """
    gate, real = call[GATE], call[REAL_TOKENS].bool()
    return [gate[b][..., real[b]] for b in range(gate.size(0))]


def mean_gate_per_layer(records: Dict[str, List[Dict[str, "object"]]]) -> Dict[str, float]:
    """Mean hybrid gate over every real token seen while recording, per gated module
    (Xu et al. 2019, Fig. 3), a per-head gate averaged over its heads. Keys are module
    names, e.g. ``encoder.layers.0.self_attn.fusion``; ``records`` is
    ``AttentionRecorder.records``. The token mask is the one the module recorded over
    whole padded batches (``real``), not the per-sentence cutting of :func:`collect`."""
    means = {}
    for name, calls in records.items():
        if not calls or GATE not in calls[0]:
            continue
        total, count = 0.0, 0
        for call in calls:
            for gate in sentence_gates(call):
                per_token = gate_series({GATE: gate})[GATE]  # n
                total += float(per_token.sum())
                count += per_token.numel()
        means[name] = total / max(count, 1)
    return means


class _Acc:
    """Running count, mean and sum of squares."""

    __slots__ = ("n", "s", "ss")

    def __init__(self):
        self.n, self.s, self.ss = 0, 0.0, 0.0

    def add_many(self, values):
        for v in values:
            self.n += 1
            self.s += v
            self.ss += v * v

    @property
    def mean(self) -> float:
        return self.s / self.n if self.n else float("nan")

    @property
    def std(self) -> float:
        if self.n == 0:
            return float("nan")
        return math.sqrt(max(self.ss / self.n - self.mean ** 2, 0.0))


def collect(model, task, split: str, *, max_sentences=None, batch_size=32, use_cuda=False, show_progress=True,
            tags: Optional[List[List[str]]] = None, words: Optional[List[List[str]]] = None):
    """Per-layer (and per-tag) gate accumulators over ``split``.

    Returns ``(per_layer, per_pos, info)``: ``per_layer[(layer, series, module)]`` and
    ``per_pos[(layer, series, tag)]`` are :class:`_Acc`; ``info`` counts sentences and
    skipped sentences.
    """
    per_layer: Dict[Tuple[str, str, str], _Acc] = defaultdict(_Acc)
    per_pos: Dict[Tuple[str, str, str], _Acc] = defaultdict(_Acc)
    info = {"sentences": 0, "pos_sentences": 0, "pos_skipped": 0, "pos_skipped_ids": []}
    src_dict = task.source_dictionary
    for sent in iter_sentence_stats(model, task, split, max_sentences=max_sentences, batch_size=batch_size,
                                    use_cuda=use_cuda, show_progress=show_progress,
                                    desc="gates"):
        info["sentences"] += 1
        word_of = None
        if tags is not None:
            if sent.id >= len(tags):
                raise AnalysisError(f"--pos-tags has {len(tags)} lines; the split has a sentence {sent.id}")
            pieces = [src_dict[i] for i in sent.src[:-1].tolist()]  # without the final EOS
            if words is not None:
                word_of = align_pieces_to_words(pieces, words[sent.id])
            else:
                word_of = words_from_pieces(pieces)
            n_words = (max(word_of) + 1) if word_of else 0
            if word_of is None or n_words != len(tags[sent.id]):
                word_of = None
                info["pos_skipped"] += 1
                if len(info["pos_skipped_ids"]) < 20:
                    info["pos_skipped_ids"].append(sent.id)
            else:
                info["pos_sentences"] += 1
        for module, (side, values) in sent.modules.items():
            label = layer_label(module)
            for series, g in gate_series(values).items():
                per_layer[(label, series, module)].add_many(g.tolist())
                if word_of is not None and side == "encoder":
                    token_gates = g[:-1].tolist()  # source pieces, EOS dropped
                    sums: Dict[int, List[float]] = defaultdict(list)
                    for w, v in zip(word_of, token_gates):
                        sums[w].append(v)
                    sent_tags = tags[sent.id]
                    for w, vs in sums.items():
                        per_pos[(label, series, sent_tags[w])].add_many([sum(vs) / len(vs)])
    return per_layer, per_pos, info


def plot_per_layer(rows: List[dict], path: str, title: str):
    plt = pyplot()
    layers = sorted({r["layer"] for r in rows}, key=layer_sort_key)
    series = list(dict.fromkeys(r["series"] for r in rows))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.9 * len(layers) * max(1, len(series)) ** 0.5 + 2), 3.6))
    for k, s in enumerate(series):
        xs, ys, es = [], [], []
        for i, layer in enumerate(layers):
            r = next((r for r in rows if r["layer"] == layer and r["series"] == s), None)
            if r is not None:
                xs.append(i + (k - (len(series) - 1) / 2) * width)
                ys.append(r["mean"])
                es.append(r["std"])
        ax.bar(xs, ys, width=width * 0.95, label=s if len(series) > 1 else None, yerr=es, capsize=2,
               color=f"C{k}", alpha=0.85)
        for x, y in zip(xs, ys):
            ax.text(x, y / 2, f"{y:.2f}", ha="center", va="center", fontsize=7, color="white")
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels(layers)
    ax.set_ylim(0, 1)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean gate (weight of the local pattern)" if series == ["gate"] else "mean gate")
    ax.set_title(title, fontsize=9)
    if len(series) > 1:
        ax.legend(fontsize=7, ncol=min(len(series), 4))
    return save_figure(fig, path)


def plot_per_pos(rows: List[dict], path: str, layer: str, title: str):
    return save_figure(per_pos_figure(rows, layer, title), path)


def per_pos_figure(rows: List[dict], layer: str, title: str):
    """Xu et al. Fig. 4: mean gate per POS tag of one layer, bars from 0 (the value on
    each bar), tags in decreasing order of the first series' gate."""
    plt = pyplot()
    rows = [r for r in rows if r["layer"] == layer]
    series = list(dict.fromkeys(r["series"] for r in rows))
    order = sorted({r["tag"] for r in rows},
                   key=lambda t: -next(r["mean"] for r in rows if r["tag"] == t and r["series"] == series[0])
                   if any(r["tag"] == t and r["series"] == series[0] for r in rows) else 0)
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.55 * len(order) * max(1, len(series)) ** 0.5 + 2), 3.6))
    for k, s in enumerate(series):
        xs, ys = [], []
        for i, t in enumerate(order):
            r = next((r for r in rows if r["tag"] == t and r["series"] == s), None)
            if r is not None:
                xs.append(i + (k - (len(series) - 1) / 2) * width)
                ys.append(r["mean"])
        ax.bar(xs, ys, width=width * 0.95, color=f"C{k}", label=s if len(series) > 1 else None)
        for x, y in zip(xs, ys):
            ax.text(x, y, f"{y:.2f}", ha="center", va="bottom", fontsize=6)
    ax.set_ylim(0.0, 1.0)  # gates lie in [0, 1]; bars from 0 keep their lengths comparable
    ax.set_xticks(range(len(order)))
    counts = {t: sum(r["words"] for r in rows if r["tag"] == t and r["series"] == series[0]) for t in order}
    ax.set_xticklabels([f"{t}\n({counts[t]})" for t in order], fontsize=8)
    ax.set_ylabel("mean gate per word")
    ax.set_xlabel("tag (words)")
    ax.set_title(title, fontsize=9)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return fig


def main(args):
    out_dir = start_tool(args)
    tags = words = None
    if args.pos_tags:
        require_file(args.pos_tags, "--pos-tags")
        tags = [line.split() for line in read_lines(args.pos_tags)]
        if args.pos_words:
            require_file(args.pos_words, "--pos-words")
            words = [line.split() for line in read_lines(args.pos_words)]
            if len(words) != len(tags):
                raise AnalysisError(f"--pos-words has {len(words)} lines, --pos-tags {len(tags)}")
    elif args.pos_words:
        raise AnalysisError("--pos-words needs --pos-tags")
    model, cfg, task, use_cuda = load_checkpoint(args.path, args.data, args.cpu)
    per_layer, per_pos, info = collect(
        model, task, args.split, max_sentences=args.max_sentences, batch_size=args.batch_size,
        use_cuda=use_cuda, show_progress=not args.no_progress, tags=tags, words=words,
    )
    if not per_layer:
        raise AnalysisError(
            f"{args.path} records no gates: gates come from hybrid_transformer (--hybrid-variant gate) "
            "and hysan_transformer (--hysan-fusion gated)"
        )
    layer_rows = [
        {"layer": k[0], "series": k[1], "module": k[2], "tokens": a.n, "mean": a.mean, "std": a.std}
        for k, a in sorted(per_layer.items(), key=lambda kv: (layer_sort_key(kv[0][0]), kv[0][1]))
    ]
    write_csv(f"{out_dir}/gates_per_layer.csv", layer_rows, ["layer", "series", "module", "tokens", "mean", "std"])
    title = f"mean gate per layer, {args.split} ({info['sentences']} sentences)"
    plot_per_layer(layer_rows, f"{out_dir}/gates_per_layer.png", title)
    summary = {
        "checkpoint": args.path, "split": args.split, "sentences": info["sentences"],
        "per_layer": layer_rows,
    }
    if tags is not None:
        if info["pos_sentences"] == 0:
            raise AnalysisError(
                f"no sentence of the split could be matched with --pos-tags (skipped {info['pos_skipped']}, "
                f"e.g. ids {info['pos_skipped_ids'][:5]}): check that the tag file has one tag per word, in the "
                "split's order, and pass the tagged sentences with --pos-words"
            )
        pos_rows = [
            {"layer": k[0], "series": k[1], "tag": k[2], "words": a.n, "mean": a.mean, "std": a.std}
            for k, a in sorted(per_pos.items(), key=lambda kv: (layer_sort_key(kv[0][0]), kv[0][1], -kv[1].mean))
        ]
        write_csv(f"{out_dir}/gates_per_pos.csv", pos_rows, ["layer", "series", "tag", "words", "mean", "std"])
        layers = {r["layer"] for r in pos_rows}
        if args.pos_layer not in layers:
            raise AnalysisError(f"--pos-layer {args.pos_layer!r}: the gated encoder layers are "
                                f"{', '.join(sorted(layers, key=layer_sort_key))}")
        plot_per_pos(pos_rows, f"{out_dir}/gates_per_pos.png", args.pos_layer,
                     f"mean gate per POS tag, layer {args.pos_layer}, {args.split} "
                     f"({info['pos_sentences']} sentences)")
        summary.update(per_pos=pos_rows, pos_sentences=info["pos_sentences"], pos_skipped=info["pos_skipped"],
                       pos_skipped_ids=info["pos_skipped_ids"])
    write_json(f"{out_dir}/gates.json", summary)
    return summary


if __name__ == "__main__":
    cli_main()
