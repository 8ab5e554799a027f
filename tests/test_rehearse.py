"""The reproduce scripts' --rehearse: every step of a real run, for real, on the CPU.

A rehearsal prepares small fakes of the raw downloads (fairseq_localness/data/fakes.py)
through prepare_data.sh (extraction, cleaning, segmentation, the subword model,
binarization), trains each selected row with its own options at a tiny size for a few
updates (two processes over gloo where the paper's batch spans several GPUs), averages
(or early-stops), decodes, scores with the paper's metric, runs the paper's
significance test and writes the results table (scripts/reproduce/rehearse.sh).

The dry runs of every script check what a rehearsal changes (the sizes only) and
what it refuses. Two rehearsals run in the normal suite: two rows of Yang et al.'s
Table 4 (WMT14 En-De from its fake archives, two processes, averaging, the paired
bootstrap) and two rows of Xu et al.'s Table 2 (early stopping on BLEU, whose
checkpoints hold numpy arrays). The full rehearsal of every script is marked slow: `make test
PYTEST_ARGS="-m slow"` runs it (dc_table2.sh's 32 rows take the longest).
"""
import json
import os
import re
import shutil

import pytest

from browser import Browser, check_report_page, chromium_missing
from conftest import REPO, run_command, tool_env
from reproduce_utils import SCRIPTS, commands, opt

REPRO = os.path.join(REPO, "scripts", "reproduce")
SIZES = {"--encoder-layers": "3", "--decoder-layers": "2", "--encoder-embed-dim": "32", "--decoder-embed-dim": "32",
         "--encoder-ffn-embed-dim": "64", "--decoder-ffn-embed-dim": "64", "--encoder-attention-heads": "2",
         "--decoder-attention-heads": "2", "--max-tokens": "128", "--save-interval-updates": "1"}


def reproduce(script, *args, timeout=120):
    return run_command(["bash", os.path.join(REPRO, script), *args], env=tool_env(), timeout=timeout)


def table_rows(results_md):
    """{row name: {column header: cell}} of the Markdown table in results.md."""
    with open(results_md, encoding="utf-8") as f:
        lines = [line for line in f.read().splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(header, cells))
    return rows


def paper_multi_gpu(train_cmd):
    """Whether the row's paper batch spans several GPUs: in the real run's command, an
    --effective-tokens above the configuration's --max-tokens."""
    tail = train_cmd[train_cmd.index("--") + 1:]
    return int(opt(train_cmd, "--effective-tokens")) > int(opt(tail, "--max-tokens"))


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_rehearsals_dry_run_changes_only_the_sizes(script, tmp_path):
    real = reproduce(script, "--dry-run", "--work-dir", tmp_path / "real")
    reh = reproduce(script, "--rehearse", "--dry-run", "--work-dir", tmp_path / "reh")
    assert real.returncode == 0 and reh.returncode == 0, real.stderr + reh.stderr
    real_cmds, reh_cmds = commands(real.stdout), commands(reh.stdout)
    # a fake of every dataset, written before it is prepared, into WORK/downloads
    fakes = [c for c in reh_cmds if c[1].endswith("/fairseq_localness/data/fakes.py")]
    preps = [c for c in reh_cmds if c[1].endswith("/prepare_data.sh")]
    assert sorted(c[2] for c in fakes) == sorted({opt(c, "--dataset") for c in preps})
    for c in fakes:
        assert c[3] == str(tmp_path / "reh" / "downloads" / c[2]) and opt(c, "--scale") == "100"
    for c in preps:
        assert opt(c, "--raw-dir") == str(tmp_path / "reh" / "downloads" / opt(c, "--dataset"))
        assert opt(c, "--out").startswith(str(tmp_path / "reh" / "data") + "/") and opt(c, "--bpe-size") == "100"
    # the same steps in the same order, row by row
    step = [os.path.basename(c[1]) for c in real_cmds]
    assert [os.path.basename(c[1]) for c in reh_cmds if c not in fakes] == step
    real_train = [c for c in real_cmds if c[1].endswith("/train.sh")]
    reh_train = [c for c in reh_cmds if c[1].endswith("/train.sh")]
    assert len(real_train) == len(reh_train) > 0
    for r, h in zip(real_train, reh_train):
        # the real run's options, in the same order, with the sizes after the
        # configuration's recipe (the later value wins in fairseq); the validation
        # interval of early stopping follows the checkpoint interval; other log file
        tail_r, tail_h = r[r.index("--") + 1:], h[h.index("--") + 1:]
        start = tail_h.index("--encoder-layers")
        added = tail_h[start:start + 2 * len(SIZES) + 2]
        assert added[-2:] == ["--keep-interval-updates", opt(h, "--keep-interval-updates")]
        kept = tail_h[:start] + tail_h[start + len(added):]
        for cmd in (kept, tail_r):
            if "--validate-interval-updates" in cmd:
                cmd[cmd.index("--validate-interval-updates") + 1] = "N"
        assert kept[:-2] == tail_r[:-2] and kept[-2] == "--log-file"
        for name, value in SIZES.items():
            assert opt(h, name) == value, (name, h)
        assert opt(h, "--arch") == opt(r, "--arch")
        assert int(opt(h, "--max-update")) == int(opt(h, "--keep-interval-updates")) + 1
        # two CPU processes exactly where the paper's batch spans several GPUs
        procs = opt(h, "--gpus") if "--gpus" in h else "1"
        assert "--cpu" in h and procs == ("2" if paper_multi_gpu(r) else "1"), h
    for c in reh_cmds:
        if c[1].endswith("/evaluate.sh"):
            assert c[-1] == "--cpu"


