"""The embedded default corpus: a synthetic translation task that needs local context.

``fairseq-localness-corpus --out DIR`` writes a parallel corpus ``train``/``valid``/
``test`` (``DIR/train.src``, ``DIR/train.tgt``, ...; DIR defaults to ``data/corpus``) generated from a small grammar
with a fixed seed (pure Python ``random.Random(seed)``: the same seed gives
byte-identical files on every machine). Both languages use invented words; nothing
in it comes from real text. It is the testbed on which ``make demo`` compares the
attention variants, so it mixes phenomena that reward attending to neighbours with
one that needs a long-distance dependency, each in a known share of sentences.

Grammar (source side; ``[...]`` optional, ``|`` alternatives)::

    S    -> NP_subj [REL] V NP [PP] "."
    REL  -> "ke" V NP [PP]                  (relative clause on the subject)
    PP   -> P NP
    NP   -> NAME | DET [ADJ] N | DET [ADJ] N-ek   (-ek: plural suffix)
    DET  -> "ta" (definite) | "en" (indefinite)

The target language has the same constituent order with these differences:

``reorder`` (local reordering)
    Adjectives precede the noun in the source and follow it in the target:
    ``ta somal dovan`` -> ``lo kelo ivre``.
``gender`` (local agreement)
    Target nouns have a lexical gender (masculine/feminine, not predictable from
    the word's form) and singular determiners agree with it: definite ``lo``/``la``,
    indefinite ``un``/``ume``; plural determiners (``lei``, ``dei``) do not show
    gender. The source determiner shows no gender, so the model must look at the
    noun one or two words to the right.
``polysemy`` (word choice decided by the neighbourhood)
    Four source verbs have two translations each, chosen by the class of their
    object (a person or animal vs. a thing), whose head noun is 1-3 words away:
    ``zemu ta dovan`` -> ``kaba lo kelo`` ("lead") but ``zemu ta bakor`` ->
    ``toli la pimo`` ("carry").
``long_agreement`` (long-distance dependency)
    Target verbs agree in number with their subject (plural ``-n``); source verbs
    do not inflect, so the model has to find the subject. When the subject carries
    a relative clause, 3-9 source words separate the subject noun from the main
    verb. ``attractor`` marks the subset where the noun nearest to the main verb
    has the other number (a "nearest noun" heuristic gets these wrong).

Shares. Each sentence first draws, independently, whether it contains each phenomenon
(``reorder`` 0.5, ``gender`` 0.5, ``polysemy`` 0.4, ``long_agreement`` 0.4), and the
grammar is then sampled until the sentence has exactly that set. So the phenomena are
uncorrelated, every subset of test sentences has a clean contrast group, and the
share of each is its stated probability up to sampling noise; ``attractor`` comes
out at about half of ``long_agreement``. Names are copied unchanged (a small copy
component); every other word is translated through the lexicon below, so the task
is not a copy task.

Splits. Sentences are unique across all three splits (no source sentence of the test
set occurs in train or valid). The test set is drawn first, so it does not change
when ``--train-size`` changes.

Size. The grammar makes a finite number of distinct source sentences with each set
of phenomena (:func:`distinct_sentences`), drawn with very unequal probabilities, so
repeats (drawn again) grow with the corpus. Before anything is generated,
:func:`check_size` computes the expected number of draws from the grammar's
probabilities and refuses a corpus that needs more sentences of some set than there
are, or more than :data:`MAX_DRAWS_PER_SENTENCE` draws per sentence
(:func:`max_corpus_size`: 32,000,000 sentences in all at the default shares). The
corpus is written as it is generated (only the source sentences are kept, to keep
them unique: ~150 bytes each), with a progress bar on stderr from 100,000 sentences
on.

Phenomenon tags. Every split gets ``<split>.phenomena.jsonl``: one JSON object per
line (same line order as the text files) with the phenomena the sentence contains,
its subject number, the source distance from subject noun to main verb, and the
targeted ``checks`` of the sentence (the target words each phenomenon decides, and
the wrong words a model missing it would write). :func:`score_checks` (``--score
HYP``) turns them into an accuracy per phenomenon for any system's translations;
:func:`phenomenon_stats` summarises a corpus (shares per split, lengths, vocabulary
sizes), ``--stats`` prints it.
"""
import argparse
import functools
import itertools
import json
import math
import os
import random
import re
import sys
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Dict, Iterator, List, Optional, Tuple

