"""BLEU by source-length bucket (the DC paper, Fig. 5) and by n-gram order (Yang et al.
2018, Fig. 4) for several systems against a baseline, from hypothesis files.

Inputs: the reference, the source (only its lengths are used) and one hypothesis
file per system, all aligned line by line. A hypothesis file is plain text (one
detokenized translation per line, e.g. ``scripts/evaluate.sh``'s ``hyp.detok``) or
fairseq-generate output (its ``D-`` lines, else its ``H-`` lines, ordered by
sentence id; run fairseq-generate with ``--post-process`` so these are not
subwords, or give ``--remove-bpe``). Scores are sacrebleu's corpus BLEU (``--tokenize``, default ``13a``).

Definitions:

* **Length buckets.** The source length is its number of whitespace-separated
  tokens; pass the segmented source to count subwords as the DC paper does. With
  ``--buckets 10,20,30,40,50`` (the paper's groups, the default) the buckets are
  ``<10``, ``10-20`` (10 <= length < 20), ..., ``>=50``. Each bucket is scored as a
  corpus of its own sentences; empty buckets are left out.
* **n-gram order.** Two views, both in ``bleu_by_ngram.csv`` and the plot:
  ``precision_n``, the modified n-gram precision ``p_n`` (x 100, matched n-grams
  over hypothesis n-grams, clipped by the reference counts, from sacrebleu's
  counts, unsmoothed) of each order alone, and ``bleu_n``, cumulative BLEU-n: brevity penalty times the
  geometric mean of ``p_1 .. p_n`` (``sacrebleu.BLEU(max_ngram_order=n)``; BLEU-4
  is the usual BLEU). Yang et al.'s Fig. 4 plots the gain over the baseline "according
  to N-gram" without a formula; ``precision_n`` shows each order separately,
  ``bleu_n`` how the gain accumulates.

Outputs in ``--output-dir``: ``bleu_by_length.csv`` (bucket, sentences, system,
bleu, delta vs baseline), ``bleu_by_length.png``, ``bleu_by_ngram.csv`` (system, n,
precision, bleu_n and their deltas), ``bleu_by_ngram.png`` (the deltas), and
``bleu_breakdown.json`` (overall BLEU with sacrebleu's signature, and the tables).

Example (two of the demo's systems)::

    python -m fairseq_localness.analysis.bleu_breakdown --ref runs/demo/data/raw/test.tgt \\
        --src runs/demo/data/bpe/test.src --buckets 8,10,12,14 \\
        --hyp transformer=runs/demo/systems/transformer/seed1/eval/hyp.detok \\
        --hyp localness=runs/demo/systems/localness/seed1/eval/hyp.detok --output-dir analysis/bleu
"""
import argparse
from typing import Dict, List, Sequence, Tuple

