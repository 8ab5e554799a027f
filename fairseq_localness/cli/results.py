"""Results over several training seeds: each system's mean and standard deviation per
column, every seed's numbers, and a paired significance test of each system against
its baseline on the same test set. The demo (``scripts/demo.sh``) writes its table
with it (``--layout demo``), and so do the reproduce drivers trained over several seeds
(``scripts/reproduce/<paper>_table<N>.sh --seeds``, ``--layout reproduce``: the
paper's numbers next to ours).

    fairseq-localness-results --runs RUNS.tsv --out DIR [--layout demo|reproduce]
        [--baseline NAME] [--ref FILE] [--samples 1000] [--alpha 0.05]
        [--bootstrap-seed 12345] [--fixed-seeds] [--title TEXT] [--note TEXT]
        [--significance]

``RUNS.tsv`` (``-``: standard input) has a header line and one line per training run:

  ``system``     the system (a row of the table); its runs are its seeds
  ``seed``       the training seed (a whole number; one line per system and seed)
  ``dir``        the run directory (relative paths: relative to RUNS.tsv's directory):
                 ``train.log`` (fairseq-train's log) and the evaluation files below;
                 a run whose score file does not exist yet is shown as not done ('-')
  ``hyp``        hypotheses, relative to ``dir`` (default ``eval/hyp.detok``)
  ``score``      the score JSON, relative to ``dir`` (default ``eval/bleu.json``:
                 sacrebleu's JSON, or ``eval/tok_bleu.json`` of ``evaluate.sh --tok-bleu``)
  ``ref``        the reference of the test (default ``--ref``); relative paths are
                 relative to ``dir`` (e.g. ``eval/ref.tok_bleu``)
  ``tokenize``   how the test's BLEU tokenizes: ``13a`` (sacrebleu's default, on
                 detokenized text: default) or ``none`` (texts tokenized already)
  ``baseline``   the system it is compared with (default ``--baseline``; empty: none)
  ``extra_score`` a second score JSON, relative to ``dir`` (optional; the reproduce
                 tables' extra column, e.g. ``eval/tok_bleu.json``), shown as it is

and any other column, a property of the system shown by the layout, which must be the
same on each of its lines: ``arch`` for the demo's table; for the reproduce tables
``pair``, ``metric`` and ``extra_metric`` (the BLEU of the main and the extra column:
``nist``, ``sacrebleu``, ``multi-bleu``, ``tok-compound``), ``paper_bleu``,
``paper_params``, ``paper_speed``, ``shares_embeddings`` (``1``: our run shares one
embedding matrix where the paper's count has separate ones), and ``config``,
``paper_metric``, ``test``, ``training`` (the notes under the table, one per
configuration), as ``scripts/reproduce/common.sh`` writes them.

From each run: BLEU (recomputed from the hypotheses as the test computes it, with full
precision, and checked against the score JSON, which sacrebleu rounds to one decimal;
the score JSON's value where there is no reference), the targeted accuracy per phenomenon
(``eval/phenomena.json`` of the embedded corpus, when present), and from
``train.log`` (read with :mod:`fairseq_localness.analysis.logs`) the parameters,
training time, updates and updates per second.

The paired test (``--samples`` resamples of the test set): paired bootstrap resampling
(Koehn, 2004, "Statistical Significance Tests for Machine Translation Evaluation") on
the seed-pooled outputs. The statistic is a system's BLEU averaged over its seeds, each
seed's translations scored as one corpus (sacreBLEU's sufficient statistics), so the
observed difference is the difference of the table's mean BLEU. Each resample draws
test sentences with replacement, the same sentences for the system and its baseline
(paired), and every seed's translations of them; unless ``--fixed-seeds``, it also
draws each system's seeds with replacement, so that the spread between seeds enters
the test: a difference that lies within the seed-to-seed spread is then not
significant, whereas resampling sentences alone treats the trained models as given.
The p-value is sacreBLEU's for ``--paired-bs`` (after Moses'
``bootstrap-hypothesis-difference-significance.pl``): the share of resamples whose
absolute difference, centred on the resamples' mean, reaches the observed one, as
``(count + 1) / (samples + 1)``; with one seed per system it is sacreBLEU's (same
resamples for the same ``--bootstrap-seed``; only two identical outputs differ: p = 1
here, 1 / (samples + 1) in sacreBLEU, which counts strictly larger values). A system is
marked ``better`` or ``worse`` only where p < ``--alpha``. The same test runs per seed
(the system's run against the baseline's run with the same seed), and the table counts
the seeds whose own test is significant in either direction.

Outputs in ``--out``: ``results.md`` (the table; below it, with several seeds, every
seed's numbers), ``results.json`` (everything: per-seed numbers, mean, standard
deviation, min, max and count per column, the tests) and ``results.tsv`` (one line
per run). The table is printed on standard output. Without ``--out`` it is only
printed (the reproduce drivers' ``--dry-run``).
"""
import argparse
import csv
import hashlib
import io
import json
import logging
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

