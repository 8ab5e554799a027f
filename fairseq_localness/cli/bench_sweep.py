"""The length sweep of ``fairseq-localness-bench --lengths 32,256,1024``.

One benchmark run (:func:`fairseq_localness.cli.bench_run.run`: every system next to
the transformer, interleaved rounds, the same bounds and activations) per sentence
length ``T``, with a batch of about the same number of tokens at every length:

* training: ``max(1, TOKENS // T)`` sentences of ``T`` source and ``T`` target tokens
  (``--tokens-per-batch TOKENS``; default 2048, the default run's 64 x 32, which gives
  64 x 32, 8 x 256 and 2 x 1024);
* decoding: ``max(1, DECODE_TOKENS // T)`` sentences of ``T`` source tokens
  (``--decode-tokens``; default 1024, the default run's 32 x 32: 32, 4 and 1
  sentences), beam 4, ``min(T, MAX_DECODE_LEN)`` output steps (``--max-decode-len``,
  default 256): a beam search over 1024 steps takes minutes per system on a CPU, and
  the decoding targets are set at T <= 256. The capped lengths are named in the
  output.

The results per length and system (train ratio / bound, decode ratio / bound,
activations ratio and every column of a single run) go to ``bench.json`` and
``bench.md``, and the curves to ``bench_sweep.png``: x = length (log scale), one line
per system; panels for the training and decoding ratio / bound and the activations
ratio.
"""
import argparse
import copy
import logging
import os
import sys
from typing import Callable, Dict, List, Optional, Tuple

from fairseq_localness.cli.bench_report import baseline, records, table
from fairseq_localness.cli.bench_run import BASELINE, Result, arithmetic_bound, decode_bound, run

MIN_LENGTH = 2  # a source sentence of at least one token and its end-of-sentence symbol
# option -> (quick, full) default
DEFAULTS = dict(tokens_per_batch=(120, 2048), decode_tokens=(40, 1024), max_decode_len=(10, 256))
# what a single run takes from the command line and the sweep sets per length
PER_LENGTH = ("batch_size", "src_len", "tgt_len", "decode_batch", "decode_len")
PLOT = "bench_sweep.png"


def parse_lengths(text: str) -> List[int]:
    """``"32,256,1024"`` -> ``[32, 256, 1024]``; raises ``ValueError`` with the reason for
    anything else than distinct integers >= MIN_LENGTH, separated by commas."""
    items = [item.strip() for item in text.split(",")]
    try:
        lengths = [int(item) for item in items]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, e.g. 32,256,1024; got {text!r}") from None
    small = [n for n in lengths if n < MIN_LENGTH]
    if small:
        raise ValueError(f"every length must be >= {MIN_LENGTH}, got {small}")
    if len(set(lengths)) < len(lengths):
        raise ValueError(f"a length given twice in {text!r}")
    return sorted(lengths)


def check_args(args, parser: argparse.ArgumentParser):
    """Fill in the sweep's defaults and refuse what it cannot honour (``parser.error``:
    exit status 2): the batch options of a single run with ``--lengths`` (the sweep sets
    them per length) and the sweep's options without it."""
    given = {key: getattr(args, key) for key in DEFAULTS}
    if args.lengths is None:
        extra = [f"--{k.replace('_', '-')}" for k, v in given.items() if v is not None]
        if extra:
            parser.error(f"{', '.join(extra)}: only with --lengths (the length sweep)")
        return
    try:
        args.lengths = parse_lengths(args.lengths)
    except ValueError as exc:
        parser.error(f"--lengths: {exc}")
    clash = [f"--{k.replace('_', '-')}" for k in PER_LENGTH if getattr(args, k) is not None]
    if clash:
        parser.error(f"{', '.join(clash)}: not with --lengths, which sets the batch per length "
                     "(use --tokens-per-batch, --decode-tokens, --max-decode-len)")
    for key, (quick, full) in DEFAULTS.items():
        if given[key] is None:
            setattr(args, key, quick if args.quick else full)
        elif given[key] < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {given[key]}")


