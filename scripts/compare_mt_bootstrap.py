#!/usr/bin/env python3
"""Paired bootstrap significance of BLEU with compare-mt, and a JSON summary of it.

    compare_mt_bootstrap.py --ref REF --hyp NAME=FILE --hyp NAME=FILE [...] --out DIR
                            [--samples 1000] [--seed 1] [--prob-thresh 0.05] [--tokenize 13a|none]

The first --hyp is the baseline. The texts are tokenized first (--tokenize 13a,
the default: sacrebleu's default tokenizer, so compare-mt's BLEU on whitespace tokens is
sacrebleu's BLEU; --tokenize none: the files are already tokenized, e.g. the
*.tok_bleu files of evaluate.sh --tok-bleu) into DIR/inputs/. Then compare-mt runs,
in this process, exactly as the command line it prints (``compare-mt REF HYP...
--sys_names ... --compare_scores score_type=bleu,bootstrap=N,prob_thresh=P --seed S
--output_directory DIR``), with all its default reports. Its text report goes to
DIR/compare_mt.txt, its HTML report to DIR/index.html (figures next to it). One fix:
where a system's full-corpus BLEU lies outside its own bootstrap interval (near-zero
BLEU, tiny test sets), compare-mt's score figure would fail on a negative error bar;
such bars are drawn with length 0 instead (the numbers are unchanged).

compare-mt draws, N times, a sample of half the sentences (with replacement) and
scores every system on it. For each pair of systems (s1 = the earlier one) it counts
the samples where s1 scores higher and where s2 scores higher; its third number
counts the samples where s2 does not score higher (it includes s1's wins), so the
tie rate here is 1 - wins(s1) - wins(s2). compare-mt's "p" is 1 - max(wins(s1),
wins(s2)), and it declares s1>s2 (or s2>s1) when 1 - wins < --prob-thresh.

DIR/significance.json::

  {"baseline": NAME, "samples": N, "seed": S, "prob_thresh": P, "tokenize": "13a",
   "systems": {NAME: {"file": FILE, "bleu": 27.3, "bleu_str": "27.3 (BP=...)",
                      "bootstrap": {"mean", "median", "lower_bound", "upper_bound"}}},
   "comparisons": [{"baseline": s1, "system": s2,
                    "win": P(s2 > s1), "tie": P(s2 == s1), "loss": P(s2 < s1),
                    "p_value": compare-mt's p, "better": the significantly better name or null,
                    "compare_mt_verdict": "s1>s2" | "s2>s1" | "-",
                    "compare_mt_wins": compare-mt's three numbers}]}

Imports compare-mt and sacrebleu only (not fairseq). Used by significance.sh.
"""
import argparse
import contextlib
import io
import json
import os
import re
import shlex
import sys
from typing import Dict, List, Tuple

NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


def parse_named(specs: List[str]) -> List[Tuple[str, str]]:
    out = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not NAME_RE.match(name) or not path:
            raise ValueError(f"--hyp: expected NAME=FILE (NAME of letters, digits, _.+-), got '{spec}'")
        out.append((name, path))
    return out


def tokenize_13a(lines: List[str]) -> List[str]:
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok = Tokenizer13a()
    return [tok(line.rstrip("\n")) for line in lines]


def run_compare_mt(argv: List[str], text_report: str):
    """Run compare-mt's main with ``argv``; its stdout goes to ``text_report``.
    Returns the BLEU score reports it produced (compare-mt's ScoreReport objects)."""
    import matplotlib

    matplotlib.use("Agg")
    from compare_mt import compare_mt_main

    from compare_mt import reporters

    captured = []
    original = compare_mt_main.generate_score_report
    original_chart = reporters.make_bar_chart

    def make_bar_chart(datas, *args, errs=None, **kwargs):
        # compare-mt draws the bootstrap interval as an error bar around the full-corpus
        # score; when that score lies outside the interval (a system near 0 BLEU, a
        # small test set) the bar length is negative and matplotlib refuses it.
        if errs is not None:
            import numpy as np

            errs = [np.clip(np.asarray(e, dtype=float), 0.0, None) for e in errs]
        return original_chart(datas, *args, errs=errs, **kwargs)

    reporters.make_bar_chart = make_bar_chart

    def generate_score_report(*args, **kwargs):
        report = original(*args, **kwargs)
        captured.append(report)
        return report

    compare_mt_main.generate_score_report = generate_score_report
    saved_argv = sys.argv
    buf = io.StringIO()
    try:
        sys.argv = ["compare-mt"] + argv
        with contextlib.redirect_stdout(buf):
            compare_mt_main.main()
    finally:
        sys.argv = saved_argv
        compare_mt_main.generate_score_report = original
        reporters.make_bar_chart = original_chart
    with open(text_report, "w", encoding="utf-8") as f:
        f.write(buf.getvalue())
    return captured