logger = logging.getLogger("fairseq_localness.results")

PROG = "fairseq-localness-results"
KNOWN_COLUMNS = ("system", "seed", "dir", "hyp", "score", "ref", "tokenize", "baseline", "extra_score")
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
# The reproduce drivers' BLEU kinds (--bleu), named as scripts/reproduce/results_table.py
# names them in the one-seed table.
METRIC_NAMES = {
    "nist": "NIST BLEU (mteval-v13a = sacreBLEU 13a)",
    "sacrebleu": "sacreBLEU",
    "multi-bleu": "multi-bleu (Moses-tok.)",
    "tok-compound": "tok. BLEU, compound split",
}


class ResultsError(Exception):
    """A problem with the inputs: the command line prints it and exits with status 2."""


# --------------------------------------------------------------------------- runs
@dataclass
class Run:
    system: str
    seed: int
    dir: str
    hyp: str
    score: str
    ref: str
    tokenize: str
    baseline: str
    meta: Dict[str, str]
    extra_score: str = ""
    values: Dict[str, Optional[float]] = field(default_factory=dict)
    phenomena: Dict[str, Optional[float]] = field(default_factory=dict)
    signature: Optional[str] = None
    rel_dir: str = ""  # as RUNS.tsv gives it

    @property
    def done(self) -> bool:
        return self.values.get("bleu") is not None


