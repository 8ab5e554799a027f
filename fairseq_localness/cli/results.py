"""Results over several training seeds: each system's mean and standard deviation per
column, every seed's numbers, and a paired significance test of each system against
its baseline on the same test set. The demo (``scripts/demo.sh``) writes its table
with it (``--layout demo``), and so do the reproduce drivers trained over several seeds
(``scripts/reproduce/<paper>_table<N>.sh --seeds``, ``--layout reproduce``: the
paper's numbers next to ours).

    fairseq-localness-results --runs RUNS.tsv --out DIR [--layout demo|reproduce]
        [--baseline NAME] [--ref FILE] [--samples 1000] [--alpha 0.05]
        [--bootstrap-seed 12345] [--fixed-seeds] [--title TEXT] [--note TEXT]
        [--significance]

``RUNS.tsv`` (``-``: standard input) has a header line and one line per training run:

  ``system``     the system (a row of the table); its runs are its seeds
  ``seed``       the training seed (a whole number; one line per system and seed)
  ``dir``        the run directory (relative paths: relative to RUNS.tsv's directory):
                 ``train.log`` (fairseq-train's log) and the evaluation files below;
                 a run whose score file does not exist yet is shown as not done ('-')
  ``hyp``        hypotheses, relative to ``dir`` (default ``eval/hyp.detok``)
  ``score``      the score JSON, relative to ``dir`` (default ``eval/bleu.json``:
                 sacrebleu's JSON, or ``eval/tok_bleu.json`` of ``evaluate.sh --tok-bleu``)
  ``ref``        the reference of the test (default ``--ref``); relative paths are
                 relative to ``dir`` (e.g. ``eval/ref.tok_bleu``)
  ``tokenize``   how the test's BLEU tokenizes: ``13a`` (sacrebleu's default, on
                 detokenized text: default) or ``none`` (texts tokenized already)
  ``baseline``   the system it is compared with (default ``--baseline``; empty: none)
  ``extra_score`` a second score JSON, relative to ``dir`` (optional; the reproduce
                 tables' extra column, e.g. ``eval/tok_bleu.json``), shown as it is

and any other column, a property of the system shown by the layout, which must be the
same on each of its lines: ``arch`` for the demo's table; for the reproduce tables
``pair``, ``metric`` and ``extra_metric`` (the BLEU of the main and the extra column:
``nist``, ``sacrebleu``, ``multi-bleu``, ``tok-compound``), ``paper_bleu``,
``paper_params``, ``paper_speed``, ``shares_embeddings`` (``1``: our run shares one
embedding matrix where the paper's count has separate ones), and ``config``,
``paper_metric``, ``test``, ``training`` (the notes under the table, one per
configuration), as ``scripts/reproduce/common.sh`` writes them.

From each run: BLEU (recomputed from the hypotheses as the test computes it, with full
precision, and checked against the score JSON, which sacrebleu rounds to one decimal;
the score JSON's value where there is no reference), the targeted accuracy per phenomenon
(``eval/phenomena.json`` of the embedded corpus, when present), and from
``train.log`` (read with :mod:`fairseq_localness.analysis.logs`) the parameters,
training time, updates and updates per second.

The paired test (``--samples`` resamples of the test set): paired bootstrap resampling
(Koehn, 2004, "Statistical Significance Tests for Machine Translation Evaluation") on
the seed-pooled outputs. The statistic is a system's BLEU averaged over its seeds, each
seed's translations scored as one corpus (sacreBLEU's sufficient statistics), so the
observed difference is the difference of the table's mean BLEU. Each resample draws
test sentences with replacement, the same sentences for the system and its baseline
(paired), and every seed's translations of them; unless ``--fixed-seeds``, it also
draws each system's seeds with replacement, so that the spread between seeds enters
the test: a difference that lies within the seed-to-seed spread is then not
significant, whereas resampling sentences alone treats the trained models as given.
The p-value is sacreBLEU's for ``--paired-bs`` (after Moses'
``bootstrap-hypothesis-difference-significance.pl``): the share of resamples whose
absolute difference, centred on the resamples' mean, reaches the observed one, as
``(count + 1) / (samples + 1)``; with one seed per system it is sacreBLEU's (same
resamples for the same ``--bootstrap-seed``; only two identical outputs differ: p = 1
here, 1 / (samples + 1) in sacreBLEU, which counts strictly larger values). A system is
marked ``better`` or ``worse`` only where p < ``--alpha``. The same test runs per seed
(the system's run against the baseline's run with the same seed), and the table counts
the seeds whose own test is significant in either direction.

Outputs in ``--out``: ``results.md`` (the table; below it, with several seeds, every
seed's numbers), ``results.json`` (everything: per-seed numbers, mean, standard
deviation, min, max and count per column, the tests) and ``results.tsv`` (one line
per run). The table is printed on standard output. Without ``--out`` it is only
printed (the reproduce drivers' ``--dry-run``).

The code: :mod:`~fairseq_localness.cli.results_runs` (RUNS.tsv and each run's files),
:mod:`~fairseq_localness.cli.results_stats` (summaries, the paired test, the
aggregation per system), :mod:`~fairseq_localness.cli.results_tables` (the tables and
notes); this module is the command line.
"""
import argparse
import json
import logging
import os
import sys
from typing import Dict