@pytest.mark.parametrize("args, message", [
    (["--raw-dir", "/tmp/x"], "--rehearse and --raw-dir"),
    (["--data-dir", "/tmp/x"], "--rehearse and --data-dir"),
    (["--download"], "--rehearse and --download"),
    (["--max-tokens", "100"], "--rehearse and --max-tokens"),
    (["--cpu"], "--rehearse and --cpu"),
])
def test_a_rehearsal_refuses_what_it_decides_itself(args, message, tmp_path):
    p = reproduce("dc_table1.sh", "--rehearse", "--dry-run", "--work-dir", tmp_path, *args)
    assert p.returncode == 2 and message in p.stderr and p.stdout == "", p.stderr
    assert not os.path.exists(tmp_path / "downloads")


def check_rehearsal(script, work, proc, rows):
    """Every selected row trained, averaged (or early-stopped), decoded and scored; the
    significance test of each row with a baseline where the table has one."""
    assert proc.returncode == 0, proc.stderr[-4000:]
    table = table_rows(os.path.join(work, "results.md"))
    assert set(rows) <= set(table)
    for name in rows:
        run = os.path.join(work, "runs", name)
        assert re.fullmatch(r"-?\d+\.\d\d", table[name]["our BLEU"]), (name, table[name])
        with open(os.path.join(run, "eval", "bleu.json")) as f:
            assert 0 <= json.load(f)["score"] <= 100
        ckpts = [f for f in os.listdir(run) if f.startswith("checkpoint_avg_last") or f == "checkpoint_best.pt"]
        assert ckpts, os.listdir(run)
        with open(os.path.join(run, "SYSTEM")) as f:
            system = f.read()
        assert "--encoder-layers 3" in system and "--encoder-embed-dim 32" in system
    # the paper's significance test: a p-value for the rows tested against a baseline
    for column in ("p (paired bootstrap)", "p (compare-mt)"):
        cells = [table[name][column] for name in rows if column in table[name]]
        if cells:
            assert any(re.search(r"\d", c) for c in cells), (column, cells)
    return table


YANG_ROWS = ["en-de.base", "en-de.base+localness"]


@pytest.fixture(scope="module")
def yang_rehearsal(tmp_path_factory):
    """Two rows of Yang et al.'s Table 4 rehearsed once for this module's tests: the
    work directory and the driver's process."""
    work = str(tmp_path_factory.mktemp("yang") / "work")
    p = reproduce("yang2018_table4.sh", "--rehearse", "--work-dir", work, "--only", " ".join(YANG_ROWS), timeout=840)
    return work, p


