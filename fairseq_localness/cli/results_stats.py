"""The numbers of ``fairseq-localness-results``: summaries over seeds, sacreBLEU's
per-sentence statistics, the paired bootstrap test (Koehn, 2004) on seed-pooled
outputs, and the aggregation of the runs per system with the tests against each
system's baseline (the method: :mod:`fairseq_localness.cli.results`)."""
import hashlib
import math
import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_localness.cli.results_runs import ResultsError, Run


@dataclass
class Summary:
    mean: Optional[float]
    sd: Optional[float]  # sample standard deviation (n - 1); None for fewer than 2 values
    n: int
    min: Optional[float] = None
    max: Optional[float] = None

    def as_dict(self):
        return {"mean": self.mean, "sd": self.sd, "n": self.n, "min": self.min, "max": self.max}


def summarize(values: Sequence[Optional[float]]) -> Summary:
    """Mean, sample standard deviation (n - 1 in the denominator), count, min and max
    of the values that exist."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return Summary(None, None, 0)
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return Summary(mean, sd, len(xs), min(xs), max(xs))


class SentenceStats:
    """sacreBLEU's per-sentence BLEU statistics (matches and totals per n-gram order,
    hypothesis and reference length) of hypothesis files, computed once per file."""

    def __init__(self):
        self._metrics = {}
        self._cache = {}
        self._refs = {}

    def metric(self, tokenize: str):
        if tokenize not in self._metrics:
            from sacrebleu.metrics import BLEU

            self._metrics[tokenize] = BLEU(tokenize=tokenize)
        return self._metrics[tokenize]

    def reference(self, path: str) -> Tuple[List[str], str]:
        if path not in self._refs:
            if not path:
                raise ResultsError("no reference for the significance test: give --ref or a 'ref' column")
            if not os.path.isfile(path):
                raise ResultsError(f"reference {path!r} does not exist")
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
            self._refs[path] = (lines, hashlib.sha1("\n".join(lines).encode("utf-8")).hexdigest())
        return self._refs[path]

    def of(self, run: Run):
        import numpy as np

        key = (run.hyp, run.ref, run.tokenize)
        if key not in self._cache:
            refs, _ = self.reference(run.ref)
            if not os.path.isfile(run.hyp):
                raise ResultsError(f"{run.system} seed {run.seed}: hypotheses {run.hyp!r} do not exist")
            with open(run.hyp, encoding="utf-8") as f:
                hyps = f.read().splitlines()
            if len(hyps) != len(refs):
                raise ResultsError(f"{run.system} seed {run.seed}: {run.hyp} has {len(hyps)} lines but the "
                                   f"reference {run.ref} has {len(refs)}; expected one hypothesis per reference line")
            stats = self.metric(run.tokenize)._extract_corpus_statistics(hyps, [refs])
            self._cache[key] = np.asarray(stats, dtype=np.int64)
        return self._cache[key]


def bleu_of(metric, totals) -> float:
    return float(metric._compute_score_from_stats([int(x) for x in totals]).score)


def paired_bootstrap(metric, system: Sequence, baseline: Sequence, samples: int = 1000, seed: int = 12345,
                     resample_seeds: bool = True, chunk: int = 100) -> Dict:
    """Paired bootstrap resampling of the mean BLEU over seeds.

    ``system`` and ``baseline``: one array of per-sentence sufficient statistics
    (sentences x statistics, sacreBLEU's) per seed, all over the same test set. The
    statistic is a side's BLEU averaged over its seeds (each seed's translations scored
    as one corpus), so that the observed difference is the difference of the table's
    mean BLEU. Each of ``samples`` resamples draws the sentences with replacement (the
    same for both sides: paired) and, with ``resample_seeds``, each side's seeds with
    replacement, and recomputes the statistic on them. The sentence draws come first
    from ``numpy.random.default_rng(seed)``, as in sacreBLEU's paired bootstrap, so
    that with one seed per side the resamples, and the p-value, are sacreBLEU's.

    Returns the observed mean BLEU of both sides, their difference, the 95% percentile
    interval of the resampled difference, and the p-value
    ``(#{|d_i| - mean|d| >= |d_obs|} + 1) / (samples + 1)`` (sacreBLEU's ``--paired-bs``,
    after Moses' bootstrap-hypothesis-difference-significance.pl, except that a tie
    counts as extreme: sacreBLEU counts only larger values, which gives two identical
    systems p = 1 / (samples + 1) instead of 1).
    """
    import numpy as np

    system = [np.asarray(s) for s in system]
    baseline = [np.asarray(s) for s in baseline]
    n = system[0].shape[0]
    if any(s.shape[0] != n for s in system + baseline):
        raise ResultsError("paired test: the outputs cover test sets of different sizes")
    rng = np.random.default_rng(seed)
    idx = rng.choice(n, size=(samples, n), replace=True)

    def resampled(per_seed):
        """(samples,) mean BLEU over the (drawn) seeds on each resample's sentences."""
        k = len(per_seed)
        scores = np.zeros((samples, k))
        for j, s in enumerate(per_seed):
            for lo in range(0, samples, chunk):
                sums = s[idx[lo:lo + chunk]].sum(axis=1)
                scores[lo:lo + chunk, j] = [bleu_of(metric, t) for t in sums]
        if resample_seeds and k > 1:
            draws = rng.integers(0, k, size=(samples, k))
            return np.take_along_axis(scores, draws, axis=1).mean(axis=1)
        return scores.mean(axis=1)

    sys_scores, base_scores = resampled(system), resampled(baseline)
    sys_bleu = float(np.mean([bleu_of(metric, s.sum(axis=0)) for s in system]))
    base_bleu = float(np.mean([bleu_of(metric, s.sum(axis=0)) for s in baseline]))
    observed = sys_bleu - base_bleu
    diffs = sys_scores - base_scores
    absd = np.abs(diffs)
    shifted = absd - absd.mean()
    p = (int(np.sum(shifted >= abs(observed))) + 1) / (samples + 1)
    return {"bleu": sys_bleu, "baseline_bleu": base_bleu, "delta": observed, "p_value": p,
            "ci95": [float(np.percentile(diffs, 2.5)), float(np.percentile(diffs, 97.5))],
            "seeds": len(system), "baseline_seeds": len(baseline)}


