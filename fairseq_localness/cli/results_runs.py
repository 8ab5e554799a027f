"""The runs of ``fairseq-localness-results``: reading and checking RUNS.tsv (its
columns: :mod:`fairseq_localness.cli.results`) and each run's files (score JSON,
phenomena, ``train.log``)."""
import csv
import io
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

KNOWN_COLUMNS = ("system", "seed", "dir", "hyp", "score", "ref", "tokenize", "baseline", "extra_score")
NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")


class ResultsError(Exception):
    """A problem with the inputs: the command line prints it and exits with status 2."""


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
    failed: Optional[str] = None  # why a run has no result: DIR/FAILED (a failed SLURM job, --slurm)

    @property
    def done(self) -> bool:
        return self.values.get("bleu") is not None


def _resolve(path: str, base: str) -> str:
    return path if os.path.isabs(path) else os.path.join(base, path)


def read_manifest(text: str, source: str, default_ref: Optional[str], default_baseline: Optional[str],
                  root: str = ".") -> List[Run]:
    """Parse RUNS.tsv (its columns: :mod:`fairseq_localness.cli.results`) and check
    it; relative run directories are relative to ``root`` (RUNS.tsv's directory)."""
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


def load_json(path: str, error=ResultsError):
    """The JSON value in ``path``; None where there is no such file; ``error`` (one
    line naming the file) where it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise error(f"{path}: not readable as JSON ({e})")


def _score_of(path: str) -> Optional[float]:
    score = load_json(path)
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
    else:  # a run whose SLURM jobs failed: the reproduce drivers' table job writes DIR/FAILED, with the reason
        try:
            with open(os.path.join(run.dir, "FAILED"), errors="replace") as f:
                run.failed = f.read().strip() or "a job failed"
        except OSError:
            pass
    if run.extra_score:
        run.values["extra"] = _score_of(run.extra_score)
    sacre = load_json(os.path.join(run.dir, "eval", "bleu.json"))
    if isinstance(sacre, dict) and sacre.get("signature"):
        run.signature = sacre["signature"]
    phen = load_json(os.path.join(run.dir, "eval", "phenomena.json"))
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
