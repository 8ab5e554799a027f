#!/usr/bin/env python3
"""Train / apply a sentencepiece model (the pip package ships no spm_* binaries).

    spm.py train --input FILE... --model-prefix PREFIX --vocab-size N [--model-type bpe]
    spm.py encode --model PREFIX.model < IN > OUT      (pieces, space-separated)

Used by prepare_bpe.sh; imports sentencepiece only (not fairseq), so it starts fast.
"""
import argparse
import sys

import sentencepiece as spm


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--input", nargs="+", required=True)
    t.add_argument("--model-prefix", required=True)
    t.add_argument("--vocab-size", type=int, required=True)
    t.add_argument("--model-type", default="bpe", choices=["bpe", "unigram"])
    t.add_argument("--character-coverage", type=float, default=1.0)
    e = sub.add_parser("encode")
    e.add_argument("--model", required=True)
    args = p.parse_args(argv)

    if args.cmd == "train":
        spm.SentencePieceTrainer.train(
            input=",".join(args.input),
            model_prefix=args.model_prefix,
            vocab_size=args.vocab_size,
            model_type=args.model_type,
            character_coverage=args.character_coverage,
            # A vocabulary larger than the data supports is capped, not an error:
            # small corpora (the embedded one) need fewer pieces than real data.
            hard_vocab_limit=False,
            # fairseq adds its own <s>, </s>, <pad>, <unk>; keep sentencepiece's ids apart.
            bos_id=-1,
            eos_id=-1,
            minloglevel=2,
        )
    else:
        sp = spm.SentencePieceProcessor(model_file=args.model)
        out = sys.stdout
        for line in sys.stdin:
            out.write(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n")


if __name__ == "__main__":
    main()