def _resolve(path: str, base: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


def read_manifest(text: str, source: str, default_ref: Optional[str], default_baseline: Optional[str],
                  root: str = ".") -> List[Run]:
    """Parse RUNS.tsv (see the module's docstring) and check it; relative run
    directories are relative to ``root`` (RUNS.tsv's directory)."""
    lines = [l for l in text.splitlines() if l.strip()]
    if not lines:
        raise ResultsError(f"--runs {source}: empty; expected a header line and one line per run")
    reader = csv.DictReader(io.StringIO("\n".join(lines) + "\n"), delimiter="\t", quoting=csv.QUOTE_NONE)
    header = reader.fieldnames or []
    missing = [c for c in ("system", "seed", "dir") if c not in header]
    if missing:
        raise ResultsError(f"--runs {source}: the header has no column {', '.join(missing)} "
                           f"(found: {', '.join(header)}); expected system, seed, dir and optional "
                           f"{', '.join(KNOWN_COLUMNS[3:])} or display columns")
    runs, seen = [], set()
    for n, row in enumerate(reader, start=2):
        if None in row or any(v is None for v in row.values()):
            raise ResultsError(f"--runs {source}, line {n}: expected {len(header)} tab-separated fields")
        system, seed = row["system"], row["seed"]
        if not NAME_RE.match(system):
            raise ResultsError(f"--runs {source}, line {n}: system {system!r}: expected letters, digits, _ . + -")
        if not re.fullmatch(r"\d+", seed):
            raise ResultsError(f"--runs {source}, line {n}: seed {seed!r}: expected a whole number")
        if (system, int(seed)) in seen:
            raise ResultsError(f"--runs {source}, line {n}: system {system!r} seed {seed} appears twice")
        seen.add((system, int(seed)))
        tokenize = row.get("tokenize") or "13a"
        if tokenize not in ("13a", "none"):
            raise ResultsError(f"--runs {source}, line {n}: tokenize {tokenize!r}: expected 13a or none")
        if not row["dir"]:
            raise ResultsError(f"--runs {source}, line {n}: empty dir")
        d = _resolve(row["dir"], root)
        ref = row.get("ref") or (os.path.abspath(default_ref) if default_ref else "")
        runs.append(Run(
            system=system, seed=int(seed), dir=d,
            hyp=_resolve(row.get("hyp") or os.path.join("eval", "hyp.detok"), d),
            score=_resolve(row.get("score") or os.path.join("eval", "bleu.json"), d),
            ref=_resolve(ref, d) if ref else "", tokenize=tokenize,
            baseline=row["baseline"] if "baseline" in row else (default_baseline or ""), rel_dir=row["dir"],
            extra_score=_resolve(row["extra_score"], d) if row.get("extra_score") else "",
            meta={k: v for k, v in row.items() if k not in KNOWN_COLUMNS}))
    systems = list(dict.fromkeys(r.system for r in runs))
    for s in systems:
        mine = [r for r in runs if r.system == s]
        for key in ("baseline", "tokenize"):
            if len({getattr(r, key) for r in mine}) > 1:
                raise ResultsError(f"--runs {source}: system {s!r} has different {key} values on its lines")
        if len({tuple(sorted(r.meta.items())) for r in mine}) > 1:
            raise ResultsError(f"--runs {source}: system {s!r} has different display columns on its lines")
    for r in runs:
        if r.baseline and r.baseline not in systems:
            raise ResultsError(f"--runs {source}: system {r.system!r}: baseline {r.baseline!r} is not one of "
                               f"the systems ({', '.join(systems)})")
    return runs


def _load_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ResultsError(f"{path}: not readable as JSON ({e})")


def _score_of(path: str) -> Optional[float]:
    score = _load_json(path)
    if score is None:
        return None
    if not isinstance(score, dict) or not isinstance(score.get("score"), (int, float)):
        raise ResultsError(f"{path}: expected a JSON object with a numeric 'score' (sacrebleu's output)")
    return float(score["score"])


def read_run(run: Run):
    """Fill ``run.values`` (bleu, extra, params, train_seconds, updates, ups, wps) and
    ``run.phenomena`` from its files; what does not exist stays None."""
    from fairseq_localness.analysis.logs import parse_log
    from fairseq_localness.analysis.cli_args import AnalysisError

    bleu = _score_of(run.score)
    if bleu is not None:
        run.values["bleu"] = bleu
    if run.extra_score:
        run.values["extra"] = _score_of(run.extra_score)
    sacre = _load_json(os.path.join(run.dir, "eval", "bleu.json"))
    if isinstance(sacre, dict) and sacre.get("signature"):
        run.signature = sacre["signature"]
    phen = _load_json(os.path.join(run.dir, "eval", "phenomena.json"))
    if isinstance(phen, dict):
        for name, v in phen.items():
            acc = v.get("accuracy") if isinstance(v, dict) else None
            run.phenomena[name] = 100.0 * acc if isinstance(acc, (int, float)) else None
    log_path = os.path.join(run.dir, "train.log")
    if os.path.isfile(log_path):
        try:
            log = parse_log(log_path)
        except AnalysisError as e:
            raise ResultsError(str(e))
        records = log.of_kind("train") or log.of_kind("train_inner")  # per epoch, else per log interval
        run.values["params"] = float(log.params) if log.params is not None else None
        run.values["train_seconds"] = log.train_seconds
        run.values["updates"] = float(log.last_update) if log.last_update is not None else None
        ups = [r["ups"] for r in records if "ups" in r]
        wps = [r["wps"] for r in records if "wps" in r]
        run.values["ups"] = sum(ups) / len(ups) if ups else None
        run.values["wps"] = sum(wps) / len(wps) if wps else None


# --------------------------------------------------------------------------- statistics
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
                      "phenomena": r.phenomena} for r in mine],
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


# --------------------------------------------------------------------------- tables
def fmt(summary: Dict, spec: str, multi: bool) -> str:
    """``mean ± sd`` (``mean`` alone for one value; with ``multi``, a single value of a
    table that has several seeds elsewhere is still just the value)."""
    if summary is None or summary["mean"] is None:
        return "-"
    text = format(summary["mean"], spec)
    if multi and summary["sd"] is not None:
        text += " ± " + format(summary["sd"], spec)
    return text


def _int(v) -> str:
    return "-" if v is None else "{:,}".format(int(round(v)))


def _p(p) -> str:
    if p is None:
        return "-"
    return "%.3f" % p if p >= 0.001 else "<0.001"


