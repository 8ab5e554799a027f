"""fairseq-localness-report (fairseq_localness/report/): the page of a work directory.

Work directories are made here as the drivers leave them: a run directory per row and
seed with a fairseq --log-file train.log and evaluate.sh's files, runs.tsv, and the
table written by the real fairseq-localness-results (results.md, results.json). The
page from a real rehearsal, a half-finished --status and the demo is checked in a
browser by tests/test_rehearse.py and tests/test_pipeline.py (tests/browser.py).
"""
import json
import os
import random
import re

import pytest

from browser import Browser, check_report_page, chromium_missing
from fairseq_localness.analysis.logs import parse_log
from fairseq_localness.cli import report as report_cli
from fairseq_localness.cli import results as results_cli
from fairseq_localness.report.collect import check_log

WORDS = "the a cat dog sat on mat house tree green big small red old new".split()


def train_log(path, updates, seed, log_file=True):
    """A fairseq-train log: the parameter count, train_inner records (loss, lr) every 10
    updates and a validation (loss, BLEU) every 50, as --log-file writes them (the
    record alone) or as stdout does (fairseq's logger prefix)."""
    def rec(kind, obj):
        text = json.dumps(obj)
        return text if log_file else f"2026-01-01 00:00:00 | INFO | {kind} | {text}"

    lines = ["{'_name': None, 'common': {'log_format': 'json'}}",
             "num. shared model params: 54,880 (num. trained: 54,880)"]
    for u in range(10, updates + 1, 10):
        lines.append(rec("train_inner", {"epoch": 1, "loss": "%.3f" % (9 - u / updates * 4 + seed * 0.1),
                                         "lr": "%.3g" % (5e-4 * min(1, u / 40)), "ups": "3.0",
                                         "num_updates": str(u)}))
        if u % 50 == 0:
            lines.append(rec("valid", {"epoch": 1, "valid_loss": "%.3f" % (8 - u / updates * 3),
                                       "valid_bleu": "%.2f" % (u / updates * 20 + seed),
                                       "valid_num_updates": str(u)}))
    lines.append(rec("train", {"epoch": 1, "train_loss": "5.0", "train_ups": "3.0",
                               "train_num_updates": str(updates)}))
    lines.append("done training in 12.5 seconds")
    path.write_text("\n".join(lines) + "\n")


def make_work(root, rows=2, seeds=(1,), updates=200, done=None, sentences=30, significance=True):
    """A reproduce driver's work directory over ``rows`` rows (row0 the baseline of the
    others) and ``seeds``: logs, translations, scores, runs.tsv, and the table by
    fairseq-localness-results (--layout reproduce, --significance unless told not to).
    ``done``: the (row, seed) that have results (default all)."""
    from sacrebleu.metrics import BLEU

    rng = random.Random(0)
    refs = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(sentences)]
    root.mkdir(parents=True, exist_ok=True)
    (root / "ref").write_text("\n".join(refs) + "\n")
    tsv = ["system\tseed\tdir\tbaseline\tpair\tmetric\tpaper_bleu\tconfig\tarch"]
    for k in range(rows):
        name = f"row{k}"
        for seed in seeds:
            run = root / "runs" / name / f"seed{seed}"
            (run / "eval").mkdir(parents=True)
            train_log(run / "train.log", updates, seed)
            if done is None or (name, seed) in done:
                r = random.Random(100 * k + seed)
                hyps = [" ".join(w if r.random() > 0.1 + 0.02 * k else "x" for w in ref.split()) for ref in refs]
                (run / "eval" / "hyp.detok").write_text("\n".join(hyps) + "\n")
                score = BLEU().corpus_score(hyps, [refs]).score
                (run / "eval" / "bleu.json").write_text(json.dumps({"score": round(score, 1)}))
            tsv.append(f"{name}\t{seed}\truns/{name}/seed{seed}\t{'' if k == 0 else 'row0'}\ten-de\tsacrebleu"
                       f"\t{27 + k / 10:.2f}\tdc_wmt14_base\t{'transformer' if k == 0 else 'dc_transformer'}")
    (root / "runs.tsv").write_text("\n".join(tsv) + "\n")
    args = results_cli.get_parser().parse_args(
        ["--runs", str(root / "runs.tsv"), "--out", str(root), "--layout", "reproduce", "--ref", str(root / "ref"),
         "--samples", "50", "--title", "A test table"] + (["--significance"] if significance else []))
    results_cli.run(args)
    return root


