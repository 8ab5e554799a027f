#!/usr/bin/env python3
"""Paired bootstrap resampling (Koehn 2004) of BLEU with full-size resamples, by
sacrebleu's ``--paired-bs``, and a JSON summary for the reproduce tables.

    paired_bs.py --ref REF --baseline NAME=FILE --system NAME=FILE --out DIR
                 [--samples 1000] [--seed 12345] [--tokenize 13a|none]

Koehn (2004) draws, N times, a test set of the same size as the real one (sentences
with replacement), scores both systems on it and takes the share of samples on which
the system does not beat the baseline as the p-value. sacrebleu implements this test
(each resample has as many sentences as the test set; p = (c + 1) / (N + 1), c the
number of resamples where the difference is at least as large in the other
direction; see sacrebleu/significance.py). compare-mt's test, which significance.sh
runs, differs: its resamples hold half the sentences, and its p is 1 - the winner's
win rate. --tokenize 13a (sacreBLEU's default, the NIST mteval-v13a tokenization)
scores detokenized texts; none scores texts that are tokenized already (evaluate.sh's
hyp.tok_bleu and ref.tok_bleu for tokenized BLEU). The seed is sacrebleu's
(``SACREBLEU_SEED``, default 12345), so reruns give the same numbers.

DIR/paired_bs.json::

  {"test": "paired bootstrap resampling (Koehn 2004), full-size resamples (sacrebleu --paired-bs)",
   "samples": N, "seed": S, "tokenize": "13a", "command": "...",
   "baseline": {"name": ..., "file": ..., "bleu": 27.3, "mean": ..., "ci": ...},
   "system": {"name": ..., "file": ..., "bleu": 27.9, "mean": ..., "ci": ...},
   "p_value": 0.012}

Imports nothing from fairseq; runs sacrebleu's command line in a subprocess.
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile


def named(option, spec):
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        sys.exit(f"paired_bs.py: error: {option}: expected NAME=FILE, got '{spec}'")
    if not os.path.isfile(path):
        sys.exit(f"paired_bs.py: error: {option}: no file '{path}'")
    return name, path


def lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", required=True)
    p.add_argument("--baseline", required=True, metavar="NAME=FILE")
    p.add_argument("--system", required=True, metavar="NAME=FILE")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--samples", type=int, default=1000)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--tokenize", choices=["13a", "none"], default="13a")
    args = p.parse_args(argv)
    base, system = named("--baseline", args.baseline), named("--system", args.system)
    if not os.path.isfile(args.ref):
        sys.exit(f"paired_bs.py: error: --ref: no file '{args.ref}'")
    n = lines(args.ref)
    for option, (_, path) in (("--baseline", base), ("--system", system)):
        if lines(path) != n:
            sys.exit(f"paired_bs.py: error: {option}: '{path}' has {lines(path)} lines, --ref has {n}; "
                     "expected one line per reference line")
    if args.samples < 1:
        sys.exit(f"paired_bs.py: error: --samples: expected a whole number >= 1, got {args.samples}")
    with tempfile.TemporaryDirectory() as tmp:
        system_file = system[1]
        if os.path.realpath(system_file) == os.path.realpath(base[1]):
            # sacrebleu drops a system given as the baseline too: test a copy of it
            system_file = os.path.join(tmp, os.path.basename(system_file) + ".system")
            shutil.copyfile(system[1], system_file)
        cmd = [sys.executable, "-m", "sacrebleu", args.ref, "-i", base[1], system_file, "-m", "bleu",
               "--paired-bs", "--paired-bs-n", str(args.samples), "--tokenize", args.tokenize, "-f", "json"]
        env = dict(os.environ, SACREBLEU_SEED=str(args.seed))
        print("+ SACREBLEU_SEED=%d %s" % (args.seed, shlex.join(cmd)), file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(f"paired_bs.py: error: sacrebleu failed (exit status {proc.returncode})")
    results = json.loads(proc.stdout)

    def summary(entry, name, path):
        bleu = entry["BLEU"]
        return {"name": name, "file": path, "bleu": bleu["score"], "mean": bleu.get("mean"), "ci": bleu.get("ci")}

    out = {
        "test": "paired bootstrap resampling (Koehn 2004), full-size resamples (sacrebleu --paired-bs)",
        "samples": args.samples, "seed": args.seed, "tokenize": args.tokenize,
        "command": "SACREBLEU_SEED=%d %s" % (args.seed, shlex.join(cmd)),
        "baseline": summary(results[0], *base), "system": summary(results[1], *system),
        "p_value": results[1]["BLEU"]["p_value"],
    }
    os.makedirs(args.out, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=args.out, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(args.out, "paired_bs.json"))
    print("%s vs %s: BLEU %.2f vs %.2f, p = %.4f (%d full-size resamples)"
          % (system[0], base[0], out["system"]["bleu"], out["baseline"]["bleu"], out["p_value"], args.samples))


if __name__ == "__main__":
    main()