def test_cells(entry: Dict, multi: bool) -> List[str]:
    """Δ BLEU, p, verdict (and, with several seeds, the per-seed counts)."""
    c = entry["comparison"]
    if c is None:
        return ["-", "-", "baseline" if entry.get("_is_baseline") else "-"] + (["-"] if multi else [])
    cells = ["%+.2f" % c["delta_mean"], _p(c["pooled"]["p_value"]), c["pooled"]["verdict"]]
    if multi:
        cells.append("%d / %d of %d" % (c["seeds_better"], c["seeds_worse"], c["seeds_tested"])
                     if c["seeds_tested"] else "-")
    return cells


def _mark_baselines(result: Dict):
    bases = {e["baseline"] for e in result["systems"] if e["baseline"] and e["baseline"] != e["system"]}
    for e in result["systems"]:
        e["_is_baseline"] = e["system"] in bases


def demo_table(result: Dict, args) -> List[str]:
    systems = result["systems"]
    multi = any(len(e["seeds_done"]) > 1 for e in systems)
    phen = phenomenon_order(list(dict.fromkeys(p for e in systems for p in e["phenomena"])))
    bases = sorted({e["baseline"] for e in systems if e["baseline"] and e["baseline"] != e["system"]})
    base_name = bases[0] if len(bases) == 1 else "baseline"
    head = ["system", "arch", "params"] + (["seeds"] if multi else []) + ["BLEU"] + \
        [p.replace("_", " ") for p in phen] + ["train time (s)"]
    test_head = ["Δ BLEU", "p", f"vs {base_name}"] + (["seeds better / worse"] if multi else [])
    if bases:
        head += test_head
    align = ["---", "---"] + ["---:"] * (len(head) - 2)
    if bases:
        align[-len(test_head):] = ["---:", "---:", "---"] + (["---:"] if multi else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for e in systems:
        s = e["summary"]
        cells = [e["system"], e["meta"].get("arch", "-"), _int(s["params"]["mean"])]
        if multi:
            cells.append("%d" % len(e["seeds_done"]) if len(e["seeds_done"]) == len(e["seeds"])
                         else "%d of %d" % (len(e["seeds_done"]), len(e["seeds"])))
        cells.append(fmt(s["bleu"], ".2f", multi))
        cells += [fmt(e["phenomena"].get(p), ".1f", multi) for p in phen]
        cells.append(fmt(s["train_seconds"], ".1f", multi))
        if bases:
            cells += test_cells(e, multi)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def reproduce_table(result: Dict, args) -> List[str]:
    """The reproduce drivers' table over seeds: the columns of the one-seed table
    (``scripts/reproduce/results_table.py``: row, pair, metric, paper BLEU, our BLEU,
    delta, the extra column, parameters, speed), ours as mean ± sd over the seeds, with
    the number of seeds and the paired test against the row's baseline."""
    systems = result["systems"]
    multi = any(len(e["seeds"]) > 1 for e in systems)
    extra_kinds = sorted({e["meta"]["extra_metric"] for e in systems if e["meta"].get("extra_metric")})
    has_params = any(e["meta"].get("paper_params") for e in systems)
    has_speed = any(e["meta"].get("paper_speed") for e in systems)
    has_sig = args.significance and any(e["baseline"] for e in systems)
    head = ["row", "pair", "metric"] + (["seeds"] if multi else []) + ["paper BLEU", "our BLEU", "delta"]
    if extra_kinds:
        head += [" / ".join(METRIC_NAMES.get(k, k) for k in extra_kinds) + " (extra)"]
    if has_params:
        head += ["paper params", "our params"]
    if has_speed:
        head += ["paper speed", "our speed"]
    if has_sig:
        head += ["Δ vs. baseline", "p (vs. baseline)", "vs. baseline"] + (["seeds better / worse"] if multi else [])
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if h in ("row", "pair", "metric", "vs. baseline") else "---:" for h in head) + "|"]
    params = {e["system"]: e["summary"]["params"]["mean"] for e in systems}
    for e in systems:
        m, s = e["meta"], e["summary"]
        paper = m.get("paper_bleu", "-") or "-"
        cells = [e["system"], m.get("pair", "-"), METRIC_NAMES.get(m.get("metric", ""), m.get("metric", "-"))]
        if multi:
            cells.append("%d of %d" % (len(e["seeds_done"]), len(e["seeds"])))
        cells += [paper, fmt(s["bleu"], ".2f", multi)]
        cells.append("%+.2f" % (round(s["bleu"]["mean"], 2) - float(paper))
                     if s["bleu"]["mean"] is not None and paper != "-" else "-")
        if extra_kinds:
            cells.append(fmt(s["extra"], ".2f", multi) if m.get("extra_metric") else "-")
        if has_params:
            n, pp, base = params[e["system"]], m.get("paper_params", ""), e["baseline"]
            if n is None:
                mine = "-"
            elif pp.startswith("+") and base and params.get(base) is not None:
                d = int(round(n - params[base]))
                mine = ("+" if d >= 0 else "-") + _millions(abs(d))
            else:
                mine = _millions(int(round(n)))
                if _shared_embeddings_differ(m, n):
                    mine += " (shared emb.)"
            cells += [pp or "-", mine]
        if has_speed:
            cells += [m.get("paper_speed") or "-", fmt(s["ups"], ".2f", multi)]
        if has_sig:
            cells += test_cells(e, multi)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _millions(n: int) -> str:
    return "%.2fM" % (n / 1e6) if abs(n) >= 1e5 else "{:,}".format(n)


