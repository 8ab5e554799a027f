"""Statistics and scoring: the share of each phenomenon, lengths and vocabulary of a
corpus (:func:`phenomenon_stats`, :func:`format_stats`), and the targeted accuracy
per phenomenon of a system's translations (:func:`score_checks`)."""
from collections import Counter
from dataclasses import asdict
from typing import Dict, List

from fairseq_localness.corpus.grammar import Example
from fairseq_localness.corpus.lexicon import DERIVED_PHENOMENA, PHENOMENA, tokenize


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