from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_output_args, logger, parse_named, require_file, run_cli,
)
from fairseq_localness.analysis.outputs import ensure_dir, read_lines, write_csv, write_json
from fairseq_localness.analysis.plotting import finish_figure, pyplot


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis bleu_breakdown",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="reference translations, one per line")
    p.add_argument("--src", required=True, help="source sentences, one per line (for the lengths)")
    p.add_argument("--hyp", action="append", required=True, metavar="NAME=FILE",
                   help="a system's hypotheses (text or fairseq-generate output); repeatable")
    p.add_argument("--baseline", default=None, help="name of the baseline system (default: the first --hyp)")
    p.add_argument("--buckets", default="10,20,30,40,50",
                   help="increasing bucket boundaries in source tokens (default: 10,20,30,40,50)")
    p.add_argument("--max-order", type=int, default=4, help="largest n-gram order (default: 4)")
    p.add_argument("--tokenize", default="13a", help="sacrebleu tokenizer (default: 13a)")
    p.add_argument("--lowercase", action="store_true", help="case-insensitive BLEU")
    p.add_argument("--remove-bpe", choices=["sentencepiece", "subword_nmt", "none"], default="none",
                   help="undo this subword segmentation in the hypotheses (for segmented fairseq-generate "
                   "output; default: none)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("bleu_breakdown", main, argv, get_parser())


def read_hypotheses(path: str) -> List[str]:
    """Plain text, or the ``D-`` (else ``H-``) lines of fairseq-generate output."""
    require_file(path, "--hyp file")
    lines = read_lines(path)
    for prefix in ("D-", "H-"):
        found = {}
        for line in lines:
            if line.startswith(prefix):
                parts = line[len(prefix):].split("\t")
                if len(parts) >= 2 and parts[0].isdigit():
                    found[int(parts[0])] = parts[2] if len(parts) >= 3 else ""
        if found:
            if prefix == "H-":
                logger.warning("%s: using H- lines (no D- lines); they are subwords unless fairseq-generate "
                               "ran with --post-process", path)
            missing = [i for i in range(max(found) + 1) if i not in found]
            if missing:
                raise AnalysisError(f"{path}: fairseq-generate output lacks sentences {missing[:10]}")
            return [found[i] for i in range(len(found))]
    return lines


def parse_buckets(spec: str) -> List[int]:
    try:
        bounds = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise AnalysisError(f"--buckets {spec!r}: expected increasing whole numbers, e.g. 10,20,30") from None
    if not bounds or any(b <= 0 for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise AnalysisError(f"--buckets {spec!r}: expected increasing whole numbers > 0, e.g. 10,20,30")
    return bounds


def bucket_of(length: int, bounds: Sequence[int]) -> Tuple[int, str]:
    """(index, label) of the bucket of a source length."""
    if length < bounds[0]:
        return 0, f"<{bounds[0]}"
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if lo <= length < hi:
            return i + 1, f"{lo}-{hi}"
    return len(bounds), f">={bounds[-1]}"


def corpus_bleu(hyps: Sequence[str], refs: Sequence[str], order: int = 4, tokenize: str = "13a",
                lowercase: bool = False):
    from sacrebleu.metrics import BLEU

    return BLEU(max_ngram_order=order, tokenize=tokenize, lowercase=lowercase).corpus_score(list(hyps), [list(refs)])


def signature(hyps, refs, order: int, tokenize: str, lowercase: bool) -> str:
    """sacrebleu's signature of the overall scores (it needs a scored corpus)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(max_ngram_order=order, tokenize=tokenize, lowercase=lowercase)
    bleu.corpus_score(list(hyps), [list(refs)])
    return str(bleu.get_signature())


def remove_segmentation(line: str, method: str) -> str:
    """Undo sentencepiece (``▁``) or subword-nmt (``@@ ``) segmentation; a line
    without sentencepiece's marks is left as it is (plain text)."""
    if method == "sentencepiece" and "\u2581" in line:
        return "".join(line.split()).replace("\u2581", " ").strip()
    if method == "subword_nmt":
        return (line + " ").replace("@@ ", "").rstrip()
    return line


def by_length(systems: Dict[str, List[str]], refs, lengths, bounds, args) -> List[Dict]:
    groups: Dict[int, List[int]] = {}
    labels = {}
    for i, n in enumerate(lengths):
        b, label = bucket_of(n, bounds)
        groups.setdefault(b, []).append(i)
        labels[b] = label
    rows = []
    for b in sorted(groups):
        idx = groups[b]
        scores = {name: corpus_bleu([h[i] for i in idx], [refs[i] for i in idx], args.max_order, args.tokenize,
                                    args.lowercase).score for name, h in systems.items()}
        for name, score in scores.items():
            rows.append({"bucket": labels[b], "sentences": len(idx), "system": name, "bleu": score,
                         "delta": score - scores[args.baseline]})
    return rows


def raw_precision(score, n: int) -> float:
    """Modified n-gram precision of order n, x 100, without smoothing (sacrebleu's
    ``precisions`` holds the smoothed values, which differ for orders without a match)."""
    return 100.0 * score.counts[n - 1] / score.totals[n - 1] if score.totals[n - 1] else 0.0


def by_ngram(systems: Dict[str, List[str]], refs, args) -> List[Dict]:
    rows = []
    base = None
    for name in [args.baseline] + [n for n in systems if n != args.baseline]:
        full = corpus_bleu(systems[name], refs, args.max_order, args.tokenize, args.lowercase)
        cumulative = [corpus_bleu(systems[name], refs, n, args.tokenize, args.lowercase).score
                      for n in range(1, args.max_order + 1)]
        sys_rows = [{"system": name, "n": n, "precision": raw_precision(full, n), "bleu_n": cumulative[n - 1]}
                    for n in range(1, args.max_order + 1)]
        if base is None:
            base = sys_rows
        for r, b in zip(sys_rows, base):
            r["precision_delta"] = r["precision"] - b["precision"]
            r["bleu_n_delta"] = r["bleu_n"] - b["bleu_n"]
        rows += sys_rows
    order = list(systems)
    return sorted(rows, key=lambda r: (order.index(r["system"]), r["n"]))


def plot_length(rows: List[Dict], names: List[str], path: str, title: str):
    plt = pyplot()
    buckets = list(dict.fromkeys(r["bucket"] for r in rows))
    counts = {r["bucket"]: r["sentences"] for r in rows}
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(buckets) * len(names) ** 0.5 + 2), 3.8))
    for k, name in enumerate(names):
        ys = [next(r["bleu"] for r in rows if r["bucket"] == b and r["system"] == name) for b in buckets]
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(buckets))]
        ax.bar(xs, ys, width=width * 0.95, color=f"C{k}", label=name)
    ax.set_xticks(range(len(buckets)))
    ax.set_xticklabels([f"{b}\n({counts[b]})" for b in buckets], fontsize=8)
    ax.set_xlabel("source length (sentences)")
    ax.set_ylabel("BLEU")
    lo = min(r["bleu"] for r in rows)
    hi = max(r["bleu"] for r in rows)
    ax.set_ylim(max(0.0, lo - 0.25 * (hi - lo) - 1), hi + 0.1 * (hi - lo) + 1)
    ax.legend(fontsize=7, ncol=min(len(names), 4))
    ax.set_title(title, fontsize=9)
    return finish_figure(fig, path)