def _paper_millions(text: str) -> Optional[float]:
    """'88.0M' -> 88.0e6, '524K' -> 524e3; None for differences ('+0.4M') and others."""
    m = re.fullmatch(r"([0-9.]+)([MK])", text or "")
    return float(m.group(1)) * (1e6 if m.group(2) == "M" else 1e3) if m else None


def _shared_embeddings_differ(meta: Dict[str, str], ours: float) -> bool:
    """Our run shares one embedding matrix where the paper's count has separate ones, and
    the counts differ by more than 5% (the one-seed table's '(shared emb.)')."""
    paper = _paper_millions(meta.get("paper_params", ""))
    return meta.get("shares_embeddings") == "1" and bool(paper) and abs(ours - paper) > 0.05 * paper


def config_notes(systems: List[Dict]) -> List[str]:
    """Per configuration (the ``config`` column), as the one-seed table writes them: the
    paper's words on BLEU, the main and extra columns' BLEU, the test set, the training."""
    out, seen = [], set()
    for e in systems:
        m = e["meta"]
        if not m.get("config") or m["config"] in seen:
            continue
        seen.add(m["config"])
        n = sum(x["meta"].get("config") == m["config"] for x in systems)
        label = "%s (%d row%s)" % (m["config"], n, "s" if n > 1 else "")
        extra = ("; extra column: " + METRIC_NAMES.get(m["extra_metric"], m["extra_metric"])) \
            if m.get("extra_metric") else ""
        out.append(f"{label}: BLEU as the paper states it: \"{m.get('paper_metric', '')}\"; main column: "
                   f"{METRIC_NAMES.get(m.get('metric', ''), m.get('metric', '-'))}{extra}. "
                   f"Test set: {m.get('test', '-')}. Training: {m.get('training', '-')}.")
    return out


