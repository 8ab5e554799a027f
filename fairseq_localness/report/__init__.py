"""One page per table: ``WORK/report.html``, what a reproduce driver's run (or the
demo) found, readable in any browser, offline.

    fairseq-localness-report WORK [--out FILE]

The page holds the run (the driver and its paper, the command that made it, the commit,
the start, the hardware, the wall time, seeds n of N), the table as ``results.md`` has
it with the paper's value next to ours in each cell that has both, the difference, the
significance mark against the row's baseline, each row's state (done, failed with why
and its log's last line, running, queued, stopped, not run, unreadable) and links to
its train.log, checkpoints, hypotheses and configuration; each row's learning curves
(train and valid loss, valid BLEU where the run validates on it, the learning rate,
against updates; seeds overlaid); the paper's figures that ``fairseq-localness-analysis``
made in ``WORK/analysis/<tool>/`` (or, for a figure not made yet, which rows it needs
and whether they ran); and how to rerun it all.

It is written at the end of every reproduce driver's run, by the ``--table`` of a
``--slurm`` graph's last job, by every ``--status``, and at the end of ``make demo``
(``runs/demo/report.html``). It needs nothing from the network: the style is inline,
there is no script, and the figures are PNG files in ``WORK/report/`` linked
relatively (the page and its folder can be copied off a cluster together).

Bad input (WORK missing, not a work directory, holding no run, a damaged results.json)
is one line on stderr and exit status 2, and nothing is written. A damaged or truncated
train.log marks its row "unreadable"; the page is still written.

The parts: :mod:`~fairseq_localness.report.collect` (reading WORK),
:mod:`~fairseq_localness.report.figures` (matplotlib), :mod:`~fairseq_localness.report.page`
(the HTML); :mod:`fairseq_localness.cli.report` is the command line.
"""
import json
import os
import platform
import subprocess
import time
from typing import List, Optional

from fairseq_localness.atomic import write_text
from fairseq_localness.report.collect import ReportError, collect

__all__ = ["ReportError", "write_report", "record_run"]


def write_report(work_dir: str, out: Optional[str] = None, driver: Optional[str] = None) -> str:
    """Write WORK/report.html (or ``out``) and its figures; return its path."""
    from fairseq_localness.report import figures, page

    work = collect(work_dir)
    out = out or os.path.join(work.path, "report.html")
    if os.path.isdir(out):
        raise ReportError(f"--out: {out!r} is a directory; expected a file name")
    driver = driver or work.info.get("driver") or ("demo" if work.layout == "demo" else "")
    now = time.time()
    curves = figures.curves(work)
    paper = figures.paper_figures(work, driver)
    text = page.render(work, curves, paper, driver, now)
    write_text(out, text)
    return out


def _command_output(cmd: List[str], cwd: Optional[str] = None) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return p.stdout.strip() if p.returncode == 0 else ""


def hardware(devices: str) -> str:
    """What the run is given (the driver's words, e.g. '8 GPU(s)'), and this machine:
    its CPU model and core count, its GPUs (nvidia-smi, where there is one)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            cpu = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), cpu)
    except OSError:
        pass
    gpus = [l.split(" (UUID")[0] for l in _command_output(["nvidia-smi", "-L"]).splitlines() if l.strip()]
    text = f"{devices}; " if devices else ""
    text += f"{platform.node()}: {os.cpu_count()} x {cpu}"
    if gpus:
        text += f"; {len(gpus)} GPU(s): " + ", ".join(sorted(set(g.split(": ", 1)[-1] for g in gpus)))
    return text


def record_run(work_dir: str, command: str, driver: str, title: str = "", devices: str = "",
               driver_path: str = "", table_args: str = "") -> str:
    """WORK/run.json: what the page's "The run" shows (the command, the commit, the
    start, the hardware), written when a run starts."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    commit = _command_output(["git", "rev-parse", "HEAD"], cwd=repo)
    if commit and _command_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo):
        commit += " (with uncommitted changes)"
    now = time.time()
    info = {"command": command, "driver": driver, "title": title, "driver_path": driver_path,
            "table_args": table_args, "repo": repo, "commit": commit or "-",
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now)), "started_epoch": now,
            "hardware": hardware(devices)}
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, "run.json")
    write_text(path, json.dumps(info, indent=1) + "\n")
    return path