from fairseq_localness.atomic import write_text
from fairseq_localness.cli.results_runs import NAME_RE, ResultsError, read_manifest, read_run
from fairseq_localness.cli.results_stats import aggregate
from fairseq_localness.cli.results_tables import per_seed_tsv, render

logger = logging.getLogger("fairseq_localness.results")

PROG = "fairseq-localness-results"


def _write(path: str, text: str):
    write_text(path, text)


# --------------------------------------------------------------------------- command line
def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="RUNS.tsv and the test: see the module's documentation "
                                "(python -m pydoc fairseq_localness.cli.results)")
    p.add_argument("--runs", required=True, metavar="RUNS.tsv", help="the runs (tab-separated, header line; - for stdin)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write results.md, results.json, results.tsv here (default: only print the table)")
    p.add_argument("--layout", choices=["demo", "reproduce"], default="demo")
    p.add_argument("--baseline", default=None, help="every system's baseline (default: the 'baseline' column)")
    p.add_argument("--ref", default=None, help="reference of the test set (default: the 'ref' column)")
    p.add_argument("--samples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--bootstrap-seed", type=int, default=12345,
                   help="seed of the resampling (default 12345, sacreBLEU's)")
    p.add_argument("--fixed-seeds", action="store_true",
                   help="resample test sentences only, not each system's seeds")
    p.add_argument("--significance", action="store_true",
                   help="reproduce layout: show the test columns (the paper reports significance)")
    p.add_argument("--title", default="", help="the table's title (first line of the notes)")
    p.add_argument("--note", action="append", help="a line for the notes below the table (repeatable)")
    return p


def run(args) -> Dict:
    if args.samples < 1:
        raise ResultsError(f"--samples: expected a whole number >= 1, got {args.samples}")
    if not 0 < args.alpha < 1:
        raise ResultsError(f"--alpha: expected a number between 0 and 1, got {args.alpha}")
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ResultsError(f"--out: {args.out!r} exists and is not a directory")
    if args.runs == "-":
        text, source, root = sys.stdin.read(), "(stdin)", "."
    else:
        if not os.path.isfile(args.runs):
            raise ResultsError(f"--runs: {args.runs!r} does not exist")
        with open(args.runs, encoding="utf-8") as f:
            text, source = f.read(), args.runs
        root = os.path.dirname(os.path.abspath(args.runs))
    if args.baseline is not None and not NAME_RE.match(args.baseline):
        raise ResultsError(f"--baseline: {args.baseline!r}: expected a system name")
    runs = read_manifest(text, source, args.ref, args.baseline, root)
    for r in runs:
        read_run(r)
    result = aggregate(runs, args)
    result["title"] = args.title
    result["layout"] = args.layout
    result["test"] = {
        "method": "paired bootstrap resampling of the test sentences on seed-pooled outputs (Koehn 2004); "
                  "p as sacreBLEU's --paired-bs",
        "samples": args.samples, "bootstrap_seed": args.bootstrap_seed, "alpha": args.alpha,
        "resample_seeds": not args.fixed_seeds,
    }
    text = render(result, args)
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        _write(os.path.join(args.out, "results.json"), json.dumps(result, indent=1) + "\n")
        _write(os.path.join(args.out, "results.tsv"), per_seed_tsv(result))
        _write(os.path.join(args.out, "results.md"), text)
    sys.stdout.write(text)
    sys.stdout.flush()
    return result


def cli_main(argv=None):
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stderr, force=True)
    args = get_parser().parse_args(argv)
    try:
        run(args)
    except ResultsError as e:
        logger.error("%s: error: %s", PROG, e)  # the scripts' "name: error: message"
        sys.exit(2)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