def notes(result: Dict, args, layout: str) -> List[str]:
    systems = result["systems"]
    multi = any(len(e["seeds"]) > 1 for e in systems)
    out = [""]
    if args.title:
        done = sum(1 for e in systems if e["seeds_done"])
        out.append(f"{args.title}. Our numbers: {done} of {len(systems)} rows have results ('-': not run yet)."
                   + (" delta = ours - paper." if layout == "reproduce" else ""))
    if multi:
        seeds = sorted({s for e in systems for s in e["seeds"]})
        out.append("Seeds %s: each cell is the mean ± the standard deviation over the seeds (n - 1 in the "
                   "denominator); every seed's numbers are in results.json and below." % ",".join(map(str, seeds)))
    if any(e["comparison"] for e in systems):
        out.append(
            "%s: mean minus the baseline's mean. p: paired bootstrap resampling (Koehn 2004) of the test "
            "sentences, %d resamples, %s; p as sacreBLEU's --paired-bs. 'better'/'worse' only where p < %g, "
            "else 'n.s.'.%s"
            % ("Δ vs. baseline" if layout == "reproduce" else "Δ BLEU", args.samples,
               ("the translations of all seeds pooled and each system's seeds resampled too, so the seed-to-seed "
                "spread counts" if multi and not args.fixed_seeds else
                "the translations of all seeds pooled" if multi else "one run per system"),
               args.alpha,
               " seeds better / worse: the seeds whose own run is significantly better / worse than the "
               "baseline's run with the same seed (the same test, per seed)." if multi else ""))
    if layout == "reproduce":
        out += config_notes(systems)
    if layout == "reproduce" and any(e["meta"].get("paper_speed") for e in systems):
        out.append("Speed: training updates per second (the paper's on its hardware; ours as trained here, "
                   "mean of fairseq's 'ups' per epoch).")
    if layout == "reproduce" and any((e["meta"].get("paper_params") or "").startswith("+") for e in systems):
        out.append("Params: for rows whose paper number starts with '+', ours is the difference from the row's "
                   "baseline too.")
    if layout == "reproduce" and any(e["summary"]["params"]["mean"] is not None
                                     and _shared_embeddings_differ(e["meta"], e["summary"]["params"]["mean"])
                                     for e in systems):
        out.append("(shared emb.): our run shares one embedding matrix between source, target and output "
                   "(--share-all-embeddings, fairseq's recipe for a joint vocabulary); the paper's count includes "
                   "separate source embeddings, hence the difference in parameters.")
    for note in args.note or []:
        out.append(note)
    for s in result["signatures"]:
        out.append(("sacreBLEU signature: " if layout == "reproduce" else "BLEU: sacrebleu ") + s)
    return out


def _has_extra(systems: List[Dict]) -> bool:
    return any(r.get("extra") is not None for e in systems for r in e["runs"])