def tree(path):
    """Every file under path with its size and modification time."""
    out = {}
    for d, _, files in os.walk(path):
        for f in files:
            st = os.stat(os.path.join(d, f))
            out[os.path.join(d, f)] = (st.st_size, st.st_mtime_ns)
    return out


def run_cli(argv, capsys):
    code = report_cli.cli_main([str(a) for a in argv])
    return code, capsys.readouterr().err


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist"),
    ("file", "is not a directory"),
    ("not a work directory", "is not a work directory of a reproduce driver or the demo"),
    ("no run", "holds no run"),
    ("runs without a table", "has runs but no table (results.json)"),
    ("damaged results.json", "results.json: not readable as JSON"),
])
def test_bad_input_is_one_line_and_writes_nothing(case, message, tmp_path, capsys):
    work = tmp_path / "work"
    if case == "file":
        work.write_text("x\n")
    elif case != "missing":
        work.mkdir()
        (work / "report.html").write_text("the page of an earlier run\n")
        (work / "notes.txt").write_text("not a run\n")
        if case == "no run":
            (work / "runs").mkdir()
        elif case == "runs without a table":
            (work / "runs" / "row0").mkdir(parents=True)
            train_log(work / "runs" / "row0" / "train.log", 20, 1)
        elif case == "damaged results.json":
            (work / "results.json").write_text('{"systems": [{"system": "row0", "runs"')
    before = tree(tmp_path)
    code, err = run_cli([work], capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fairseq-localness-report: error: "), err
    assert message in err, err
    assert tree(tmp_path) == before


def test_an_out_that_is_a_directory_is_refused(tmp_path, capsys):
    work = make_work(tmp_path / "work", rows=2)
    before = tree(tmp_path)
    code, err = run_cli([work, "--out", work / "runs"], capsys)
    assert code == 2 and "--out:" in err and "is a directory" in err
    assert tree(tmp_path) == before


# ------------------------------------------------------------------ logs
def test_logs_written_by_fairseqs_log_file_are_read(tmp_path):
    """--log-file writes each record without the logger's prefix (the reproduce
    drivers' train.log); the records are the same as from the prefixed lines."""
    train_log(tmp_path / "bare.log", 100, 1, log_file=True)
    train_log(tmp_path / "prefixed.log", 100, 1, log_file=False)
    bare, prefixed = parse_log(str(tmp_path / "bare.log")), parse_log(str(tmp_path / "prefixed.log"))
    assert bare.records == prefixed.records
    assert [r["kind"] for r in bare.records][:6] == ["train_inner"] * 5 + ["valid"]
    assert bare.of_kind("valid")[0] == {"kind": "valid", "epoch": 1.0, "loss": 6.5, "bleu": 11.0, "num_updates": 50.0}
    assert bare.last_update == 100 and bare.params == 54880


@pytest.mark.parametrize("damage, why", [
    (lambda t: t[: t.index('"num_updates": "60"') + 10], "a training record cut short or damaged"),
    (lambda t: t.replace("num. shared", "num.\0shared"), "NUL bytes at byte"),
    (lambda t: t.encode("utf-8")[:40] + b"\xff\xfe" + t.encode("utf-8")[40:], "not UTF-8 text at byte 40"),
])
def test_a_damaged_log_marks_its_row_unreadable_and_the_page_is_written(damage, why, tmp_path, capsys):
    work = make_work(tmp_path / "work", rows=2)
    log = work / "runs" / "row1" / "seed1" / "train.log"
    damaged = damage(log.read_text())
    (log.write_bytes if isinstance(damaged, bytes) else log.write_text)(damaged)
    assert why in check_log(str(log))
    assert check_log(str(work / "runs" / "row0" / "seed1" / "train.log")) == ""
    code, err = run_cli([work], capsys)
    assert code == 0, err
    html = (work / "report.html").read_text()
    assert 'data-row="row1"' in html
    row1 = html[html.index('<tr id="row-row1"'):]
    assert 'data-state="unreadable"' in row1[:row1.index("</tr>")]
    assert re.search(r"train\.log: [^<]*" + re.escape(why), html)
    row0 = html[html.index('<tr id="row-row0"'):]
    assert 'data-state="done"' in row0[:row0.index("</tr>")]
    assert len(os.listdir(work / "report")) == 1  # row0's curves only


# ------------------------------------------------------------------ a table of 32 rows
def test_a_32_row_table_over_3_seeds(tmp_path, capsys):
    """The size target's table: every row's curves with its three seeds, the page and
    its figures under 5 MB; written again, only the curves of a changed log are drawn
    again and the old file goes."""
    work = make_work(tmp_path / "work", rows=32, seeds=(1, 2, 3), updates=500, sentences=10, significance=False)
    code, err = run_cli([work], capsys)
    assert code == 0, err
    figures = sorted(os.listdir(work / "report"))
    assert len(figures) == 32
    size = (work / "report.html").stat().st_size + sum((work / "report" / f).stat().st_size for f in figures)
    assert size < 5e6, size
    html = (work / "report.html").read_text()
    assert html.count("seeds 1, 2, 3 overlaid") == 32
    assert "96 of 96 done" in html and "3 of 3 (1 2 3)" in html
    mtimes = {f: (work / "report" / f).stat().st_mtime_ns for f in figures}
    with open(work / "runs" / "row5" / "seed2" / "train.log", "a") as f:
        f.write('{"epoch": 2, "loss": "3.9", "lr": "0.0005", "num_updates": "1010"}\n')
    code, err = run_cli([work], capsys)
    assert code == 0, err
    again = sorted(os.listdir(work / "report"))
    changed = [f for f in again if f not in mtimes]
    assert len(again) == 32 and len(changed) == 1 and changed[0].startswith("curves-row5-")
    assert all((work / "report" / f).stat().st_mtime_ns == mtimes[f] for f in again if f in mtimes)


# ------------------------------------------------------------------ in a browser
@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_a_half_finished_table_in_a_browser(tmp_path, capsys):
    """Three seeds, some not done: a failed run (its FAILED file and its log's last
    line), a stopped one, one never started; the page in chromium."""
    work = make_work(tmp_path / "work", rows=3, seeds=(1, 2),
                     done={("row0", 1), ("row0", 2), ("row1", 1), ("row2", 1)})
    (work / "runs" / "row1" / "seed2" / "FAILED").write_text("train job 7: exit status 1: CUDA out of memory\n")
    with open(work / "runs" / "row1" / "seed2" / "train.log", "a") as f:
        f.write("RuntimeError: CUDA out of memory\n")
    os.remove(work / "runs" / "row2" / "seed2" / "train.log")
    results_cli.run(results_cli.get_parser().parse_args(  # (the table again: FAILED is read with it)
        ["--runs", str(work / "runs.tsv"), "--out", str(work), "--layout", "reproduce", "--significance",
         "--ref", str(work / "ref"), "--samples", "50", "--title", "A test table"]))
    code, err = run_cli([work], capsys)
    assert code == 0, err
    with Browser() as b:
        states = check_report_page(b, str(work), str(tmp_path / "page.png"))
        page = b.open(str(work / "report.html"))
        failed = page.eval("[...document.querySelectorAll('li[data-row]')].map(li => li.textContent)")
    assert states["row0"][0] == "done" and states["row1"][0] == "failed" and states["row2"][0] == "not run"
    assert any("row1 seed 2" in t and "CUDA out of memory" in t and "its log ends: RuntimeError" in t
               for t in failed), failed
