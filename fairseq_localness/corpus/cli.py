"""``fairseq-localness-corpus``: write the corpus, print its statistics
(``--stats``) or score translations of it (``--score HYP``)."""
import argparse
import json
import os
import sys

from fairseq_localness.corpus.config import CorpusConfig
from fairseq_localness.corpus.files import read_corpus, write_corpus
from fairseq_localness.corpus.lexicon import DEFAULT_SHARES, PHENOMENA, detokenize
from fairseq_localness.corpus.stats import format_stats, phenomenon_stats, score_checks

DEFAULT_OUT = os.path.join("data", "corpus")


def get_parser() -> argparse.ArgumentParser:
    d = CorpusConfig()
    p = argparse.ArgumentParser(
        prog="fairseq-localness-corpus",
        description="Write the synthetic parallel corpus of fairseq_localness (see the "
        "README, 'The embedded corpus'), or print statistics of one.",
    )
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"output directory (default {DEFAULT_OUT}: the repository's data/ folder, git-ignored, "
                   "when run from its top)")
    p.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default {d.seed})")
    p.add_argument("--train-size", type=int, default=d.train_size, help=f"default {d.train_size}")
    p.add_argument("--valid-size", type=int, default=d.valid_size, help=f"default {d.valid_size}")
    p.add_argument("--test-size", type=int, default=d.test_size, help=f"default {d.test_size}")
    p.add_argument("--src", default=d.src_lang, help=f"source language code (default {d.src_lang})")
    p.add_argument("--tgt", default=d.tgt_lang, help=f"target language code (default {d.tgt_lang})")
    for name in PHENOMENA:
        p.add_argument(f"--share-{name.replace('_', '-')}", type=float, default=DEFAULT_SHARES[name],
                       metavar="P", help=f"share of sentences with {name} (default {DEFAULT_SHARES[name]})")
    p.add_argument("--stats", action="store_true",
                   help="only print the statistics of the corpus already in --out")
    p.add_argument("--score", metavar="HYP",
                   help="print the targeted accuracy per phenomenon (JSON) of the detokenized "
                   "translations in HYP, one per line, of the --split set of the corpus in --out")
    p.add_argument("--split", default="test", help="with --score: the split HYP translates (default test)")
    return p


def cli_main(argv=None):
    args = get_parser().parse_args(argv)
    try:
        if args.score:
            splits = read_corpus(args.out, args.src, args.tgt)
            if args.split not in splits:
                raise ValueError(f"--split: expected train, valid or test, got {args.split!r}")
            with open(args.score, encoding="utf-8") as f:
                hyps = f.read().splitlines()
            recs = splits[args.split]
            scores = score_checks(hyps, [detokenize(r["tgt"]) for r in recs], recs)
            print(json.dumps(scores, indent=1, sort_keys=True))
            return 0
        if args.stats:
            stats = phenomenon_stats(read_corpus(args.out, args.src, args.tgt))
        else:
            cfg = CorpusConfig(
                seed=args.seed, train_size=args.train_size, valid_size=args.valid_size,
                test_size=args.test_size, src_lang=args.src, tgt_lang=args.tgt,
                shares={p: getattr(args, "share_" + p) for p in PHENOMENA},
            )
            stats = write_corpus(args.out, cfg, progress=True)
            print(f"wrote {args.out}/{{train,valid,test}}.{{{cfg.src_lang},{cfg.tgt_lang},phenomena.jsonl}}")
    except (ValueError, FileNotFoundError) as e:
        print(f"fairseq-localness-corpus: error: {e}", file=sys.stderr)
        return 2
    print(format_stats(stats))
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
