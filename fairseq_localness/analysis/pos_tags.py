"""Universal POS tags for the embedded corpus (a helper for the per-POS gate plot,
Xu et al. 2019 Fig. 4, on ``make demo``'s data).

The corpus is generated from a small grammar (:mod:`fairseq_localness.corpus`), so
every word's part of speech follows from the lexicon: determiners ``DET``,
adjectives ``ADJ``, nouns (singular and plural) ``NOUN``, names ``PROPN``, verbs
``VERB``, prepositions ``ADP``, the relative marker (``ke`` / ``ko``) ``PRON`` (UD
tags relativizers such as English "which" as pronouns), the full stop ``PUNCT``.
A word outside the lexicon is tagged ``X``.

Writes the tags (one line per sentence, one tag per word) and, with
``--words-output``, the tokenized sentences the tags belong to (for ``gates
--pos-words``)::

    python -m fairseq_localness.analysis.pos_tags --input runs/demo/data/raw/valid.src \\
        --output valid.pos --words-output valid.words

For real data, tag the tokenized source with any Universal-POS tagger (e.g. spaCy
or Stanza) and write the same two files.
"""
import argparse
from typing import Dict, List

from fairseq_localness.analysis.cli_args import logger, require_file, run_cli
from fairseq_localness.analysis.outputs import read_lines


def lexicon(side: str = "src") -> Dict[str, str]:
    """Word -> Universal POS tag for one side of the embedded corpus."""
    from fairseq_localness import corpus as K

    s = 0 if side == "src" else 1
    tags: Dict[str, str] = {}
    for noun in K.NOUNS:
        tags[noun[s]] = "NOUN"
        tags[noun[s] + (K.SRC_PLURAL if side == "src" else K.TGT_PLURAL)] = "NOUN"
    for name in K.NAMES:
        tags[name] = "PROPN"
    for adj in K.ADJECTIVES:
        tags[adj[s]] = "ADJ"
    if side == "src":
        for verb in K.VERBS:
            tags[verb[0]] = "VERB"
        for verb in K.POLYSEMOUS_VERBS:
            tags[verb[0]] = "VERB"
        for det in K.SRC_DET.values():
            tags[det] = "DET"
        tags[K.SRC_REL] = "PRON"
    else:
        stems = [v[1] for v in K.VERBS] + [t for v in K.POLYSEMOUS_VERBS for t in v[1:]]
        for stem in stems:
            tags[stem] = tags[stem + K.TGT_VERB_PLURAL] = "VERB"
        for det in K.TGT_DET.values():
            tags[det] = "DET"
        tags[K.TGT_REL] = "PRON"
    for prep in K.PREPOSITIONS:
        tags[prep[s]] = "ADP"
    tags[K.FULL_STOP] = "PUNCT"
    return tags


def tag_sentence(words: List[str], table: Dict[str, str]) -> List[str]:
    return [table.get(w, "X") for w in words]


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis pos_tags", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="raw text of the embedded corpus (e.g. DIR/valid.src)")
    p.add_argument("--side", choices=["src", "tgt"], default="src", help="which language the file is (default: src)")
    p.add_argument("--output", required=True, help="tag file to write")
    p.add_argument("--words-output", default=None, help="also write the tokenized sentences")
    return p


def cli_main(argv=None):
    return run_cli("pos_tags", main, argv, get_parser())


def main(args):
    from fairseq_localness.corpus import tokenize

    require_file(args.input, "--input")
    table = lexicon(args.side)
    sentences = [tokenize(line) for line in read_lines(args.input)]
    tagged = [tag_sentence(words, table) for words in sentences]
    unknown = sum(t == "X" for tags in tagged for t in tags)
    with open(args.output, "w", encoding="utf-8") as f:
        f.writelines(" ".join(tags) + "\n" for tags in tagged)
    if args.words_output:
        with open(args.words_output, "w", encoding="utf-8") as f:
            f.writelines(" ".join(words) + "\n" for words in sentences)
    logger.info("tagged %d sentences (%d words outside the lexicon) -> %s", len(tagged), unknown, args.output)
    return tagged


if __name__ == "__main__":
    cli_main()
