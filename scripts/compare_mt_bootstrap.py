#!/usr/bin/env python3
"""Paired bootstrap significance of BLEU with compare-mt, and a JSON summary of it.

    compare_mt_bootstrap.py --ref REF --hyp NAME=FILE --hyp NAME=FILE [...] --out DIR
                            [--samples 1000] [--seed 1] [--prob-thresh 0.05] [--tokenize 13a|none]

The first --hyp is the baseline. The texts are tokenized first (--tokenize 13a,
the default: sacrebleu's default tokenizer, so compare-mt's BLEU on whitespace tokens is
sacrebleu's BLEU; --tokenize none: the files are already tokenized, e.g. the
*.tok_bleu files of evaluate.sh --tok-bleu) into DIR/inputs/. Then compare-mt's
reports are made through its Python API (``compare_mt.compare_mt_main``'s
``generate_*_report`` functions and ``reporters.generate_html_report``), the same
reports with the same settings as its command line ``compare-mt REF HYP...
--sys_names ... --compare_scores score_type=bleu,bootstrap=N,prob_thresh=P
score_type=length --seed S --output_directory DIR`` (which is logged): the BLEU
scores with the paired bootstrap, lengths, word accuracy by frequency, sentence
buckets, characteristic n-grams and sentence examples. Their text goes to
DIR/compare_mt.txt, the HTML report to DIR/index.html (figures next to it). One
difference: where a system's full-corpus BLEU lies outside its own bootstrap interval
(near-zero BLEU, tiny test sets), compare-mt's score figure would fail on a negative
error bar; the score report here is compare-mt's ScoreReport with a figure that draws
such bars with length 0 (the numbers are unchanged).

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
import logging
import os
import re
import shlex
import sys
from typing import Dict, List, Tuple

NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
logger = logging.getLogger("compare_mt_bootstrap")


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


# compare-mt's default reports (its command line's defaults), after the BLEU score report
DEFAULT_REPORTS = [
    ("Aggregate Scores", "generate_score_report", {"score_type": "length"}, True),
    ("Word Accuracies", "generate_word_accuracy_report", {"bucket_type": "freq"}, False),
    ("Sentence Buckets", "generate_sentence_bucketed_report",
     {"bucket_type": "length", "statistic_type": "score", "score_measure": "bleu"}, True),
    ("Sentence Buckets", "generate_sentence_bucketed_report", {"bucket_type": "lengthdiff"}, True),
    ("Sentence Buckets", "generate_sentence_bucketed_report", {"bucket_type": "score", "score_measure": "sentbleu"},
     True),
    ("Characteristic N-grams", "generate_ngram_report", {"compare_type": "match"}, False),
    ("Sentence Examples", "generate_sentence_examples", {"score_type": "sentbleu"}, True),
]
FIG_SIZE = (6.0, 4.5)  # compare-mt's default --fig_size


def score_report_with_clipped_bars(report):
    """The same report as compare-mt's ScoreReport whose figure draws an error bar that
    would be negative (the full-corpus score outside its bootstrap interval) with length 0."""
    import numpy as np
    from compare_mt import reporters

    class ClippedScoreReport(reporters.ScoreReport):
        def plot(self, output_directory, output_fig_file, output_fig_format="pdf"):
            errs = None
            if self.wins:
                errs = [np.clip(np.array([[score - st["lower_bound"]], [st["upper_bound"] - score]]), 0.0, None)
                        for score, st in zip(self.scores, self.sys_stats)]
            reporters.make_bar_chart([[score] for score in self.scores], output_directory, output_fig_file,
                                     output_fig_format=output_fig_format, errs=errs, ylabel=self.scorer.name())

    clipped = ClippedScoreReport.__new__(ClippedScoreReport)
    clipped.__dict__.update(report.__dict__)
    return clipped


def run_compare_mt(ref_path: str, hyp_paths: List[str], names: List[str], samples: int, prob_thresh: float,
                   seed: int, out_dir: str, text_report: str):
    """compare-mt's reports through its API; returns the BLEU score report (its
    ScoreReport, with the bootstrap's win rates)."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    from compare_mt import compare_mt_main, corpus_utils, reporters

    np.random.seed(seed)  # what compare-mt's --seed does
    reporters.sys_names = list(names)  # compare-mt's reports read the names and figure size from here
    reporters.fig_size = FIG_SIZE
    ref = corpus_utils.load_tokens(ref_path)
    outs = [corpus_utils.load_tokens(p) for p in hyp_paths]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):  # each report prints its text
        bleu = compare_mt_main.generate_score_report(ref, outs, None, score_type="bleu", bootstrap=samples,
                                                     prob_thresh=prob_thresh)
        sections: Dict[str, list] = {"Aggregate Scores": [score_report_with_clipped_bars(bleu)]}
        for section, func, kwargs, use_src in DEFAULT_REPORTS:
            if section in ("Characteristic N-grams", "Sentence Examples") and len(outs) < 2:
                continue
            f = getattr(compare_mt_main, func)
            report = f(ref, outs, None, **kwargs) if use_src else f(ref, outs, **kwargs)
            sections.setdefault(section, []).append(report)
    reporters.generate_html_report(list(sections.items()), out_dir, "compare-mt Analysis Report")
    with open(text_report, "w", encoding="utf-8") as f:
        f.write(buf.getvalue())
    return bleu


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
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stderr, force=True)
    try:
        named = parse_named(args.hyp)
    except ValueError as e:
        logger.error("compare_mt_bootstrap.py: error: %s", e)
        return 2
    names = [n for n, _ in named]
    if len(set(names)) != len(names) or len(names) < 2:
        logger.error("compare_mt_bootstrap.py: error: expected two or more systems with distinct names, got %s", names)
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

    equivalent = [paths["ref"]] + [paths[n] for n in names] + [
        "--sys_names", *names,
        "--compare_scores", f"score_type=bleu,bootstrap={args.samples},prob_thresh={args.prob_thresh}",
        "score_type=length", "--seed", str(args.seed), "--output_directory", args.out]
    logger.info("compare-mt (its API), the reports of: compare-mt %s", " ".join(shlex.quote(a) for a in equivalent))
    report = run_compare_mt(paths["ref"], [paths[n] for n in names], names, args.samples, args.prob_thresh,
                            args.seed, args.out, os.path.join(args.out, "compare_mt.txt"))
    if report.wins is None:
        logger.error("compare_mt_bootstrap.py: error: compare-mt produced no bootstrap BLEU report")
        return 1
    summary = summarize(report, names, files, args)
    with open(os.path.join(args.out, "significance.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    for c in summary["comparisons"]:
        a, b = c["baseline"], c["system"]
        logger.info(f"{b} vs {a}: BLEU {summary['systems'][b]['bleu']:.2f} vs {summary['systems'][a]['bleu']:.2f}; "
                    f"{b} better in {100 * c['win']:.1f}% of {args.samples} samples, {a} in {100 * c['loss']:.1f}%, "
                    f"tied in {100 * c['tie']:.1f}%; p = {c['p_value']:.4f}; "
                    f"{'significant: ' + c['better'] + ' is better' if c['better'] else 'not significant'} "
                    f"(threshold {args.prob_thresh})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