GENERATOR_VERSION = 2

PHENOMENA = ("reorder", "gender", "polysemy", "long_agreement")
"""The phenomena whose share is controlled (in this order in the tags)."""

DERIVED_PHENOMENA = ("attractor",)
"""Tags that are observed, not controlled: a subset of ``long_agreement``."""

DEFAULT_SHARES = {"reorder": 0.5, "gender": 0.5, "polysemy": 0.4, "long_agreement": 0.4}

# --------------------------------------------------------------------------- lexicon
# Nouns: (source, target, target gender, class). Class decides polysemous verbs.
NOUNS = [
    ("dovan", "kelo", "m", "animate"),
    ("miren", "sabu", "f", "animate"),
    ("tolki", "runa", "m", "animate"),
    ("fasin", "velo", "f", "animate"),
    ("gorim", "dazi", "f", "animate"),
    ("pelun", "mire", "m", "animate"),
    ("sarik", "tonu", "m", "animate"),
    ("wuden", "lisa", "f", "animate"),
    ("habro", "quena", "m", "animate"),
    ("nilse", "jorvo", "f", "animate"),
    ("bakor", "pimo", "f", "thing"),
    ("tesin", "kara", "m", "thing"),
    ("lumet", "soru", "f", "thing"),
    ("harun", "neve", "f", "thing"),
    ("kolip", "duro", "m", "thing"),
    ("vemas", "zina", "f", "thing"),
    ("ridol", "faru", "m", "thing"),
    ("nusek", "bela", "m", "thing"),
    ("pavot", "gumo", "f", "thing"),
    ("sileb", "tera", "m", "thing"),
    ("jomar", "hubi", "m", "thing"),
    ("ketul", "rina", "f", "thing"),
]
SRC_PLURAL = "ek"  # source noun + "ek"
TGT_PLURAL = "ri"  # target noun + "ri"

# Names: singular, animate, no determiner, copied unchanged.
NAMES = ["Kalu", "Menta", "Oriv", "Sunik", "Tabo", "Ezri"]

ADJECTIVES = [
    ("somal", "ivre"), ("kedru", "ospa"), ("lanik", "urme"), ("pirot", "eska"),
    ("vusel", "alno"), ("marek", "odri"), ("tulop", "ingo"), ("finar", "ebla"),
    ("gosti", "umpe"), ("zurin", "anve"), ("hemor", "ipsa"), ("debal", "olme"),
]

# Transitive verbs: source (invariable) -> target stem (+ "n" with a plural subject).
VERBS = [
    ("lupi", "fenda"), ("rasu", "borki"), ("mesko", "talvi"), ("vinta", "grusa"),
    ("pokel", "dremi"), ("suvar", "klema"), ("tiben", "plosa"), ("garvu", "snedi"),
    ("hovik", "trapa"), ("zelma", "bruni"),
]
# Polysemous verbs: source -> (target with an animate object, with a thing object).
POLYSEMOUS_VERBS = [
    ("zemu", "kaba", "toli"),
    ("ravo", "sipra", "delko"),
    ("nuki", "framo", "vesti"),
    ("pelsa", "gordu", "liska"),
]
TGT_VERB_PLURAL = "n"

