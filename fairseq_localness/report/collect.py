"""What a work directory holds, read for the page: the run (``run.json``), the table
(``results.md`` as written, ``results.json``'s numbers), every row's runs (one per seed)
with their state, and each run's training log.

A run's state, from its files only (nothing is asked of SLURM, so ``--status`` and the
table job read the same): ``done`` (its score exists), ``failed`` (its ``FAILED`` file,
written by a ``--slurm`` graph's table job, a SLURM job recorded as failed in
``WORK/slurm/jobs/``, or a log whose last line is an error), ``running`` (a SLURM job
recorded as running, or a log written in the last ``RUNNING_SECONDS``), ``queued``
(submitted, not started), ``stopped`` (a log, no score, no error, not written lately)
and ``not run``. A log that cannot be read as fairseq's (bytes that are not text, a
record cut short) makes the run ``unreadable``, whatever else it has.
"""
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from fairseq_localness.analysis.logs import TrainingLog, parse_log
from fairseq_localness.cli.results_runs import load_json

RUNNING_SECONDS = 600
# a log line of fairseq's whose text is a JSON record (scripts/train.sh: --log-format json;
# with --log-file, a line that starts with '{"' is the record alone)
_RECORD = re.compile(r"\|\s*INFO\s*\|\s*(train_inner|train|valid[A-Za-z0-9_]*)\s*\|\s?(\{.*)$")
_ERROR = re.compile(r"(Error|Exception|Traceback|error:|Killed|CUDA out of memory)")
STATE_ORDER = ("unreadable", "failed", "running", "queued", "stopped", "not run", "done")


class ReportError(Exception):
    """Bad input: the command line prints it on one line and exits with status 2."""


@dataclass
class Run:
    seed: Optional[int]
    dir: str            # absolute
    rel: str            # relative to the work directory
    state: str = "not run"
    why: str = ""       # failed, unreadable: the reason
    last_line: str = ""  # the log's last line (failed rows)
    log: Optional[TrainingLog] = None
    log_path: str = ""


@dataclass
class Row:
    name: str
    cells: Dict[str, str]
    entry: Dict
    runs: List[Run] = field(default_factory=list)

    @property
    def state(self) -> str:
        states = [r.state for r in self.runs] or ["not run"]
        if all(s == "done" for s in states):
            return "done"
        return min(states, key=STATE_ORDER.index)


@dataclass
class Work:
    path: str
    title: str
    layout: str
    header: List[str]
    rows: List[Row]
    notes: List[str]
    info: Dict
    seeds: List[int]


def read_json(path: str):
    return load_json(path, ReportError)


