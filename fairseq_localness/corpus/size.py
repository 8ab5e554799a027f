"""Size arithmetic: how many distinct source sentences the grammar makes with each
set of phenomena, how many draws a corpus of unique sentences takes, and the
refusal of a corpus too large for the grammar (:func:`check_size`), before anything
is generated (see "Size" in :mod:`fairseq_localness.corpus`)."""
import functools
import itertools
import math
from collections import Counter
from typing import Dict, Optional, Tuple

from fairseq_localness.corpus.config import CorpusConfig
from fairseq_localness.corpus.lexicon import (
    ADJECTIVES, NAMES, NOUNS, P_ADJECTIVE, P_DEFINITE, P_NAME_OTHER, P_NAME_SUBJECT, P_PLURAL, P_POLYSEMOUS, P_PP,
    P_PP_IN_REL, PHENOMENA, POLYSEMOUS_VERBS, PREPOSITIONS, VERBS,
)

MAX_DRAWS_PER_SENTENCE = 10
"""A corpus whose unique sentences would take more draws than this per sentence on
average (the rest being repeats of sentences already drawn) is refused."""

_REORDER, _GENDER, _POLYSEMOUS = 1, 2, 4
Histogram = Dict[int, Counter]  # phenomenon bits -> {probability of one sentence: number of sentences}


def _part(bits: int, items: Dict[float, int]) -> Histogram:
    return {bits: Counter(items)}


def _then(a: Histogram, b: Histogram) -> Histogram:
    """Two parts of a sentence one after the other."""
    out: Histogram = {}
    for (ba, ha), (bb, hb) in itertools.product(a.items(), b.items()):
        h = out.setdefault(ba | bb, Counter())
        for (pa, na), (pb, nb) in itertools.product(ha.items(), hb.items()):
            h[pa * pb] += na * nb
    return out


def _either(*parts: Histogram) -> Histogram:
    out: Histogram = {}
    for part in parts:
        for bits, h in part.items():
            out.setdefault(bits, Counter()).update(h)
    return out


def _np_histogram(p_name: float) -> Histogram:
    parts = [_part(0, {p_name / len(NAMES): len(NAMES)})]
    for plural, adj in itertools.product((True, False), (True, False)):
        w = ((1 - p_name) * (P_PLURAL if plural else 1 - P_PLURAL) * (P_ADJECTIVE if adj else 1 - P_ADJECTIVE)
             / len(NOUNS) / (len(ADJECTIVES) if adj else 1))
        n = len(NOUNS) * (len(ADJECTIVES) if adj else 1)
        bits = (_REORDER if adj else 0) | (0 if plural else _GENDER)
        parts.append(_part(bits, {w * P_DEFINITE: n, w * (1 - P_DEFINITE): n}))
    return _either(*parts)


def _clause_histogram(p_pp: float) -> Histogram:
    verb = _either(_part(_POLYSEMOUS, {P_POLYSEMOUS / len(POLYSEMOUS_VERBS): len(POLYSEMOUS_VERBS)}),
                   _part(0, {(1 - P_POLYSEMOUS) / len(VERBS): len(VERBS)}))
    other = _np_histogram(P_NAME_OTHER)
    pp = _either(_part(0, {1 - p_pp: 1}), _then(_part(0, {p_pp / len(PREPOSITIONS): len(PREPOSITIONS)}), other))
    return _then(_then(verb, other), pp)


@functools.lru_cache(maxsize=None)
def _sentence_histograms() -> Dict[Tuple[bool, ...], Dict[float, int]]:
    """For each set of phenomena (reorder, gender, polysemy, long_agreement): how many
    distinct source sentences the grammar makes with exactly that set, grouped by the
    probability :func:`generate_example` draws each with (the base grammar's
    probability, conditioned on the set). The source side determines a sentence's
    derivation (determiners, prepositions, verbs, adjectives, nouns and names are
    distinct words), so counting derivations counts sentences."""
    subject = _np_histogram(P_NAME_SUBJECT)
    sides = {False: _then(subject, _clause_histogram(P_PP)),
             True: _then(_then(subject, _clause_histogram(P_PP_IN_REL)), _clause_histogram(P_PP))}
    out = {}
    for relative, hist in sides.items():
        for bits, h in hist.items():
            total = sum(p * n for p, n in h.items())
            key = (bool(bits & _REORDER), bool(bits & _GENDER), bool(bits & _POLYSEMOUS), relative)
            out[key] = {p / total: n for p, n in h.items()}
    return out