def summarize(report, names: List[str], files: Dict[str, str], args) -> Dict:
    systems = {}
    for i, name in enumerate(names):
        stats = report.sys_stats[i]
        systems[name] = {
            "file": files[name], "bleu": float(report.scores[i]), "bleu_str": report.strs[i],
            "bootstrap": {k: float(v) for k, v in stats.items()},
        }
    comparisons = []
    for (i, j), wins in report.wins:
        w1, w2 = float(wins[0]), float(wins[1])
        verdict, pval = report.winstr_pval(wins)
        better = names[i] if verdict == "s1>s2" else names[j] if verdict == "s2>s1" else None
        comparisons.append({
            "baseline": names[i], "system": names[j],
            "win": w2, "tie": max(0.0, 1.0 - w1 - w2), "loss": w1,
            "p_value": float(pval), "better": better, "compare_mt_verdict": verdict,
            "compare_mt_wins": [float(x) for x in wins],
        })
    return {"baseline": names[0], "samples": args.samples, "seed": args.seed, "prob_thresh": args.prob_thresh,
            "tokenize": args.tokenize, "score_type": "bleu", "systems": systems, "comparisons": comparisons}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", required=True)
    p.add_argument("--hyp", action="append", required=True, metavar="NAME=FILE",
                   help="a system's output; repeatable, the first is the baseline")
    p.add_argument("--out", required=True, help="directory for the reports (must exist)")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--prob-thresh", type=float, default=0.05)
    p.add_argument("--tokenize", choices=["13a", "none"], default="13a")
    args = p.parse_args(argv)
    try:
        named = parse_named(args.hyp)
    except ValueError as e:
        print(f"compare_mt_bootstrap.py: error: {e}", file=sys.stderr)
        return 2
    names = [n for n, _ in named]
    if len(set(names)) != len(names) or len(names) < 2:
        print(f"compare_mt_bootstrap.py: error: expected two or more systems with distinct names, got {names}",
              file=sys.stderr)
        return 2
    files = dict(named)

    inputs = os.path.join(args.out, "inputs")
    os.makedirs(inputs, exist_ok=True)
    paths = {}
    for key, path in [("ref", args.ref)] + named:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if args.tokenize == "13a":
            lines = tokenize_13a(lines)
        paths[key] = os.path.join(inputs, f"{key}.txt" if key == "ref" else f"hyp.{key}.txt")
        with open(paths[key], "w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line in lines)

    cm_argv = [paths["ref"]] + [paths[n] for n in names] + [
        "--sys_names", *names,
        "--compare_scores", f"score_type=bleu,bootstrap={args.samples},prob_thresh={args.prob_thresh}",
        "--seed", str(args.seed), "--output_directory", args.out]
    print("+ compare-mt " + " ".join(shlex.quote(a) for a in cm_argv), file=sys.stderr, flush=True)
    reports = run_compare_mt(cm_argv, os.path.join(args.out, "compare_mt.txt"))
    if len(reports) != 1 or reports[0].wins is None:
        print("compare_mt_bootstrap.py: error: compare-mt produced no bootstrap BLEU report", file=sys.stderr)
        return 1
    summary = summarize(reports[0], names, files, args)
    with open(os.path.join(args.out, "significance.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    for c in summary["comparisons"]:
        a, b = c["baseline"], c["system"]
        print(f"{b} vs {a}: BLEU {summary['systems'][b]['bleu']:.2f} vs {summary['systems'][a]['bleu']:.2f}; "
              f"{b} better in {100 * c['win']:.1f}% of {args.samples} samples, {a} in {100 * c['loss']:.1f}%, "
              f"tied in {100 * c['tie']:.1f}%; p = {c['p_value']:.4f}; "
              f"{'significant: ' + c['better'] + ' is better' if c['better'] else 'not significant'} "
              f"(threshold {args.prob_thresh})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