# Determiners: source definiteness -> target form by (gender or plural).
SRC_DET = {"def": "ta", "indef": "en"}
TGT_DET = {
    ("def", "m"): "lo", ("def", "f"): "la", ("def", "pl"): "lei",
    ("indef", "m"): "un", ("indef", "f"): "ume", ("indef", "pl"): "dei",
}
PREPOSITIONS = [("nu", "sen"), ("po", "kon"), ("dar", "pur"), ("vel", "sul")]
SRC_REL, TGT_REL = "ke", "ko"
FULL_STOP = "."

# Probabilities of the base grammar (before the phenomenon constraints are applied).
P_NAME_SUBJECT = 0.25
P_NAME_OTHER = 0.15
P_PLURAL = 0.45
P_ADJECTIVE = 0.35
P_DEFINITE = 0.6
P_PP = 0.35
P_PP_IN_REL = 0.35
P_POLYSEMOUS = 0.35
MAX_TRIES = 10000

_LANG_RE = re.compile(r"^[A-Za-z0-9_]+$")


# --------------------------------------------------------------------------- config
@dataclass
class CorpusConfig:
    """What to generate. The defaults are the corpus ``make demo`` uses."""

    seed: int = 1
    train_size: int = 8000
    valid_size: int = 400
    test_size: int = 500
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    shares: Dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))

    def validate(self):
        for name in ("train_size", "valid_size", "test_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("src_lang", "tgt_lang"):
            if not _LANG_RE.match(getattr(self, name)):
                raise ValueError(
                    f"{name} must be letters, digits or '_' (it names files and the "
                    f"fairseq language pair), got {getattr(self, name)!r}"
                )
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang must differ, both are {self.src_lang!r}")
        if set(self.shares) != set(PHENOMENA):
            raise ValueError(f"shares must give exactly {list(PHENOMENA)}, got {sorted(self.shares)}")
        for name, p in self.shares.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"share of {name} must be in [0, 1], got {p}")


@dataclass
class Example:
    """One sentence pair and what it contains."""

    src: List[str]
    tgt: List[str]
    phenomena: List[str]
    subject_number: str
    agreement_distance: int  # source words from the subject's head noun to the main verb
    checks: List[dict] = field(default_factory=list)  # see score_checks

    def tags(self, index: int) -> dict:
        return {
            "id": index,
            "phenomena": self.phenomena,
            "subject_number": self.subject_number,
            "agreement_distance": self.agreement_distance,
            "checks": self.checks,
        }


# --------------------------------------------------------------------------- grammar
def _sample_np(rng: random.Random, p_name: float) -> dict:
    if rng.random() < p_name:
        return {"name": rng.choice(NAMES)}
    noun = rng.choice(NOUNS)
    return {
        "noun": noun,
        "plural": rng.random() < P_PLURAL,
        "definite": rng.random() < P_DEFINITE,
        "adj": rng.choice(ADJECTIVES) if rng.random() < P_ADJECTIVE else None,
    }


def _sample_verb(rng: random.Random):
    if rng.random() < P_POLYSEMOUS:
        return ("poly", rng.choice(POLYSEMOUS_VERBS))
    return ("plain", rng.choice(VERBS))


def _sample_clause(rng: random.Random, p_pp: float) -> dict:
    clause = {"verb": _sample_verb(rng), "obj": _sample_np(rng, P_NAME_OTHER)}
    if rng.random() < p_pp:
        clause["pp"] = (rng.choice(PREPOSITIONS), _sample_np(rng, P_NAME_OTHER))
    return clause


def _sample_sentence(rng: random.Random, relative: bool) -> dict:
    sent = {"subj": _sample_np(rng, P_NAME_SUBJECT)}
    if relative:
        sent["rel"] = _sample_clause(rng, P_PP_IN_REL)
    sent["main"] = _sample_clause(rng, P_PP)
    return sent


def _nps(sent: dict) -> List[dict]:
    out = [sent["subj"]]
    for key in ("rel", "main"):
        if key in sent:
            out.append(sent[key]["obj"])
            if "pp" in sent[key]:
                out.append(sent[key]["pp"][1])
    return out


def _is_plural(np: dict) -> bool:
    return "noun" in np and np["plural"]