def markdown_table(path: str):
    """The first Markdown table of results.md (header, {row: {column: cell}}) and the
    lines after it (its notes)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return [], {}, []
    start = next((k for k, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return [], {}, lines
    end = next((k for k in range(start, len(lines)) if not lines[k].startswith("|")), len(lines))

    def cells(line):
        return [c.strip() for c in line.strip().strip("|").split("|")]

    header = cells(lines[start])
    rows = {}
    for line in lines[start + 2:end]:
        c = cells(line)
        rows[c[0]] = dict(zip(header, c))
    return header, rows, [line for line in lines[end:] if line.strip()]


def check_log(path: str) -> str:
    """'' for a log that reads as fairseq's, else why not (bytes that are not UTF-8
    text, NUL bytes, a JSON record cut short or damaged)."""
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        return "NUL bytes at byte %d" % data.index(b"\0")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text at byte {e.start}"
    for n, line in enumerate(text.splitlines(), start=1):
        m = _RECORD.search(line)
        record = m.group(2) if m else line if line.startswith('{"') else None
        if record is not None:
            try:
                json.loads(record)
            except ValueError:
                return f"line {n}: a training record cut short or damaged"
    return ""


def last_line(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [l.strip() for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def slurm_jobs(work: str) -> Dict[str, Dict]:
    """The jobs of a --slurm graph submitted from ``work``, by key (train:<row>:<seed>,
    eval:<row>:<seed>, prepare:<dataset>, final): their job id, log and recorded state
    ('queued' when none is recorded yet)."""
    state_dir = os.path.join(work, "slurm")
    try:
        registry = read_json(os.path.join(state_dir, "submitted.json")) or {}
    except ReportError:
        return {}
    jobs = {}
    for key, rec in registry.items():
        if not isinstance(rec, dict):
            continue
        try:
            st = read_json(os.path.join(state_dir, "jobs", re.sub(r"[^A-Za-z0-9_.+-]", "_", key) + ".json")) or {}
        except ReportError:
            st = {}
        jobs[key] = dict(rec, state=st.get("state", "queued"), message=st.get("message", ""))
    return jobs


def run_state(run: Run, done: bool, failed: Optional[str], row: str, jobs: Dict[str, Dict], now: float):
    log = os.path.join(run.dir, "train.log")
    if os.path.isfile(log):
        run.log_path = log
        damage = check_log(log)
        if damage:
            run.state, run.why = "unreadable", f"train.log: {damage}"
            return
        run.log = parse_log(log)
        run.last_line = last_line(log)
    mine = [j for k, j in jobs.items() if k.split(":")[0] in ("train", "eval")
            and k.split(":", 1)[1] == f"{row}:{run.seed}"]
    if done:
        run.state = "done"
    elif failed is not None:
        run.state, run.why = "failed", failed
    elif any(j["state"] == "failed" for j in mine):
        j = next(j for j in mine if j["state"] == "failed")
        run.state, run.why = "failed", f"job {j.get('job_id', '?')}: {j['message'] or 'failed'}"
    elif any(j["state"] == "running" for j in mine):
        run.state = "running"
    elif any(j["state"] == "queued" for j in mine):
        run.state = "queued"
    elif run.log_path:
        if _ERROR.search(run.last_line):
            run.state, run.why = "failed", "the training log ends with an error"
        elif now - os.path.getmtime(run.log_path) < RUNNING_SECONDS:
            run.state = "running"
        else:
            run.state = "stopped"


def collect(work: str) -> Work:
    """Read the work directory ``work`` (a reproduce driver's or the demo's); bad input
    (not a directory, not a work directory, no run) raises ReportError."""
    if not os.path.isdir(work):
        raise ReportError(f"WORK: {work!r} is not a directory" if os.path.exists(work)
                          else f"WORK: {work!r} does not exist")
    work = os.path.abspath(work)
    markers = [m for m in ("results.json", "results.md", "runs.tsv", "runs", "systems", "run.json")
               if os.path.exists(os.path.join(work, m))]
    if not markers:
        raise ReportError(f"WORK: {work!r} is not a work directory of a reproduce driver or the demo (expected "
                          "results.json, results.md, runs.tsv or runs/ in it)")
    result = read_json(os.path.join(work, "results.json"))
    if not isinstance(result, dict) or not isinstance(result.get("systems"), list) or not result["systems"]:
        has_runs = any(os.path.isdir(os.path.join(work, d)) and os.listdir(os.path.join(work, d))
                       for d in ("runs", "systems"))
        if has_runs:
            raise ReportError(f"WORK: {work!r} has runs but no table (results.json); write it with the driver's "
                              "--table (or fairseq-localness-results)")
        raise ReportError(f"WORK: {work!r} holds no run (results.json lists no rows and runs/ is empty)")
    header, md_rows, notes = markdown_table(os.path.join(work, "results.md"))
    info = read_json(os.path.join(work, "run.json")) or {}
    jobs = slurm_jobs(work)
    now = time.time()
    rows, seeds = [], []
    for entry in result["systems"]:
        name = entry["system"]
        row = Row(name=name, cells=md_rows.get(name, {}), entry=entry)
        for r in entry.get("runs", []):
            d = r.get("dir") or ""
            path = d if os.path.isabs(d) else os.path.normpath(os.path.join(work, d))
            run = Run(seed=r.get("seed"), dir=path, rel=os.path.relpath(path, work))
            run_state(run, bool(r.get("done")), r.get("failed"), name, jobs, now)
            row.runs.append(run)
        seeds += [s for s in entry.get("seeds", []) if s not in seeds]
        rows.append(row)
    title = result.get("title") or info.get("title") or os.path.basename(work)
    return Work(path=work, title=title, layout=result.get("layout", "demo" if "arch" in header else "reproduce"),
                header=header, rows=rows, notes=notes, info=info, seeds=seeds)