@pytest.mark.timeout(900)
def test_rehearsal_of_two_rows_runs_every_step(yang_rehearsal):
    """Yang et al.'s Table 4, the En-De Transformer-Base and its localness row: WMT14's
    fake archives prepared with Moses and subword-nmt, two training processes each (the
    paper's 8 x 4096 tokens), the average of the last 5 checkpoints, NIST BLEU and the
    tokenized, compound-split BLEU, the paired bootstrap against the baseline; the
    page of the table (report.html) and each training's TensorBoard event files."""
    work, p = yang_rehearsal
    rows = YANG_ROWS
    table = check_rehearsal("yang2018_table4.sh", work, p, rows)
    assert "--nproc_per_node 2" in p.stderr and "--distributed-backend gloo" in p.stderr
    assert re.fullmatch(r"\d+\.\d\d", table["en-de.base+localness"]["tok. BLEU, compound split (extra)"])
    assert os.path.exists(os.path.join(work, "runs", "en-de.base", "checkpoint_avg_last5.pt"))
    with open(os.path.join(work, "runs", "en-de.base+localness", "paired_bs", "paired_bs.json")) as f:
        assert "p" in json.dumps(json.load(f))
    prepared = [d for d in os.listdir(os.path.join(work, "data")) if d.startswith("wmt14_en_de")]
    assert len(prepared) == 1 and os.path.exists(os.path.join(work, "data", prepared[0], "PREPARED"))
    assert "rehearsal" in open(os.path.join(work, "results.md"), encoding="utf-8").read()
    assert f"fairseq-localness-report: wrote {work}/report.html" in p.stderr
    for name in rows:
        events = os.path.join(work, "runs", name, "tensorboard", "valid")
        assert any(f.startswith("events.out.tfevents.") for f in os.listdir(events)), name
    with open(os.path.join(work, "run.json"), encoding="utf-8") as f:
        run = json.load(f)
    assert run["command"].endswith(f"yang2018_table4.sh --rehearse --work-dir {work} --only en-de.base\\ "
                                   "en-de.base+localness")
    assert run["driver"] == "yang2018_table4" and run["hardware"].startswith("a rehearsal on the CPU; ")


@pytest.mark.timeout(300)
@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_the_rehearsals_page_in_a_browser(yang_rehearsal, tmp_path):
    """The page of the rehearsal in chromium: the numbers of results.json, the rows not
    run shown as such, each trained row's curves loaded."""
    work, _ = yang_rehearsal
    with Browser() as b:
        states = check_report_page(b, work, str(tmp_path / "page.png"))
        page = b.open(os.path.join(work, "report.html"))
        curves = page.eval("[...document.querySelectorAll('figure[id^=curves-] img')].map(i => i.naturalWidth)")
        run = page.eval("document.querySelector('dl.run').textContent")
    assert {n for n, (s, _) in states.items() if s == "done"} == set(YANG_ROWS)
    assert all(s == "not run" for n, (s, _) in states.items() if n not in YANG_ROWS) and len(states) == 14
    assert len(curves) == 2 and all(w > 0 for w in curves)
    assert "2 of 14 done" in run and "yang2018_table4" in run