def shape(length: int, args) -> Dict[str, int]:
    """The batch of one length: training and decoding batch, lengths, output steps."""
    return dict(batch_size=max(1, args.tokens_per_batch // length), src_len=length, tgt_len=length,
                decode_batch=max(1, args.decode_tokens // length), decode_len=min(length, args.max_decode_len))


def describe(length: int, args) -> str:
    s = shape(length, args)
    capped = " (capped by --max-decode-len)" if s["decode_len"] < length else ""
    return (f"T={length}: training {s['batch_size']} x {length} tokens; decoding {s['decode_batch']} sentence(s) "
            f"of {length} source tokens, {s['decode_len']} output steps{capped}")


def run_sweep(args, done: Optional[Callable[[List[dict]], object]] = None) -> List[dict]:
    """One :func:`run` per length, shortest first; returns ``[{"length", the batch shape,
    "results"}]``, and hands the lengths measured so far to ``done`` after each but the
    last, and after each round the lengths done and the current one's rounds so far
    (its entry with ``"partial"``: which round), so that a sweep stopped by a time
    limit keeps them."""
    out: List[dict] = []
    for length in args.lengths:
        one = copy.copy(args)
        for key, value in shape(length, args).items():
            setattr(one, key, value)
        one.output_dir = os.path.join(args.output_dir, f"T{length}")  # --profile's tables
        print(f"sweep: {describe(length, args)}", file=sys.stderr)

        def after_round(results, where, length=length):
            if done is not None:
                done(out + [dict(length=length, **shape(length, args), results=results, partial=where)])

        out.append(dict(length=length, **shape(length, args), results=run(one, after_round)))
        if done is not None and len(out) < len(args.lengths):
            done(out)
    return out


def summary(sweep: List[dict]) -> Dict[str, Dict[str, dict]]:
    """system -> str(length) -> the three ratios of the sweep (``None`` where a system
    failed or a ratio has no reference)."""
    rows: Dict[str, Dict[str, dict]] = {}
    for entry in sweep:
        results: List[Result] = entry["results"]
        base = baseline(results)
        for r in results:
            train, dec = arithmetic_bound(r, base), decode_bound(r, base)
            rows.setdefault(r.name, {})[str(entry["length"])] = dict(
                train_ratio_over_bound=r.train_ratio / train if r.train_ratio and train else None,
                decode_ratio_over_bound=r.decode_ratio / dec if r.decode_ratio and dec else None,
                activations_ratio=(r.activation_bytes / base.activation_bytes
                                   if base and base.activation_bytes and not r.error else None),
                error=r.error,
            )
    return rows


PANELS = (("train_ratio_over_bound", "train ratio / bound"), ("decode_ratio_over_bound", "decode ratio / bound"),
          ("activations_ratio", "activations ratio"))


def sweep_table(rows: Dict[str, Dict[str, dict]], lengths: List[int]) -> str:
    """One line per system: each panel's value at every length."""
    header = ["system"] + [f"{title}, T={n}" if i == 0 else f"T={n}" for _, title in PANELS
                           for i, n in enumerate(lengths)]
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for name, by_length in rows.items():
        cells = []
        for key, _ in PANELS:
            for n in lengths:
                value = by_length.get(str(n), {}).get(key)
                cells.append(f"{value:.3f}" if value is not None else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Dict[str, Dict[str, dict]], lengths: List[int], path: str, title: str):
    """The sweep's curves (matplotlib on the Agg canvas, no display needed)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search logs at DEBUG
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 5.2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(PANELS))
    for ax, (key, label) in zip(axes, PANELS):
        for name, by_length in rows.items():
            if name == BASELINE:
                continue
            points = [(n, by_length[str(n)][key]) for n in lengths
                      if str(n) in by_length and by_length[str(n)][key] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("sentence length T (tokens)")
        ax.set_ylabel(label + (" (transformer = 1)" if key == "activations_ratio" else ""))
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, max(1, len(labels))), fontsize="small")
    fig.suptitle(title, fontsize="small")
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(path, dpi=110)


def report(sweep: List[dict], args, machine: str) -> Tuple[dict, str]:
    """Draw the plot (``OUTPUT_DIR/bench_sweep.png``); returns what goes to ``bench.json``
    (the per-length records, the summary, the plot's name) and the text of ``bench.md``."""
    lengths = [entry["length"] for entry in sweep]
    rows = summary(sweep)
    notes = [describe(n, args) for n in lengths]
    md = [f"Measured on {machine}.", "", "Length sweep, per length:", ""] + [f"* {n}" for n in notes]
    partial = [entry for entry in sweep if entry.get("partial")]
    if len(lengths) < len(args.lengths) or partial:
        md += ["", f"Lengths measured so far: {lengths} of {args.lengths}."]
    for entry in partial:
        md += ["", f"T = {entry['length']} so far: {entry['partial']} (the run went on)."]
    md += ["", sweep_table(rows, lengths)]
    for entry in sweep:
        md += [f"## T = {entry['length']}", "", table(entry["results"], machine)]
    text = "\n".join(md)
    os.makedirs(args.output_dir, exist_ok=True)
    if not partial:  # (drawn once a length is whole)
        plot(rows, lengths, os.path.join(args.output_dir, PLOT), f"{machine}; tokens per training batch "
             f"{args.tokens_per_batch}, decoding {args.decode_tokens}, at most {args.max_decode_len} output steps")
    return dict(
        sweep=[dict({k: v for k, v in entry.items() if k != "results"}, note=describe(entry["length"], args),
                    results=records(entry["results"])) for entry in sweep],
        summary=rows,
        plot=None if partial else PLOT,
    ), text
