#!/usr/bin/env python3
"""Tokenized BLEU (the number multi-bleu.perl prints), with optional En-De compound splitting.

    tok_bleu.py --ref REF --hyp HYP --lang LANG [--compound-split] [--tokenized-dir DIR] --output FILE.json

Both the (raw) reference and the (detokenized) hypothesis are tokenized with the
Moses tokenizer (sacremoses, language LANG, no XML escaping: escaping maps one token
to one token and does not change the score). With --compound-split, hyphenated
compounds are split as in the usual WMT En-De evaluation (tensor2tensor's
get_ende_bleu.sh, fairseq's compound_split_bleu.sh):

    perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'

Then sacrebleu scores the token sequences as they are (tokenize=none, case-sensitive,
sacrebleu's default exponential smoothing, which differs from multi-bleu.perl only
when some n-gram order has no match at all in the whole corpus).

The output JSON has the fields of `sacrebleu -m bleu` output (name, score, signature,
verbose_score, ...) plus how the text was tokenized. With --tokenized-dir, the
tokenized texts are also written there (ref.tok_bleu, hyp.tok_bleu).

Used by evaluate.sh; imports sacrebleu and sacremoses only (not fairseq), so it starts fast.
"""
import argparse
import json
import os
import re
import sys
import tempfile
from typing import Dict, List, Sequence

COMPOUND_RE = re.compile(r"(\S)-(\S)")


def compound_split(line: str) -> str:
    """``s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g``: Perl's and Python's global substitution
    both take leftmost, non-overlapping matches, so ``a-b-c`` becomes
    ``a ##AT##-##AT## b-c`` in both."""
    return COMPOUND_RE.sub(r"\1 ##AT##-##AT## \2", line)


def tokenize(lines: Sequence[str], lang: str, split_compounds: bool = False) -> List[str]:
    """Moses-tokenize ``lines`` (no XML escaping), then optionally split compounds."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    out = []
    for line in lines:
        t = tok.tokenize(line.strip(), escape=False, return_str=True)
        out.append(compound_split(t) if split_compounds else t)
    return out


def bleu_on_tokens(hyps: Sequence[str], refs: Sequence[str]) -> Dict:
    """sacrebleu BLEU of already tokenized text, with the fields of ``sacrebleu -m bleu``
    JSON output (``score`` unrounded; the command line rounds it to one decimal)."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(tokenize="none", force=True)
    score = bleu.corpus_score(list(hyps), [list(refs)])
    result = json.loads(score.format(signature=str(bleu.get_signature()), is_json=True))
    result["score"] = score.score
    return result


def tokenized_bleu(hyps: Sequence[str], refs: Sequence[str], lang: str, split_compounds: bool = False) -> Dict:
    hyp_tok = tokenize(hyps, lang, split_compounds)
    ref_tok = tokenize(refs, lang, split_compounds)
    result = bleu_on_tokens(hyp_tok, ref_tok)
    result.update({"tokenizer": f"moses -l {lang} (sacremoses, no escaping)", "compound_split": split_compounds})
    return result, hyp_tok, ref_tok


def _write_atomic(path: str, text: str):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _read(path: str, what: str) -> List[str]:
    if not os.path.isfile(path):
        sys.exit(f"tok_bleu.py: error: {what}: expected a file at '{path}', which does not exist")
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ref", required=True, help="raw reference, one sentence per line")
    p.add_argument("--hyp", required=True, help="detokenized hypotheses, one per line")
    p.add_argument("--lang", required=True, help="target language for the Moses tokenizer (e.g. de)")
    p.add_argument("--compound-split", action="store_true", help="split hyphenated compounds (En-De)")
    p.add_argument("--tokenized-dir", default=None, help="also write ref.tok_bleu and hyp.tok_bleu here")
    p.add_argument("--output", required=True, help="JSON file to write")
    args = p.parse_args(argv)
    refs = _read(args.ref, "--ref")
    hyps = _read(args.hyp, "--hyp")
    if len(refs) != len(hyps):
        print(f"tok_bleu.py: error: --hyp has {len(hyps)} lines, --ref {len(refs)}", file=sys.stderr)
        return 2
    result, hyp_tok, ref_tok = tokenized_bleu(hyps, refs, args.lang, args.compound_split)
    if args.tokenized_dir:
        _write_atomic(os.path.join(args.tokenized_dir, "ref.tok_bleu"), "".join(x + "\n" for x in ref_tok))
        _write_atomic(os.path.join(args.tokenized_dir, "hyp.tok_bleu"), "".join(x + "\n" for x in hyp_tok))
    _write_atomic(args.output, json.dumps(result, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps(result, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