def distinct_sentences(reorder: bool, gender: bool, polysemy: bool, long_agreement: bool) -> int:
    """How many distinct source sentences the grammar makes with exactly this set of
    phenomena (fewest: 2,010,000, with polysemy alone)."""
    return sum(_sentence_histograms()[(reorder, gender, polysemy, long_agreement)].values())


def _draws(hist: Dict[float, int], unique: float) -> float:
    """Expected number of draws from ``hist`` until ``unique`` distinct sentences have
    come up: solves sum_i n_i (1 - (1 - q_i)^D) = unique for D (inf if impossible)."""
    if unique <= 0:
        return 0.0
    if unique >= sum(hist.values()):
        return math.inf
    logs = [(math.log1p(-q), n) for q, n in hist.items()]

    def distinct_after(draws: float) -> float:
        return sum(-n * math.expm1(draws * lq) for lq, n in logs)

    lo, hi = unique, 2.0 * unique
    while distinct_after(hi) < unique:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-3 * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if distinct_after(mid) < unique else (lo, mid)
    return hi


def _combination_shares(shares: Dict[str, float]):
    for combo, hist in _sentence_histograms().items():
        p = 1.0
        for name, present in zip(PHENOMENA, combo):
            p *= shares[name] if present else 1.0 - shares[name]
        if p > 0:
            yield combo, p, hist


def draws_per_sentence(shares: Dict[str, float], total: int) -> Tuple[float, Optional[Tuple[bool, ...]]]:
    """Expected draws per sentence for a corpus of ``total`` unique sentences at
    ``shares`` (1.0: no repeats), and the first set of phenomena that has fewer
    distinct sentences than the corpus needs (None if every set has enough)."""
    draws = 0.0
    for combo, p, hist in _combination_shares(shares):
        d = _draws(hist, p * total)
        if math.isinf(d):
            return math.inf, combo
        draws += d
    return draws / total, None


def max_corpus_size(shares: Dict[str, float]) -> int:
    """The largest corpus (train + valid + test, to 2 significant digits) these
    shares allow: at most :data:`MAX_DRAWS_PER_SENTENCE` draws per sentence."""
    lo, hi = 1, min(int(sum(hist.values()) / p) for _, p, hist in _combination_shares(shares))
    while hi - lo > max(1, lo // 200):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if draws_per_sentence(shares, mid)[0] <= MAX_DRAWS_PER_SENTENCE else (lo, mid)
    digits = max(0, len(str(lo)) - 2)
    return lo // 10 ** digits * 10 ** digits


def check_size(cfg: CorpusConfig) -> None:
    """Raise ValueError, before anything is generated, for a corpus the grammar
    cannot make unique sentences for at ``cfg.shares`` (see :data:`MAX_DRAWS_PER_SENTENCE`)."""
    total = cfg.train_size + cfg.valid_size + cfg.test_size
    ratio, short = draws_per_sentence(cfg.shares, total)
    if ratio <= MAX_DRAWS_PER_SENTENCE:
        return
    if short is not None:
        present = [p for p, on in zip(PHENOMENA, short) if on]
        absent = [p for p, on in zip(PHENOMENA, short) if not on]
        what = " and ".join(filter(None, [f"with {', '.join(present)}" if present else "",
                                          f"without {', '.join(absent)}" if absent else ""]))
        reason = (f"the grammar has {distinct_sentences(*short):,} distinct sentences {what}, fewer than the "
                  f"shares ask for")
    else:
        reason = (f"drawing them would take about {ratio:.0f} draws per sentence (repeats are drawn again), "
                  f"more than {MAX_DRAWS_PER_SENTENCE}")
    raise ValueError(
        f"--train-size {cfg.train_size}: the grammar cannot make {total:,} unique sentences at these shares "
        f"({reason}); expected train + valid + test <= {max_corpus_size(cfg.shares):,}"
    )