def per_seed_table(result: Dict) -> List[str]:
    systems = result["systems"]
    phen = phenomenon_order(list(dict.fromkeys(p for e in systems for p in e["phenomena"])))
    extra = _has_extra(systems)
    tested = any(e["comparison"] for e in systems)
    head = ["system", "seed", "params", "BLEU"] + (["extra"] if extra else []) + \
        [p.replace("_", " ") for p in phen] + ["train time (s)", "updates", "ups"] + \
        (["Δ BLEU vs. baseline's seed", "p"] if tested else [])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for e in systems:
        tests = {t["seed"]: t for t in (e["comparison"] or {}).get("per_seed", [])}
        for r in e["runs"]:
            if not r["done"]:
                lines.append("| %s | %d | %s |" % (e["system"], r["seed"], " | ".join(["-"] * (len(head) - 2))))
                continue
            t = tests.get(r["seed"])
            cells = [e["system"], str(r["seed"]), _int(r.get("params")), "%.2f" % r["bleu"]]
            if extra:
                cells.append("%.2f" % r["extra"] if r.get("extra") is not None else "-")
            cells += ["%.1f" % r["phenomena"][p] if r["phenomena"].get(p) is not None else "-" for p in phen]
            cells += ["%.1f" % r["train_seconds"] if r.get("train_seconds") is not None else "-",
                      _int(r.get("updates")), "%.2f" % r["ups"] if r.get("ups") is not None else "-"]
            if tested:
                cells += ["%+.2f" % t["delta"] if t else "-", _p(t["p_value"]) if t else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def per_seed_tsv(result: Dict) -> str:
    systems = result["systems"]
    phen = phenomenon_order(list(dict.fromkeys(p for e in systems for p in e["phenomena"])))
    meta = list(dict.fromkeys(k for e in systems for k in e["meta"]))
    extra = _has_extra(systems)
    cols = ["system", "seed"] + meta + ["params", "bleu"] + (["extra"] if extra else []) + phen + \
        ["train_seconds", "updates", "ups", "p_vs_baseline_seed"]
    out = ["\t".join(cols)]
    for e in systems:
        tests = {t["seed"]: t for t in (e["comparison"] or {}).get("per_seed", [])}
        for r in e["runs"]:
            def v(x, spec):
                return "" if x is None else format(x, spec)
            row = [e["system"], str(r["seed"])] + [e["meta"].get(k, "") for k in meta]
            row += [v(r.get("params"), ".0f"), v(r.get("bleu"), ".2f")]
            row += [v(r.get("extra"), ".2f")] if extra else []
            row += [v(r["phenomena"].get(p), ".2f") for p in phen]
            row += [v(r.get("train_seconds"), ".1f"), v(r.get("updates"), ".0f"), v(r.get("ups"), ".3f"),
                    v(tests[r["seed"]]["p_value"] if r["seed"] in tests else None, ".4f")]
            out.append("\t".join(row))
    return "\n".join(out) + "\n"


def render(result: Dict, args) -> str:
    _mark_baselines(result)
    table = demo_table(result, args) if args.layout == "demo" else reproduce_table(result, args)
    text = table + notes(result, args, args.layout)
    if any(len(e["seeds"]) > 1 for e in result["systems"]):
        text += ["", "Per seed" + (" (p: the seed's run against the baseline's run with the same seed):"
                                   if any(e["comparison"] for e in result["systems"]) else ":"), ""]
        text += per_seed_table(result)
    for e in result["systems"]:
        e.pop("_is_baseline", None)
    return "\n".join(text) + "\n"


def _write(path: str, text: str):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------- command line
def get_parser():
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="RUNS.tsv and the test: see the module's documentation "
                                "(python -m pydoc fairseq_localness.cli.results)")
    p.add_argument("--runs", required=True, metavar="RUNS.tsv", help="the runs (tab-separated, header line; - for stdin)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write results.md, results.json, results.tsv here (default: only print the table)")
    p.add_argument("--layout", choices=["demo", "reproduce"], default="demo")
    p.add_argument("--baseline", default=None, help="every system's baseline (default: the 'baseline' column)")
    p.add_argument("--ref", default=None, help="reference of the test set (default: the 'ref' column)")
    p.add_argument("--samples", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument("--bootstrap-seed", type=int, default=12345,
                   help="seed of the resampling (default 12345, sacreBLEU's)")
    p.add_argument("--fixed-seeds", action="store_true",
                   help="resample test sentences only, not each system's seeds")
    p.add_argument("--significance", action="store_true",
                   help="reproduce layout: show the test columns (the paper reports significance)")
    p.add_argument("--title", default="", help="the table's title (first line of the notes)")
    p.add_argument("--note", action="append", help="a line for the notes below the table (repeatable)")
    return p


def run(args) -> Dict:
    if args.samples < 1:
        raise ResultsError(f"--samples: expected a whole number >= 1, got {args.samples}")
    if not 0 < args.alpha < 1:
        raise ResultsError(f"--alpha: expected a number between 0 and 1, got {args.alpha}")
    if args.out is not None and os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ResultsError(f"--out: {args.out!r} exists and is not a directory")
    if args.runs == "-":
        text, source, root = sys.stdin.read(), "(stdin)", "."
    else:
        if not os.path.isfile(args.runs):
            raise ResultsError(f"--runs: {args.runs!r} does not exist")
        with open(args.runs, encoding="utf-8") as f:
            text, source = f.read(), args.runs
        root = os.path.dirname(os.path.abspath(args.runs))
    if args.baseline is not None and not NAME_RE.match(args.baseline):
        raise ResultsError(f"--baseline: {args.baseline!r}: expected a system name")
    runs = read_manifest(text, source, args.ref, args.baseline, root)
    for r in runs:
        read_run(r)
    result = aggregate(runs, args)
    result["test"] = {
        "method": "paired bootstrap resampling of the test sentences on seed-pooled outputs (Koehn 2004); "
                  "p as sacreBLEU's --paired-bs",
        "samples": args.samples, "bootstrap_seed": args.bootstrap_seed, "alpha": args.alpha,
        "resample_seeds": not args.fixed_seeds,
    }
    text = render(result, args)
    if args.out is not None:
        os.makedirs(args.out, exist_ok=True)
        _write(os.path.join(args.out, "results.json"), json.dumps(result, indent=1) + "\n")
        _write(os.path.join(args.out, "results.tsv"), per_seed_tsv(result))
        _write(os.path.join(args.out, "results.md"), text)
    sys.stdout.write(text)
    sys.stdout.flush()
    return result


def cli_main(argv=None):
    logging.basicConfig(format="%(message)s", level=logging.INFO, stream=sys.stderr, force=True)
    args = get_parser().parse_args(argv)
    try:
        run(args)
    except ResultsError as e:
        logger.error("%s: error: %s", PROG, e)  # the scripts' "name: error: message"
        sys.exit(2)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
