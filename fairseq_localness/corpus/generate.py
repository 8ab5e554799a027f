"""The corpus as drawn: the three splits of unique sentences, test first, in an
order fixed by the seed (:func:`iter_corpus`, :func:`generate_corpus`)."""
import random
import sys
from typing import Dict, Iterator, List, Optional, Tuple

from fairseq_localness.corpus.config import CorpusConfig
from fairseq_localness.corpus.grammar import Example, generate_example
from fairseq_localness.corpus.lexicon import PHENOMENA
from fairseq_localness.corpus.size import check_size

GENERATOR_VERSION = 2
"""Recorded in ``corpus.json`` (:func:`~fairseq_localness.corpus.files.write_corpus`)."""

PROGRESS_FROM = 100_000
"""Corpora of this many sentences or more show a progress bar (``progress=True``)."""


def iter_corpus(cfg: CorpusConfig, progress: bool = False) -> Iterator[Tuple[str, Example]]:
    """``(split, example)`` in the order they are drawn (test, valid, train):
    deterministic in ``cfg``. Checks the size against :func:`max_corpus_size` first.
    ``progress``: a progress bar on stderr for corpora of 100,000 sentences or more."""
    cfg.validate()
    check_size(cfg)
    rng = random.Random(cfg.seed)
    seen = set()
    total = cfg.test_size + cfg.valid_size + cfg.train_size
    bar = None
    if progress and total >= PROGRESS_FROM:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="sent", desc="generating", file=sys.stderr, mininterval=2.0)
    try:
        for split, size in (("test", cfg.test_size), ("valid", cfg.valid_size), ("train", cfg.train_size)):
            drawn = 0
            misses = 0
            while drawn < size:
                wanted = {p: rng.random() < cfg.shares[p] for p in PHENOMENA}
                ex = generate_example(rng, wanted)
                key = " ".join(ex.src)
                if key in seen:
                    misses += 1
                    if misses > 100 * (size + 100):
                        raise RuntimeError(f"cannot draw {size} unique {split} sentences")
                    continue
                seen.add(key)
                drawn += 1
                if bar is not None:
                    bar.update(1)
                yield split, ex
    finally:
        if bar is not None:
            bar.close()


def generate_corpus(cfg: Optional[CorpusConfig] = None) -> Dict[str, List[Example]]:
    """All three splits, deterministic in ``cfg`` (test first, then valid, then train)."""
    cfg = cfg or CorpusConfig()
    splits = {"test": [], "valid": [], "train": []}
    for split, ex in iter_corpus(cfg):
        splits[split].append(ex)
    return {s: splits[s] for s in ("train", "valid", "test")}