@pytest.mark.timeout(300)
@pytest.mark.skipif(chromium_missing() is not None, reason=str(chromium_missing()))
def test_status_writes_the_page_of_a_half_finished_graph(yang_rehearsal, tmp_path):
    """--status of a --slurm graph (its records as the jobs leave them, SLURM's commands
    standing in on PATH) writes the table and the page: a running row, a failed one
    with its reason and its log's last line, queued ones."""
    src, _ = yang_rehearsal
    work = str(tmp_path / "work")
    shutil.copytree(src, work, ignore=shutil.ignore_patterns("*.pt", "downloads"))
    for f in ("report.html", "results.md", "results.json"):
        os.remove(os.path.join(work, f))
    base, loc = (os.path.join(work, "runs", n) for n in YANG_ROWS)
    os.remove(os.path.join(loc, "eval", "bleu.json"))  # localness: failed in its evaluation
    with open(os.path.join(loc, "train.log"), "a") as f:
        f.write("RuntimeError: a test failure\n")
    state = os.path.join(work, "slurm")
    os.makedirs(os.path.join(state, "jobs"))
    registry = {"train:en-de.base:1": ("101", "done"), "eval:en-de.base:1": ("102", "done"),
                "train:en-de.base+localness:1": ("103", "done"), "eval:en-de.base+localness:1": ("104", "failed"),
                "train:en-de.big:1": ("105", "running"), "train:en-de.big+localness:1": ("106", None)}
    with open(os.path.join(state, "submitted.json"), "w") as f:
        json.dump({k: {"job_id": j, "kind": k.split(":")[0], "row": k.split(":")[1], "seed": "1",
                       "log": os.path.join(state, "logs", j + "_0_log.err")} for k, (j, _) in registry.items()}, f)
    for key, (job, st) in registry.items():
        if st:
            with open(os.path.join(state, "jobs", key.replace(":", "_") + ".json"), "w") as f:
                json.dump({"state": st, "job_id": job, "message": "exit status 1: a test failure"
                           if st == "failed" else ""}, f)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in ("sbatch", "scontrol", "scancel", "sinfo"):
        (bin_dir / cmd).write_text("#!/bin/sh\nexit 0\n")
    from fairseq_localness.slurm.cluster import job_prefix

    prefix = job_prefix(state)  # (the jobs' names as submitted from this work directory: id, state, restarts, name)
    (bin_dir / "squeue").write_text(f"#!/bin/sh\necho '105 RUNNING 0 {prefix}train_en-de.big_1 None'\n"
                                    f"echo '106 PENDING 0 {prefix}train_en-de.big_localness_1 Priority'\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = tool_env({"PATH": f"{bin_dir}:{tool_env()['PATH']}"})
    p = run_command(["bash", os.path.join(REPRO, "yang2018_table4.sh"), "--rehearse", "--work-dir", work,
                     "--status"], env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "en-de.big seed 1: running" in p.stdout
    assert f"fairseq-localness-report: wrote {work}/report.html" in p.stderr
    with Browser() as b:
        states = check_report_page(b, work, str(tmp_path / "page.png"))
        page = b.open(os.path.join(work, "report.html"))
        failed = page.eval("[...document.querySelectorAll('li[data-row]')].map(li => li.textContent)")
    assert states["en-de.base"][0] == "done" and states["en-de.base+localness"][0] == "failed"
    assert states["en-de.big"][0] == "running" and states["en-de.big+localness"][0] == "queued"
    assert states["zh-en.base"][0] == "not run"
    assert any("en-de.base+localness" in t and "a test failure" in t and "its log ends: RuntimeError" in t
               for t in failed), failed


@pytest.mark.timeout(600)
def test_rehearsal_of_rows_that_early_stop_on_bleu(tmp_path):
    """Xu et al.'s Table 2, WAT17 Ja-En's transformer and hybrid-gate rows: trained with
    --eval-bleu and --best-checkpoint-metric bleu (numpy arrays of BLEU statistics in
    every checkpoint), decoded from checkpoint_best.pt, the paired bootstrap."""
    work = str(tmp_path / "work")
    rows = ["ja-en.transformer", "ja-en.hybrid_gate"]
    p = reproduce("xu2019_table2.sh", "--rehearse", "--work-dir", work, "--only", " ".join(rows), timeout=540)
    table = check_rehearsal("xu2019_table2.sh", work, p, rows)
    for name in rows:
        run = os.path.join(work, "runs", name)
        assert os.path.exists(os.path.join(run, "checkpoint_best.pt"))
        assert not [f for f in os.listdir(run) if f.startswith("checkpoint_avg")]
    assert "--best-checkpoint-metric bleu" in p.stderr and "--eval-bleu" in p.stderr
    assert re.fullmatch(r"\d\.\d{3}|<0\.001", table["ja-en.hybrid_gate"]["p (paired bootstrap)"])


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("script", SCRIPTS)
def test_full_rehearsal_of_every_script(script, tmp_path):
    work = str(tmp_path / "work")
    listed = reproduce(script, "--list")
    rows = [line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip()]
    p = reproduce(script, "--rehearse", "--work-dir", work, timeout=7000)
    check_rehearsal(script, work, p, rows)