def verdict(delta: float, p: float, alpha: float) -> str:
    if p < alpha and delta != 0:
        return "better" if delta > 0 else "worse"
    return "n.s."


# --------------------------------------------------------------------------- aggregation
def exact_bleu(runs: List[Run], stats: "SentenceStats"):
    """Replace each finished run's BLEU from its score file (rounded: sacrebleu's JSON
    has one decimal) by the BLEU of its hypotheses, computed as the test computes it;
    the two must agree to the score file's rounding."""
    for r in runs:
        if not (r.done and r.ref and os.path.isfile(r.hyp)):
            continue
        exact = bleu_of(stats.metric(r.tokenize), stats.of(r).sum(axis=0))
        reported = r.values["bleu"]
        if abs(exact - reported) > 0.051:
            raise ResultsError(
                f"{r.system} seed {r.seed}: {r.score} reports BLEU {reported} but {r.hyp} against {r.ref} "
                f"(tokenize {r.tokenize}) scores {exact:.2f}; expected the files the score was computed from")
        r.values["bleu"] = exact


def phenomenon_order(names: Sequence[str]) -> List[str]:
    """The embedded corpus's phenomena in its own order, then any others."""
    from fairseq_localness.corpus import DERIVED_PHENOMENA, PHENOMENA

    known = [p for p in PHENOMENA + DERIVED_PHENOMENA if p in names]
    return known + [p for p in names if p not in known]


def aggregate(runs: List[Run], args) -> Dict:
    """Per system: its runs' numbers, their summary, and the tests against its baseline."""
    systems = list(dict.fromkeys(r.system for r in runs))
    by_system = {s: sorted((r for r in runs if r.system == s), key=lambda r: r.seed) for s in systems}
    stats = SentenceStats()
    exact_bleu(runs, stats)
    out = []
    for s in systems:
        mine = by_system[s]
        done = [r for r in mine if r.done]
        phen_names = phenomenon_order(list(dict.fromkeys(p for r in done for p in r.phenomena)))
        entry = {
            "system": s, "meta": mine[0].meta, "baseline": mine[0].baseline or None,
            "seeds": [r.seed for r in mine], "seeds_done": [r.seed for r in done],
            "runs": [{"seed": r.seed, "dir": r.rel_dir, "done": r.done, **r.values,
                      "phenomena": r.phenomena, **({"failed": r.failed} if r.failed else {})} for r in mine],
            "summary": {k: summarize([r.values.get(k) for r in done]).as_dict()
                        for k in ("bleu", "extra", "params", "train_seconds", "updates", "ups", "wps")},
            "phenomena": {p: summarize([r.phenomena.get(p) for r in done]).as_dict() for p in phen_names},
            "comparison": None,
        }
        base = mine[0].baseline
        # (the reproduce layout tests only with --significance: where the paper tests)
        tested = getattr(args, "layout", "demo") != "reproduce" or getattr(args, "significance", False)
        if tested and base and base != s and done:
            base_done = [r for r in by_system[base] if r.done]
            if base_done:
                entry["comparison"] = compare(done, base_done, stats, args)
        out.append(entry)
    return {"systems": out, "signatures": sorted({r.signature for r in runs if r.signature})}


def compare(done: List[Run], base_done: List[Run], stats: SentenceStats, args) -> Dict:
    tokenize = done[0].tokenize
    if base_done[0].tokenize != tokenize:
        raise ResultsError(f"{done[0].system} and its baseline {base_done[0].system} are scored with different "
                           f"tokenizations ({tokenize} vs {base_done[0].tokenize})")
    refs = {stats.reference(r.ref)[1] for r in done + base_done}
    if len(refs) > 1:
        raise ResultsError(f"{done[0].system} and its baseline {base_done[0].system}: the runs' references differ; "
                           "a paired test needs one test set")
    metric = stats.metric(tokenize)
    base_mean = summarize([r.values["bleu"] for r in base_done]).mean
    mean = summarize([r.values["bleu"] for r in done]).mean
    pooled = paired_bootstrap(metric, [stats.of(r) for r in done], [stats.of(r) for r in base_done],
                              args.samples, args.bootstrap_seed, not args.fixed_seeds)
    pooled["verdict"] = verdict(pooled["delta"], pooled["p_value"], args.alpha)
    per_seed = []
    base_by_seed = {r.seed: r for r in base_done}
    for r in done:
        b = base_by_seed.get(r.seed)
        if b is None:
            continue
        t = paired_bootstrap(metric, [stats.of(r)], [stats.of(b)], args.samples, args.bootstrap_seed, False)
        per_seed.append({"seed": r.seed, "bleu": t["bleu"], "baseline_bleu": t["baseline_bleu"],
                         "delta": t["delta"], "p_value": t["p_value"], "ci95": t["ci95"],
                         "verdict": verdict(t["delta"], t["p_value"], args.alpha)})
    return {
        "baseline": base_done[0].system, "delta_mean": mean - base_mean, "pooled": pooled, "per_seed": per_seed,
        "seeds_tested": len(per_seed),
        "seeds_better": sum(t["verdict"] == "better" for t in per_seed),
        "seeds_worse": sum(t["verdict"] == "worse" for t in per_seed),
    }