def _is_animate(np: dict) -> bool:
    return "name" in np or np["noun"][3] == "animate"


def _phenomena(sent: dict) -> List[str]:
    nps = _nps(sent)
    found = set()
    if any(np.get("adj") for np in nps):
        found.add("reorder")
    if any("noun" in np and not np["plural"] for np in nps):
        found.add("gender")
    if any(sent[k]["verb"][0] == "poly" for k in ("rel", "main") if k in sent):
        found.add("polysemy")
    if "rel" in sent:
        found.add("long_agreement")
        rel = sent["rel"]
        nearest = rel["pp"][1] if "pp" in rel else rel["obj"]
        if _is_plural(nearest) != _is_plural(sent["subj"]):
            found.add("attractor")
    return [p for p in PHENOMENA + DERIVED_PHENOMENA if p in found]


def _src_np(np: dict) -> List[str]:
    if "name" in np:
        return [np["name"]]
    noun = np["noun"][0] + (SRC_PLURAL if np["plural"] else "")
    adj = [np["adj"][0]] if np["adj"] else []
    return [SRC_DET["def" if np["definite"] else "indef"]] + adj + [noun]


def _tgt_np(np: dict) -> List[str]:
    if "name" in np:
        return [np["name"]]
    _, tgt, gender, _ = np["noun"]
    det = TGT_DET[("def" if np["definite"] else "indef", "pl" if np["plural"] else gender)]
    noun = tgt + (TGT_PLURAL if np["plural"] else "")
    adj = [np["adj"][1]] if np["adj"] else []
    return [det, noun] + adj


def _src_clause(clause: dict) -> List[str]:
    kind, verb = clause["verb"]
    out = [verb[0]] + _src_np(clause["obj"])
    if "pp" in clause:
        out += [clause["pp"][0][0]] + _src_np(clause["pp"][1])
    return out


def _tgt_clause(clause: dict, subject_plural: bool) -> List[str]:
    kind, verb = clause["verb"]
    if kind == "poly":
        stem = verb[1] if _is_animate(clause["obj"]) else verb[2]
    else:
        stem = verb[1]
    out = [stem + (TGT_VERB_PLURAL if subject_plural else "")] + _tgt_np(clause["obj"])
    if "pp" in clause:
        out += [clause["pp"][0][1]] + _tgt_np(clause["pp"][1])
    return out


def _np_checks(np: dict) -> List[dict]:
    """Targeted checks of one NP: adjective order, determiner gender (see score_checks)."""
    if "name" in np:
        return []
    words = _tgt_np(np)
    det, noun = words[0], words[1]
    out = []
    if np["adj"]:
        adj = words[2]
        out.append({"phenomenon": "reorder", "correct": [f"{noun} {adj}"], "wrong": [f"{adj} {noun}"]})
    if not np["plural"]:
        definite = "def" if np["definite"] else "indef"
        other = TGT_DET[(definite, "f" if np["noun"][2] == "m" else "m")]
        # the determiner with the noun, whether or not the adjective was put in between
        gaps = [""] + ([words[2] + " "] if np["adj"] else [])
        out.append({"phenomenon": "gender",
                    "correct": [f"{det} {gap}{noun}" for gap in gaps],
                    "wrong": [f"{other} {gap}{noun}" for gap in gaps]})
    return out


def _clause_checks(clause: dict, subject_plural: bool, main_after_relative: bool) -> List[dict]:
    """Targeted checks of one clause: polysemous verb sense, long-distance agreement.

    Each is blind to the other: the sense check accepts either number, the agreement
    check either sense.
    """
    kind, verb = clause["verb"]
    stem = _tgt_clause(clause, subject_plural)[0]
    if subject_plural:
        stem = stem[: -len(TGT_VERB_PLURAL)]
    stems = [stem]
    out = []
    if kind == "poly":
        other = verb[2] if stem == verb[1] else verb[1]
        stems.append(other)
        out.append({"phenomenon": "polysemy", "correct": [stem, stem + TGT_VERB_PLURAL],
                    "wrong": [other, other + TGT_VERB_PLURAL]})
    if main_after_relative:
        right, wrong = (TGT_VERB_PLURAL, "") if subject_plural else ("", TGT_VERB_PLURAL)
        out.append({"phenomenon": "long_agreement", "correct": [s + right for s in stems],
                    "wrong": [s + wrong for s in stems]})
    out += _np_checks(clause["obj"])
    if "pp" in clause:
        out += _np_checks(clause["pp"][1])
    return out