def plot_ngram(rows: List[Dict], names: List[str], baseline: str, path: str, title: str):
    plt = pyplot()
    others = [n for n in names if n != baseline] or [baseline]
    orders = sorted({r["n"] for r in rows})
    width = 0.8 / len(others)
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, what in ((axes[0], "precision_delta", "(a) n-gram precision p_n"),
                          (axes[1], "bleu_n_delta", "(b) cumulative BLEU-n")):
        for k, name in enumerate(others):
            ys = [next(r[key] for r in rows if r["system"] == name and r["n"] == n) for n in orders]
            xs = [i + (k - (len(others) - 1) / 2) * width for i in range(len(orders))]
            ax.bar(xs, ys, width=width * 0.95, color=f"C{names.index(name)}", label=name)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xticks(range(len(orders)))
        ax.set_xticklabels([f"{n}-gram" for n in orders])
        ax.set_ylabel(f"gain over {baseline}")
        ax.set_title(what, fontsize=9)
    if len(others) > 1:
        axes[1].legend(fontsize=7)
    return finish_figure(fig, path, title)


def main(args):
    out_dir = ensure_dir(args.output_dir)
    require_file(args.ref, "--ref")
    require_file(args.src, "--src")
    if args.max_order < 1:
        raise AnalysisError(f"--max-order must be >= 1 (got {args.max_order})")
    bounds = parse_buckets(args.buckets)
    refs = read_lines(args.ref)
    lengths = [len(line.split()) for line in read_lines(args.src)]
    if len(lengths) != len(refs):
        raise AnalysisError(f"--src has {len(lengths)} lines, --ref {len(refs)}")
    systems = {}
    for name, path in parse_named(args.hyp, "--hyp"):
        hyps = [remove_segmentation(h, args.remove_bpe) for h in read_hypotheses(path)]
        if sum("\u2581" in h or "@@ " in h for h in hyps) > len(hyps) / 2:
            logger.warning("--hyp %s: most hypotheses still contain subword marks; use --remove-bpe", name)
        if len(hyps) != len(refs):
            raise AnalysisError(f"--hyp {name}: {path} has {len(hyps)} hypotheses for {len(refs)} references")
        systems[name] = hyps
    args.baseline = args.baseline or next(iter(systems))
    if args.baseline not in systems:
        raise AnalysisError(f"--baseline {args.baseline!r} is not one of the systems {list(systems)}")
    names = list(systems)
    length_rows = by_length(systems, refs, lengths, bounds, args)
    ngram_rows = by_ngram(systems, refs, args)
    write_csv(f"{out_dir}/bleu_by_length.csv", length_rows, ["bucket", "sentences", "system", "bleu", "delta"])
    write_csv(f"{out_dir}/bleu_by_ngram.csv", ngram_rows,
              ["system", "n", "precision", "precision_delta", "bleu_n", "bleu_n_delta"])
    plot_length(length_rows, names, f"{out_dir}/bleu_by_length.png", "BLEU by source length")
    plot_ngram(ngram_rows, names, args.baseline, f"{out_dir}/bleu_by_ngram.png", "BLEU gain by n-gram order")
    overall = {}
    for name, hyps in systems.items():
        score = corpus_bleu(hyps, refs, args.max_order, args.tokenize, args.lowercase)
        overall[name] = {"bleu": score.score,
                         "precisions": [raw_precision(score, n) for n in range(1, args.max_order + 1)], "bp": score.bp,
                         "sys_len": score.sys_len, "ref_len": score.ref_len}
    summary = {"baseline": args.baseline,
               "signature": signature(systems[args.baseline], refs, args.max_order, args.tokenize, args.lowercase),
               "buckets": bounds, "overall": overall, "by_length": length_rows, "by_ngram": ngram_rows}
    write_json(f"{out_dir}/bleu_breakdown.json", summary)
    return summary


if __name__ == "__main__":
    cli_main()
