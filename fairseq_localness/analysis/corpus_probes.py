"""Probing tasks in SentEval's format built from the embedded corpus (a helper for
the ``probing`` tool on ``make demo``'s data, which has no English sentences for the
real SentEval files).

Six of SentEval's ten tasks have a direct analogue in the corpus's grammar
(:mod:`fairseq_localness.corpus`); each file gets the SentEval file name of the task
it imitates, so ``probing --senteval-dir`` groups them as the papers do. The other
four (TreeDepth, TopConst, Tense, CoordInv) have no counterpart in the grammar and are
not written.

================  ===========================  =========================================
task              file                         label
================  ===========================  =========================================
SentLen           sentence_length.txt          length in words (with the full stop):
                                               4-5, 6, 7-8, 9-10, 11-12, 13+
WC                word_content.txt             the adjective of sentences that have
                                               exactly one
BShift            bigram_shift.txt             ``I`` if two adjacent words (full stop
                                               excluded) were swapped, else ``O``
SubjNum           subj_number.txt              ``NN`` / ``NNS``: number of the subject
ObjNum            obj_number.txt               ``NN`` / ``NNS``: number of the main
                                               verb's object
SOMO              odd_man_out.txt              ``C`` if a noun was replaced by another
                                               noun of the same number, or a verb by
                                               another verb, else ``O``
================  ===========================  =========================================

``tr`` examples come from the corpus's train split, ``va`` from valid, ``te`` from
test (so the test sentences are unseen by the NMT model too). BShift and SOMO modify
a random half of the sentences (seeded). These are analogues on an artificial
language, not the SentEval tasks themselves: they show the tool at work offline.

Example::

    python -m fairseq_localness.analysis.corpus_probes --corpus-dir runs/demo/data/raw \\
        --output-dir runs/demo/probing
"""
import argparse
import os
import random
from typing import Dict, List, Optional, Tuple

from fairseq_localness.analysis.cli_args import AnalysisError, logger, run_cli
from fairseq_localness.analysis.outputs import ensure_dir

LENGTH_BINS = (("4-5", 4, 5), ("6", 6, 6), ("7-8", 7, 8), ("9-10", 9, 10), ("11-12", 11, 12), ("13+", 13, None))


def _length_label(n: int) -> str:
    for label, lo, hi in LENGTH_BINS:
        if lo <= n and (hi is None or n <= hi):
            return label
    return "other"


def _number(word: str, tag: str) -> Optional[str]:
    from fairseq_localness.corpus import SRC_PLURAL

    if tag == "PROPN":
        return "NN"
    if tag == "NOUN":
        return "NNS" if word.endswith(SRC_PLURAL) else "NN"
    return None


def main_object_number(words: List[str], tags: List[str]) -> Optional[str]:
    """Number of the object of the main verb: the first noun or name after the last
    verb (the grammar puts the main clause last: ``S -> NP [REL] V NP [PP] .``)."""
    verbs = [i for i, t in enumerate(tags) if t == "VERB"]
    if not verbs:
        return None
    for w, t in zip(words[verbs[-1] + 1:], tags[verbs[-1] + 1:]):
        n = _number(w, t)
        if n is not None:
            return n
    return None


def _somo(words: List[str], tags: List[str], rng: random.Random, nouns: List[str], verbs: List[str]):
    from fairseq_localness.corpus import SRC_PLURAL

    slots = [i for i, t in enumerate(tags) if t in ("NOUN", "VERB")]
    i = rng.choice(slots)
    w = words[i]
    if tags[i] == "VERB":
        choices = [v for v in verbs if v != w]
        new = rng.choice(choices)
    else:
        plural = w.endswith(SRC_PLURAL)
        stem = w[: -len(SRC_PLURAL)] if plural else w
        new = rng.choice([n for n in nouns if n != stem]) + (SRC_PLURAL if plural else "")
    out = list(words)
    out[i] = new
    return out


def build(corpus_dir: str, src: str = "src", tgt: str = "tgt", seed: int = 1) -> Dict[str, List[Tuple[str, str, str]]]:
    """``{file name: [(split, label, sentence), ...]}``."""
    from fairseq_localness import corpus as K
    from fairseq_localness.analysis.pos_tags import lexicon, tag_sentence

    try:
        data = K.read_corpus(corpus_dir, src, tgt)
    except (FileNotFoundError, ValueError) as e:
        raise AnalysisError(f"--corpus-dir: {e}") from None
    table = lexicon("src")
    nouns = [n[0] for n in K.NOUNS]
    verbs = [v[0] for v in K.VERBS] + [v[0] for v in K.POLYSEMOUS_VERBS]
    rng = random.Random(seed)
    files: Dict[str, List[Tuple[str, str, str]]] = {f: [] for f in (
        "sentence_length.txt", "word_content.txt", "bigram_shift.txt", "subj_number.txt", "obj_number.txt",
        "odd_man_out.txt")}
    for split, tag in (("train", "tr"), ("valid", "va"), ("test", "te")):
        for rec in data[split]:
            words = rec["src"]
            tags = tag_sentence(words, table)
            text = K.detokenize(words)
            files["sentence_length.txt"].append((tag, _length_label(len(words)), text))
            adjectives = [w for w, t in zip(words, tags) if t == "ADJ"]
            if len(adjectives) == 1:
                files["word_content.txt"].append((tag, adjectives[0], text))
            if rng.random() < 0.5:
                i = rng.randrange(len(words) - 2)  # never the full stop
                shifted = words[:i] + [words[i + 1], words[i]] + words[i + 2:]
                files["bigram_shift.txt"].append((tag, "I", K.detokenize(shifted)))
            else:
                files["bigram_shift.txt"].append((tag, "O", text))
            files["subj_number.txt"].append((tag, "NNS" if rec["subject_number"] == "pl" else "NN", text))
            obj = main_object_number(words, tags)
            if obj is not None:
                files["obj_number.txt"].append((tag, obj, text))
            if rng.random() < 0.5:
                files["odd_man_out.txt"].append((tag, "C", K.detokenize(_somo(words, tags, rng, nouns, verbs))))
            else:
                files["odd_man_out.txt"].append((tag, "O", text))
    return files


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis corpus_probes", description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus-dir", required=True, help="the raw embedded corpus (fairseq-localness-corpus --out)")
    p.add_argument("--src", default="src", help="source language code (default: src)")
    p.add_argument("--tgt", default="tgt", help="target language code (default: tgt)")
    p.add_argument("--seed", type=int, default=1, help="seed of BShift/SOMO's modifications (default: 1)")
    p.add_argument("--output-dir", required=True, help="directory for the SentEval-format files")
    return p


def cli_main(argv=None):
    return run_cli("corpus_probes", main, argv, get_parser())


def main(args):
    out_dir = ensure_dir(args.output_dir)
    files = build(args.corpus_dir, args.src, args.tgt, args.seed)
    for name, rows in files.items():
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
            f.writelines(f"{s}\t{label}\t{text}\n" for s, label, text in rows)
        logger.info("wrote %s (%d examples)", os.path.join(out_dir, name), len(rows))
    return files


if __name__ == "__main__":
    cli_main()