def _realise(sent: dict) -> Example:
    subj = sent["subj"]
    plural = _is_plural(subj)
    src, tgt = _src_np(subj), _tgt_np(subj)
    distance = 1
    if "rel" in sent:
        rel_src = [SRC_REL] + _src_clause(sent["rel"])
        src += rel_src
        tgt += [TGT_REL] + _tgt_clause(sent["rel"], plural)
        distance += len(rel_src)
    src += _src_clause(sent["main"]) + [FULL_STOP]
    tgt += _tgt_clause(sent["main"], plural) + [FULL_STOP]
    checks = _np_checks(subj)
    if "rel" in sent:
        checks += _clause_checks(sent["rel"], plural, main_after_relative=False)
    checks += _clause_checks(sent["main"], plural, main_after_relative="rel" in sent)
    return Example(
        src=src,
        tgt=tgt,
        phenomena=_phenomena(sent),
        subject_number="pl" if plural else "sg",
        agreement_distance=distance,
        checks=checks,
    )


def generate_example(rng: random.Random, wanted: Dict[str, bool]) -> Example:
    """One sentence pair containing exactly the phenomena set to True in ``wanted``.

    Rejection sampling from the base grammar keeps the distribution of everything
    else (lexical choices, lengths) the grammar's own, conditioned on the set.
    """
    for _ in range(MAX_TRIES):
        sent = _sample_sentence(rng, relative=wanted["long_agreement"])
        found = set(_phenomena(sent))
        if all((p in found) == wanted[p] for p in PHENOMENA):
            return _realise(sent)
    raise RuntimeError(f"no sentence with phenomena {wanted} after {MAX_TRIES} tries")


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


# --------------------------------------------------------------------------- size
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


# --------------------------------------------------------------------------- statistics
def phenomenon_stats(splits: Dict[str, List[dict]]) -> Dict[str, dict]:
    """Per split: number of sentences, share of each phenomenon, lengths, vocabulary.

    ``splits`` maps a split name to a list of records with ``phenomena`` (a list of
    tags) and optionally ``src``/``tgt`` (token lists), as returned by
    :func:`read_corpus` (or :class:`Example` objects).
    """
    out = {}
    for split, records in splits.items():
        recs = [asdict(r) if isinstance(r, Example) else r for r in records]
        n = len(recs)
        counts = Counter(p for r in recs for p in r["phenomena"])
        stats = {
            "sentences": n,
            "shares": {p: (counts[p] / n if n else 0.0) for p in PHENOMENA + DERIVED_PHENOMENA},
        }
        if recs and "src" in recs[0]:
            stats["mean_src_len"] = sum(len(r["src"]) for r in recs) / n
            stats["mean_tgt_len"] = sum(len(r["tgt"]) for r in recs) / n
            stats["src_vocab"] = len({w for r in recs for w in r["src"]})
            stats["tgt_vocab"] = len({w for r in recs for w in r["tgt"]})
        out[split] = stats
    return out


def format_stats(stats: Dict[str, dict]) -> str:
    """A Markdown table of :func:`phenomenon_stats`."""
    cols = list(PHENOMENA + DERIVED_PHENOMENA)
    head = ["split", "sentences"] + cols + ["src len", "tgt len", "src vocab", "tgt vocab"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for split, s in stats.items():
        row = [split, str(s["sentences"])] + [f"{s['shares'][c]:.3f}" for c in cols]
        row += [
            f"{s['mean_src_len']:.1f}" if "mean_src_len" in s else "-",
            f"{s['mean_tgt_len']:.1f}" if "mean_tgt_len" in s else "-",
            str(s.get("src_vocab", "-")),
            str(s.get("tgt_vocab", "-")),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _count(tokens: List[str], ngram: List[str]) -> int:
    n = len(ngram)
    return sum(tokens[i:i + n] == ngram for i in range(len(tokens) - n + 1))


def score_checks(hypotheses: List[str], references: List[str], tags: List[dict]) -> Dict[str, dict]:
    """Targeted accuracy per phenomenon: did the translation get the words that the
    phenomenon decides?

    Each tagged sentence carries ``checks``: the ``correct`` target word sequences
    (alternatives) that a phenomenon decides and the ``wrong`` ones a model missing
    it would produce: ``kelo ivre`` vs ``ivre kelo`` (``reorder``); ``la pimo`` vs
    ``lo pimo`` (``gender``, also with an adjective in between); ``kaba``/``kaban``
    vs ``toli``/``tolin`` (``polysemy``, either number); ``borkin`` vs ``borki``
    (the main verb in ``long_agreement``, either sense). A check passes when the
    hypothesis contains the correct sequences at least as often as the reference and
    the wrong ones no more often, so it needs no alignment and one phenomenon's
    error does not count against another. ``attractor`` reports the
    ``long_agreement`` checks of sentences tagged ``attractor``.

    Returns ``{phenomenon: {"checks": n, "accuracy": a}}``, ``a`` in [0, 1] or None
    without checks.
    """
    if not len(hypotheses) == len(references) == len(tags):
        raise ValueError(f"{len(hypotheses)} hypotheses, {len(references)} references, {len(tags)} tag lines")
    passed = Counter()
    total = Counter()
    for hyp, ref, tag in zip(hypotheses, references, tags):
        h, r = tokenize(hyp), tokenize(ref)
        for check in tag.get("checks", []):
            good = [seq.split() for seq in check["correct"]]
            bad = [seq.split() for seq in check["wrong"]]
            ok = (sum(_count(h, g) for g in good) >= sum(_count(r, g) for g in good)
                  and sum(_count(h, b) for b in bad) <= sum(_count(r, b) for b in bad))
            names = [check["phenomenon"]]
            if check["phenomenon"] == "long_agreement" and "attractor" in tag["phenomena"]:
                names.append("attractor")
            for name in names:
                total[name] += 1
                passed[name] += ok
    return {
        p: {"checks": total[p], "accuracy": (passed[p] / total[p]) if total[p] else None}
        for p in PHENOMENA + DERIVED_PHENOMENA
    }


# --------------------------------------------------------------------------- files
def detokenize(tokens: List[str]) -> str:
    """The written form of a sentence: words separated by spaces, the full stop
    attached to the last word (like ordinary text, so the pipeline's tokenizer and
    detokenizer have work to do and sacrebleu sees detokenized text)."""
    if tokens and tokens[-1] == FULL_STOP:
        return " ".join(tokens[:-1]) + FULL_STOP
    return " ".join(tokens)


def tokenize(line: str) -> List[str]:
    """Inverse of :func:`detokenize` on this corpus's sentences."""
    line = line.strip()
    if line.endswith(FULL_STOP):
        return line[: -len(FULL_STOP)].split() + [FULL_STOP]
    return line.split()


def _atomic_write(path: str, text: str):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class _StatsAccumulator:
    """:func:`phenomenon_stats` of a split, one example at a time."""

    def __init__(self):
        self.n = 0
        self.counts = Counter()
        self.src_len = self.tgt_len = 0
        self.src_vocab, self.tgt_vocab = set(), set()

    def add(self, ex: Example):
        self.n += 1
        self.counts.update(ex.phenomena)
        self.src_len += len(ex.src)
        self.tgt_len += len(ex.tgt)
        self.src_vocab.update(ex.src)
        self.tgt_vocab.update(ex.tgt)

    def stats(self) -> dict:
        n = self.n
        out = {"sentences": n,
               "shares": {p: (self.counts[p] / n if n else 0.0) for p in PHENOMENA + DERIVED_PHENOMENA}}
        if n:
            out.update(mean_src_len=self.src_len / n, mean_tgt_len=self.tgt_len / n,
                       src_vocab=len(self.src_vocab), tgt_vocab=len(self.tgt_vocab))
        return out


def write_corpus(out_dir: str, cfg: Optional[CorpusConfig] = None, progress: bool = False) -> Dict[str, dict]:
    """Generate and write the corpus; returns :func:`phenomenon_stats` of it.

    Files: ``{split}.{src_lang}``, ``{split}.{tgt_lang}``, ``{split}.phenomena.jsonl``
    for split in train/valid/test, and ``corpus.json`` (config, version, statistics).
    Sentences are written as they are generated, to temporary files renamed at the
    end, so an interrupted run never leaves a truncated file under a final name.
    ``progress``: a progress bar on stderr (100,000 sentences or more).
    """
    cfg = cfg or CorpusConfig()
    cfg.validate()
    check_size(cfg)
    os.makedirs(out_dir, exist_ok=True)
    names = {split: [f"{split}.{cfg.src_lang}", f"{split}.{cfg.tgt_lang}", f"{split}.phenomena.jsonl"]
             for split in ("train", "valid", "test")}
    tmp = {}
    files = {}
    stats = {split: _StatsAccumulator() for split in names}
    try:
        for split, split_names in names.items():
            for name in split_names:
                fd, tmp[name] = tempfile.mkstemp(dir=out_dir, prefix="." + name + ".")
                files[name] = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        index = Counter()
        for split, ex in iter_corpus(cfg, progress=progress):
            src, tgt, tags = (files[n] for n in names[split])
            src.write(detokenize(ex.src) + "\n")
            tgt.write(detokenize(ex.tgt) + "\n")
            tags.write(json.dumps(ex.tags(index[split]), sort_keys=True) + "\n")
            index[split] += 1
            stats[split].add(ex)
        for f in files.values():
            f.close()
        for name, path in tmp.items():
            os.chmod(path, 0o644)
            os.replace(path, os.path.join(out_dir, name))
    finally:
        for f in files.values():
            f.close()
        for path in tmp.values():
            if os.path.exists(path):
                os.unlink(path)
    result = {split: stats[split].stats() for split in ("train", "valid", "test")}
    meta = {"generator_version": GENERATOR_VERSION, "config": asdict(cfg), "stats": result}
    _atomic_write(os.path.join(out_dir, "corpus.json"), json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return result


def read_corpus(out_dir: str, src_lang: str = "src", tgt_lang: str = "tgt") -> Dict[str, List[dict]]:
    """Read a written corpus back: split -> list of {src, tgt, phenomena, ...}."""
    splits = {}
    for split in ("train", "valid", "test"):
        paths = [os.path.join(out_dir, f"{split}.{x}") for x in (src_lang, tgt_lang, "phenomena.jsonl")]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"corpus in {out_dir} lacks {', '.join(missing)}")
        with open(paths[0], encoding="utf-8") as fs, open(paths[1], encoding="utf-8") as ft, \
                open(paths[2], encoding="utf-8") as fp:
            src, tgt, tags = fs.read().splitlines(), ft.read().splitlines(), fp.read().splitlines()
        if not len(src) == len(tgt) == len(tags):
            raise ValueError(f"{split}: {len(src)} source, {len(tgt)} target, {len(tags)} tag lines")
        splits[split] = [dict(json.loads(t), src=tokenize(s), tgt=tokenize(g)) for s, g, t in zip(src, tgt, tags)]
    return splits


# --------------------------------------------------------------------------- CLI
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
