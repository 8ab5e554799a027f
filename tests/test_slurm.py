"""--slurm of the reproduce drivers and of train.sh, through a real SLURM cluster.

The cluster is the one-machine cluster of scripts/slurm/local_cluster.sh (Debian's
slurm-wlm and munge, slurmctld and slurmd as root): .ci/run starts it before the tests;
the fixture starts it where it is not running, and the tests are skipped, with the
reason, only where it cannot start (not root, no apt). Jobs are submitted through
submitit with the CPU fakes of --rehearse and tiny models; nothing of SLURM is mocked.

- a driver's --rehearse --slurm end to end: every row a job, the table the same as the
  local rehearsal's; a second --slurm submits nothing; --status says done with BLEU;
  then a second seed of the same rows (only its jobs submitted), one run failing: failed
  in --status with its log's last line, the other runs finish, the table over the seeds
  marks it;
- --cancel; --dry-run prints the graph and submits nothing;
- scontrol requeue of a training job mid-run: it resumes from its checkpoint; beside it,
  a job whose --time is shorter than its training is requeued and finishes;
- a two-task job (--gpus-per-node 2 --cpu) trains through srun over gloo;
- bad input: one line, exit status 2, nothing submitted;
- a graph held in the queue (nothing trains): --status with the submission's options, a
  local run of a queued row refused, a second submission with another --only (the table
  waits for both), a failing squeue first on PATH, --cancel --only; the same of train.sh;
  a row whose eval/ is gone is submitted again;
- units without the cluster: SLURM's states in words, a failing, silent or garbled
  squeue, every --slurm-arg key the graph sets, train.sh's one trainer per run directory.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import BIN_DIR, REPO, TINY_MODEL_ARGS, run_command, tool_env
from test_rehearse import table_rows

CLUSTER = os.path.join(REPO, "scripts", "slurm", "local_cluster.sh")
REPRO = os.path.join(REPO, "scripts", "reproduce")
TRAIN = os.path.join(REPO, "scripts", "train.sh")
ROWS = "transformer enc-dc"  # Ampomah et al.'s Table 1: one process each, the compare-mt test


@pytest.fixture(scope="module")
def cluster():
    up = subprocess.run(["bash", CLUSTER, "status"], capture_output=True, text=True)
    if up.returncode != 0:
        if os.geteuid() != 0:
            pytest.skip("no SLURM cluster running and not root: scripts/slurm/local_cluster.sh start needs root")
        p = subprocess.run(["bash", CLUSTER, "start"], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            pytest.skip(f"the local SLURM cluster cannot start: {p.stderr.strip()[-300:]}")
    return True


def driver(*args, timeout=180, env=None):
    return run_command(["bash", os.path.join(REPRO, "dc_table1.sh"), *map(str, args)],
                       env=tool_env(env), timeout=timeout)


def squeue_ids(name_part=""):
    p = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True)
    return [line.split()[0] for line in p.stdout.splitlines() if name_part in line]


def wait_for(predicate, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_jobs(work, timeout=300):
    """Until none of the jobs submitted from WORK is queued or running."""
    with open(os.path.join(work, "slurm", "submitted.json")) as f:
        ids = {r["job_id"] for r in json.load(f).values()}
    wait_for(lambda: not ids & set(squeue_ids()), timeout, f"jobs {sorted(ids)}")


def status_lines(work, *extra):
    p = driver("--rehearse", "--status", "--work-dir", work, "--only", ROWS, *extra)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def failing_pipeline(tmp_path, run):
    """REPRODUCE_PIPELINE_DIR: the pipeline's steps, with a train.sh that fails for the run
    directory runs/`run`."""
    d = tmp_path / "pipeline"
    d.mkdir()
    for name in os.listdir(os.path.join(REPO, "scripts")):  # the steps and what they source
        if name != "train.sh":
            os.symlink(os.path.join(REPO, "scripts", name), d / name)
    (d / "train.sh").write_text(f'#!/usr/bin/env bash\nif [[ " $* " == *"/runs/{run} "* ]]; then\n'
                                f'    echo "train.sh: error: a failure of {run} for the test" >&2; exit 3\nfi\n'
                                f'exec bash {TRAIN} "$@"\n')
    return str(d)


def first_table(results_md):
    """{row: {column: cell}} of the first table of results.md (with --seeds the per-seed
    table follows)."""
    rows, header = {}, None
    for line in open(results_md, encoding="utf-8").read().split("\n\n")[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if header is None:
            header = cells
        elif not line.startswith("|--"):
            rows[cells[0]] = dict(zip(header, cells))
    return rows


@pytest.mark.timeout(800)
def test_a_rehearsal_through_slurm_gives_the_local_table_then_a_failing_seed_is_marked_failed_and_the_others_finish(
        cluster, tmp_path):
    local, remote = str(tmp_path / "local"), str(tmp_path / "slurm")
    p = driver("--rehearse", "--slurm", "--work-dir", remote, "--only", ROWS, "--time", "10", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "6 job(s) submitted" in p.stderr, p.stderr
    # the driver returns as soon as the graph is queued: the table's job, which waits for
    # every other, is still in the queue
    with open(os.path.join(remote, "slurm", "submitted.json")) as f:
        assert json.load(f)["final"]["job_id"] in squeue_ids()
    # the local rehearsal while the cluster runs the jobs (the suite's time: the two share
    # the cores, so these times are not the scheduler's overhead: docs/slurm.md measures it)
    t0 = time.time()
    p = driver("--rehearse", "--work-dir", local, "--only", ROWS, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    t_local = time.time() - t0
    wait_jobs(remote)
    print(f"rehearsal of {ROWS}, side by side: {t_local:.0f} s locally, {time.time() - t0:.0f} s until SLURM's "
          "last job ended")
    mine, theirs = table_rows(os.path.join(local, "results.md")), table_rows(os.path.join(remote, "results.md"))
    for row in ROWS.split():
        for column in ("our BLEU", "delta", "tok. BLEU, compound split (extra)", "our params", "p (compare-mt)"):
            assert theirs[row][column] == mine[row][column], (row, column, theirs[row], mine[row])
        assert re.fullmatch(r"\d+\.\d\d", theirs[row]["our BLEU"])
    lines = status_lines(remote)
    assert len(lines) == 3, lines
    for row in ROWS.split():
        line = next(x for x in lines if x.startswith(row + " seed 1:"))
        assert re.match(rf"{row} seed 1: done; jobs \d+ \d+ \d+; update 6; BLEU \d+\.\d\d; log /", line), line
    assert lines[-1].startswith("table: done; job ")
    # a second --slurm submits nothing: every job is done
    p = driver("--rehearse", "--slurm", "--work-dir", remote, "--only", ROWS, "--time", "10")
    assert p.returncode == 0 and "0 job(s) submitted" in p.stderr, p.stderr[-2000:]
    # outputs decide, not records: a row whose eval/ is gone is not "queued", and is submitted again
    eval_dir = os.path.join(remote, "runs", "transformer", "eval")
    shutil.move(eval_dir, str(tmp_path / "eval-moved"))
    line = status_lines(remote)[0]
    assert line.startswith("transformer seed 1: incomplete (its jobs ended, its score is missing"), line
    p = driver("--rehearse", "--slurm", "--dry-run", "--work-dir", remote, "--only", ROWS)
    assert re.findall(r"^job (\S+) \(", p.stdout, re.M) == ["train:transformer:1", "eval:transformer:1", "final"], \
        p.stdout
    shutil.move(str(tmp_path / "eval-moved"), eval_dir)

    # a second seed of the same rows (the finished runs above are their seed 1): enc-dc's
    # second seed fails to train; the three other runs finish and the table over the seeds
    # says what failed. (A fresh graph of two seeds, 10 jobs, is the dry run of
    # test_dry_run_prints_the_graph_and_cancel_cancels.)
    work = remote
    env = {"REPRODUCE_PIPELINE_DIR": failing_pipeline(tmp_path, "enc-dc/seed2")}
    p = driver("--rehearse", "--slurm", "--seeds", "2", "--work-dir", work, "--only", ROWS, "--time", "10", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "5 job(s) submitted" in p.stderr, p.stderr[-3000:]
    wait_jobs(work, timeout=400)
    lines = status_lines(work, "--seeds", "2")
    assert len(lines) == 5, lines
    for run in ("transformer seed 1", "transformer seed 2", "enc-dc seed 1"):
        line = next(x for x in lines if x.startswith(run + ":"))
        assert re.match(rf"{run}: done; jobs \d+ \d+ \d+; update 6; BLEU \d+\.\d\d; log /", line), line
    bad = next(x for x in lines if x.startswith("enc-dc seed 2:"))
    assert re.match(r"enc-dc seed 2: failed \(train job \d+: exit status 3: train\.sh: error: a failure of "
                    r"enc-dc/seed2 for the test\); jobs \d+ \d+ \d+; update -; BLEU -; log /\S+_log\.err$", bad), bad
    assert lines[-1].startswith("table: done; job ")
    table = first_table(os.path.join(work, "results.md"))
    assert table["enc-dc"]["seeds"] == "1 of 2, 1 failed" and table["transformer"]["seeds"] == "2 of 2", table
    assert re.fullmatch(r"\d+\.\d\d", table["enc-dc"]["our BLEU"]), table
    assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", table["transformer"]["our BLEU"]), table
    text = open(os.path.join(work, "results.md"), encoding="utf-8").read()
    assert re.search(r"^failed: enc-dc seed 2: train job \d+: exit status 3: train\.sh: error: a failure", text,
                     re.M), text
    assert re.search(r"^\| enc-dc \| 2 \| - \| failed \|", text, re.M), text
    # its evaluation never ran: cancelled with its failed dependency
    with open(os.path.join(work, "slurm", "submitted.json")) as f:
        reg = json.load(f)
    assert not os.path.exists(os.path.join(work, "slurm", "jobs", "eval_enc-dc_2.json"))
    assert reg["train:enc-dc:2"]["job_id"] not in squeue_ids()
    # a second --slurm submits only the failed run's jobs and the table again
    p = driver("--rehearse", "--slurm", "--seeds", "2", "--work-dir", work, "--only", ROWS, "--time", "10",
               "--dry-run", env=env)
    assert p.returncode == 0, p.stderr
    jobs = re.findall(r"^job (\S+) \(", p.stdout, re.M)
    assert jobs == ["train:enc-dc:2", "eval:enc-dc:2", "final"], p.stdout


def test_dry_run_prints_the_graph_and_cancel_cancels(cluster, tmp_path):
    work = str(tmp_path / "work")
    before = set(squeue_ids())
    p = driver("--rehearse", "--slurm", "--dry-run", "--work-dir", work, "--only", ROWS, "--nodes", "1",
               "--cpus-per-task", "1", "--time", "0:05:00", "--max-running", "1", "--slurm-arg", "comment=x")
    assert p.returncode == 0, p.stderr
    assert set(squeue_ids()) == before and not os.path.exists(work)
    jobs = re.findall(r"^job (\S+) \((\w+)\): (.*)$", p.stdout, re.M)
    assert [j[0] for j in jobs] == ["prepare:wmt14_en_de", "train:transformer:1", "eval:transformer:1",
                                    "train:enc-dc:1", "eval:enc-dc:1", "final"]
    train = dict(j[::2] for j in jobs)["train:transformer:1"]
    assert "cpus-per-task=1" in train and "time=5" in train and "comment=x" in train
    assert "dependency=afterok:<prepare:wmt14_en_de>,singleton" in train
    assert "afterany:" in dict(j[::2] for j in jobs)["final"]
    assert re.search(r"^    bash \S+/train\.sh .* --slurm-task ", p.stdout, re.M)
    # --seeds 2: a train and an eval job per row and seed, one prepare job, the table after all
    p = driver("--rehearse", "--slurm", "--dry-run", "--seeds", "2", "--work-dir", work, "--only", ROWS)
    assert p.returncode == 0, p.stderr
    jobs = re.findall(r"^job (\S+) \((\w+)\): (.*)$", p.stdout, re.M)
    assert [j[0] for j in jobs] == ["prepare:wmt14_en_de"] + [f"{k}:{row}:{seed}" for seed in (1, 2)
                                                              for row in ROWS.split() for k in ("train", "eval")] \
        + ["final"], p.stdout
    assert dict(j[::2] for j in jobs)["eval:enc-dc:2"].endswith("dependency=afterok:<train:enc-dc:2>")
    assert dict(j[::2] for j in jobs)["final"].count(":<") == 9
    table = re.findall(r"^    (bash \S+/dc_table1\.sh .*--table)$", p.stdout, re.M)
    assert len(table) == 1 and " --seeds 2 " in table[0] and table[0].count("--work-dir") == 1, table
    assert not os.path.exists(work)
    assert not os.path.exists(work)


def fake_squeue(tmp_path, script):
    """A directory to put first on PATH whose squeue is `script` (sh)."""
    d = tmp_path / "fake-bin"
    d.mkdir(exist_ok=True)
    (d / "squeue").write_text("#!/bin/sh\n" + script + "\n")
    (d / "squeue").chmod(0o755)
    return {"PATH": f"{d}{os.pathsep}{tool_env()['PATH']}"}


def dependency_of(job):
    p = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True)
    return re.search(r"Dependency=(\S+)", p.stdout).group(1)


@pytest.mark.timeout(300)
def test_queued_jobs_one_trainer_per_run_and_cancel_of_the_selected_rows(cluster, tmp_path):
    # jobs held in the queue (to start in an hour): nothing trains, every check reads the queue
    work = str(tmp_path / "work")
    held = ["--rehearse", "--slurm", "--work-dir", work, "--time", "10", "--slurm-arg", "begin=now+3600"]
    p = driver(*held, "--only", "transformer")
    assert p.returncode == 0 and "4 job(s) submitted" in p.stderr, p.stderr
    with open(os.path.join(work, "slurm", "submitted.json")) as f:
        first = {k: r["job_id"] for k, r in json.load(f).items()}
    try:
        # the submitted command with --status appended; "queued" only for what the queue holds
        p = driver(*held, "--only", "transformer", "--status")
        assert p.returncode == 0, p.stderr
        jobs = " ".join(first[k] for k in ("prepare:wmt14_en_de", "train:transformer:1", "eval:transformer:1"))
        assert p.stdout.startswith(f"transformer seed 1: queued (waiting for its start time); jobs {jobs}; update -; "
                                   "BLEU -; log /"), p.stdout
        # a local run of the row refuses, naming the job; nothing of the row is written
        p = driver("--rehearse", "--work-dir", work, "--only", "transformer")
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith(
            f"dc_table1.sh: error: row 'transformer' seed 1: its prepare job {first['prepare:wmt14_en_de']} is queued "
            "on the cluster"), p.stderr
        assert os.listdir(os.path.join(work, "runs", "transformer")) == ["SYSTEM"]  # (written by the submission)
        # a second submission of another row: the table waits for both rows' jobs
        p = driver(*held, "--only", "enc-dc")
        assert p.returncode == 0 and "3 job(s) submitted, 1 queued" in p.stderr, p.stderr
        with open(os.path.join(work, "slurm", "submitted.json")) as f:
            reg = {k: r["job_id"] for k, r in json.load(f).items()}
        assert first["final"] not in squeue_ids() and reg["final"] != first["final"]
        needs = set(re.findall(r"(\d+)", dependency_of(reg["final"])))
        assert needs == {reg[k] for k in reg if k != "final"}, (needs, reg)
        # a queue that fails: one line, nothing submitted, cancelled or recorded (a silent or garbled
        # one: test_a_queue_that_fails_times_out_or_answers_garbage_is_one_line)
        before = (set(squeue_ids()), open(os.path.join(work, "slurm", "submitted.json")).read())
        env = fake_squeue(tmp_path, 'echo "squeue: error: Socket timed out on send/recv operation" >&2; exit 1')
        for mode in ("--slurm", "--status", "--cancel"):
            p = driver(*held, "--only", ROWS, mode, env=env)
            assert p.returncode == 1 and p.stderr.splitlines()[-1].startswith(
                "dc_table1.sh: error: squeue failed (exit status 1: squeue: error: Socket timed out"), (mode, p.stderr)
            assert "Traceback" not in p.stderr and p.stdout == ""
        assert (set(squeue_ids()), open(os.path.join(work, "slurm", "submitted.json")).read()) == before
        # --cancel cancels what --only selects, and says what
        p = driver("--rehearse", "--cancel", "--work-dir", work, "--only", "transformer")
        assert p.returncode == 0 and p.stdout.startswith(
            f"dc_table1.sh: cancelled 2 job(s): train:transformer:1 (job {reg['train:transformer:1']}), "
            f"eval:transformer:1 (job {reg['eval:transformer:1']}); 4 job(s) of other rows left"), p.stdout
        assert {reg[k] for k in reg if "transformer" not in k} <= set(squeue_ids())
        lines = status_lines(work)
        assert lines[0].startswith(f"transformer seed 1: cancelled (train job {reg['train:transformer:1']}); "), lines
        assert lines[1].startswith("enc-dc seed 1: queued"), lines
        p = driver("--rehearse", "--cancel", "--work-dir", work, "--only", "enc-dc")
        assert p.stdout.startswith("dc_table1.sh: cancelled 4 job(s): ") and "left" not in p.stdout, p.stdout
        assert sorted(re.findall(r"(\S+) \(job (\d+)\)", p.stdout)) == sorted(
            (k, reg[k]) for k in ("prepare:wmt14_en_de", "train:enc-dc:1", "eval:enc-dc:1", "final")), p.stdout
        assert not set(reg.values()) & set(squeue_ids())
    finally:
        with open(os.path.join(work, "slurm", "submitted.json")) as f:  # (only this test's jobs)
            ours = set(first.values()) | {r["job_id"] for r in json.load(f).values()}
        if ours & set(squeue_ids()):
            subprocess.run(["scancel", *(ours & set(squeue_ids()))], capture_output=True)


@pytest.mark.parametrize("args, message", [
    (["--slurm", "--partition", "nosuch"], "dc_table1.sh: error: --partition: unknown partition 'nosuch'; "
                                           "this cluster's: debug"),
    (["--slurm", "--time", "1"], "dc_table1.sh: error: --time 1: too short for one validation"),
    (["--slurm", "--gpus", "4", "--gpus-per-node", "2"], "dc_table1.sh: error: --gpus 4 and --nodes 1 "
                                                          "--gpus-per-node 2: conflicting GPU counts"),
    (["--slurm", "--time", "soon"], "dc_table1.sh: error: --time: expected a SLURM time"),
    (["--slurm", "--slurm-arg", "dependency=afterok:1"], "dc_table1.sh: error: --slurm-arg dependency=...: "
                                                         "sbatch's --dependency is set by the job graph itself"),
    (["--slurm", "--time", "99999999999"], "dc_table1.sh: error: --time: 99999999999 minutes is past SLURM's "
                                           "largest time limit"),
    (["--slurm", "--seeds", "300"], "dc_table1.sh: error: --slurm: up to 602 jobs (1 row(s) x 300 seed(s)"),
    (["--slurm", "--only", "nosuch"], "dc_table1.sh: error: --only: no row 'nosuch'"),
    (["--slurm", "--work-dir", "a\nb"], "dc_table1.sh: error: --work-dir: 'a\\nb' has a line break"),
    (["--partition", "debug"], "dc_table1.sh: error: --partition: only with --slurm"),
])
def test_bad_input_is_one_line_before_anything_is_submitted(cluster, tmp_path, args, message):
    before = set(squeue_ids())
    p = driver("--rehearse", "--work-dir", tmp_path / "w", "--only", "transformer", *args)
    assert p.returncode == 2 and p.stderr.startswith(message) and p.stderr.count("\n") == 1, p.stderr
    assert set(squeue_ids()) == before


def test_no_slurm_commands_on_path(tmp_path):
    bindir = tmp_path / "bin"  # the system's commands without SLURM's
    bindir.mkdir()
    for name in os.listdir("/usr/bin"):
        if not re.fullmatch(r"s(batch|queue|control|cancel|info|run|alloc|acct|attach|stat|share|prio|report)", name):
            os.symlink(os.path.join("/usr/bin", name), bindir / name)
    env = tool_env()
    dirs = env["PATH"].split(os.pathsep)  # the Python's own (and the tests' stand-ins before it)
    env["PATH"] = os.pathsep.join(dirs[:dirs.index(BIN_DIR) + 1] + [str(bindir)])
    p = run_command(["bash", os.path.join(REPRO, "dc_table1.sh"), "--rehearse", "--slurm", "--work-dir",
                     str(tmp_path / "w"), "--only", "transformer"], env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.splitlines()[-1].startswith(
        "dc_table1.sh: error: --slurm: no SLURM commands on PATH (sbatch"), p.stderr


def test_status_without_its_graph_is_a_usage_error(tmp_path):
    p = run_command([sys.executable, os.path.join(REPO, "scripts", "slurm.py"), "status", "--state-dir", str(tmp_path)],
                    env=tool_env(), timeout=120)
    assert p.returncode == 2 and "the following arguments are required: --graph" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def train_slurm(tiny, save, *args, updates=4, extra=()):
    return run_command(["bash", TRAIN, "--slurm", "--arch", "transformer", "--data-bin", tiny.data_bin,
                        "--save-dir", str(save), "--max-update", str(updates), "--src", tiny.src, "--tgt", tiny.tgt,
                        *args, "--", *TINY_MODEL_ARGS, "--max-tokens", "256", "--log-format", "json",
                        "--log-interval", "1", "--save-interval-updates", "5", "--no-epoch-checkpoints",
                        "--num-workers", "0", "--log-file", str(save / "train.log"), *extra],
                       env=tool_env(), timeout=120)


def updates_logged(save):
    try:
        text = open(save / "train.log", errors="replace").read()
    except OSError:
        return []
    return [int(u) for u in re.findall(r'num_updates": "(\d+)"', text)]


def job_log(save, job, task=0):
    """The log of a task of a job: the commands' output (fairseq's log included) and errors."""
    return open(save / "slurm" / "logs" / f"{job}_{task}_log.err", errors="replace").read()


def restores(log):
    """The update counts fairseq restored, in the order of a job's log: from
    checkpoint_last.pt, or from the newest readable checkpoint where a job was stopped
    while fairseq copied checkpoint_last.pt (train.sh's resumption)."""
    return [int(u) for u in re.findall(r"Loaded checkpoint \S+/checkpoint\w*\.pt \(epoch \d+ @ (\d+) updates\)",
                                       log)]


def job_state(save):
    with open(save / "slurm" / "jobs" / f"train_{save.name}.json") as f:
        return json.load(f)


@pytest.mark.timeout(300)
def test_a_two_task_job_trains_through_srun_over_gloo(cluster, tiny_data_bin, tmp_path):
    save = tmp_path / "two"
    p = train_slurm(tiny_data_bin, save, "--gpus-per-node", "2", "--cpu", "--time", "5", "--signal-delay", "30")
    assert p.returncode == 0, p.stderr
    job = re.search(r"submitted train:two: job (\d+)", p.stderr).group(1)
    wait_for(lambda: job not in squeue_ids(), 200, f"job {job}")
    assert job_state(save)["state"] == "done" and job_state(save)["restarts"] == 0
    task0, task1 = job_log(save, job, 0), job_log(save, job, 1)  # (each task's output and fairseq's log)
    assert "--distributed-world-size 2 --distributed-backend gloo --distributed-port" in task0
    assert re.search(r"distributed init \(rank 0\): tcp://\S+:\d+", task0), task0[-3000:]
    assert re.search(r"distributed init \(rank 1\): tcp://\S+:\d+", task1), task1[-3000:]
    assert "--slurm-task" in task1
    assert max(updates_logged(save)) == 4 and os.path.exists(save / "checkpoint_last.pt")


@pytest.mark.timeout(700)
def test_scontrol_requeue_resumes_from_the_checkpoint_and_a_job_past_its_time_limit_is_requeued_and_finishes(
        cluster, tiny_data_bin, tmp_path):
    # two training jobs side by side on the cluster's two CPUs (the one past its time
    # limit spends much of its time waiting for SLURM's warning and requeue):
    #
    # the job past its time limit: --time 2 with the warning 60 s ahead: at most 60 s of
    # training per run, on any machine. The warning comes early (sbatch's man page: up to
    # 60 s; here slurmctld looks at time limits every 30 s and it came 52 s after a run's
    # start), and a run's start (submitit, train.sh's checks, fairseq's import) takes
    # about 15 s here, more on a loaded machine: with --time 1 and the warning 30 s ahead
    # it came 22 s after the start of each requeued run, and on a loaded machine no run
    # got to train until the requeues ran out. fairseq stops after 61 s of training
    # counted over the runs (its --stop-time-hours adds the time of the runs before,
    # saved in the checkpoint), so the job is requeued at least once and then finishes,
    # however fast the machine
    short = tmp_path / "short"
    p = train_slurm(tiny_data_bin, short, "--cpu", "--time", "2", "--signal-delay", "60", "--max-requeues", "8",
                    updates=1_000_000, extra=["--save-interval-updates", "20", "--stop-time-hours", "0.017"])
    assert p.returncode == 0, p.stderr
    short_job = re.search(r"job (\d+)", p.stderr).group(1)

    # scontrol requeue of a training job mid-run: it resumes from its checkpoint
    save = tmp_path / "requeued"
    p = train_slurm(tiny_data_bin, save, "--cpu", "--time", "10", updates=600)
    assert p.returncode == 0, p.stderr
    job = re.search(r"job (\d+)", p.stderr).group(1)
    # mid-run: a checkpoint saved (every 5 updates), a few more updates logged
    wait_for(lambda: os.path.exists(save / "checkpoint_last.pt") and max(updates_logged(save) or [0]) >= 12,
             240, "a first checkpoint")
    subprocess.run(["scontrol", "requeue", job], check=True)
    requeued_at = max(updates_logged(save))
    wait_for(lambda: job not in squeue_ids(), 300, f"job {job}")
    state = job_state(save)
    assert state["state"] == "done" and state["restarts"] == 1, state
    log = job_log(save, job)
    assert "No existing checkpoint found" in log and "train:requeued: requeued (1 of at most 3)" in log, log[-3000:]
    # resumed from its last checkpoint (saved every 5 updates), not from scratch
    assert len(restores(log)) == 1, log[-3000:]
    restored = restores(log)[0]
    assert 10 <= restored and requeued_at - 15 <= restored < 600, (restored, requeued_at)
    ups = updates_logged(save)
    assert max(ups) == 600
    # after the restore the update count goes on (no update below the restored one)
    after = ups[[i for i, u in enumerate(ups) if u <= restored][-1] + 1:]
    assert after and min(after) == restored + 1

    # the job past its time limit, requeued and finished
    wait_for(lambda: short_job not in squeue_ids(), 420, f"job {short_job}")
    state = job_state(short)
    assert state["state"] == "done" and state["restarts"] >= 1, state
    log = job_log(short, short_job)
    # every run after the first resumed from a checkpoint where one had been written: a
    # run can end (at its time limit) before it writes one, or, on a loaded machine,
    # before fairseq looks for one, so restores may be fewer than restarts, but no run
    # starts over once a checkpoint exists
    assert "this job is timed-out" in log and 1 <= len(restores(log)) <= state["restarts"], log[-3000:]
    first_restore = re.search(r"Loaded checkpoint ", log).start()
    assert "No existing checkpoint found" not in log[first_restore:], log[-3000:]
    assert "Stopping training due to cumulative_training_time" in log, log[-3000:]
    # each run went on from the last checkpoint of the one before
    assert all(u > 0 for u in restores(log)) and restores(log) == sorted(restores(log))
    assert max(updates_logged(short)) > max(restores(log))


# ------------------------------------------------------------------ units: no cluster needed
from fairseq_localness.slurm import SET_BY_GRAPH, SET_BY_OPTION, SlurmError, UsageError, check_slurm_arg  # noqa: E402
from fairseq_localness.slurm import cluster as slurm_cluster  # noqa: E402
from fairseq_localness.slurm.status import row_state  # noqa: E402


@pytest.mark.parametrize("key", SET_BY_OPTION + SET_BY_GRAPH + ("depend", "sig", "kill-on"))
def test_slurm_arg_refuses_every_key_the_graph_sets(key):
    with pytest.raises(UsageError, match=rf"^--slurm-arg {key}=\.\.\.: sbatch's --[a-z-]+ is set by ") as e:
        check_slurm_arg(f"{key}=x")
    assert "\n" not in str(e.value)


def test_slurm_arg_takes_other_options_on_one_line():
    for ok in ("begin=now+3600", "exclude=node7", "mail-type=END", "comment=a b"):
        check_slurm_arg(ok)
    with pytest.raises(UsageError, match="expected a value on one line"):
        check_slurm_arg("comment=x\n#SBATCH --time=1")


def test_slurm_states_are_mapped_once(tmp_path):
    registry = {k: {"job_id": str(i), "log": f"/logs/{i}_0_log.err", "kind": k.split(":")[0], "row": "r", "seed": "1"}
                for i, k in enumerate(["prepare:d", "train:r:1", "eval:r:1", "final", "train:s:1", "eval:s:1",
                                       "train:t:1", "eval:t:1"], 1)}
    queue = {"1": ("COMPLETED", 0, "None"), "2": ("COMPLETING", 0, "None"), "3": ("PENDING", 0, "Dependency"),
             "5": ("OUT_OF_MEMORY", 0, "OutOfMemory"), "6": ("CANCELLED", 0, "DependencyNeverSatisfied"),
             "7": ("REQUEUED", 2, "BeginTime"), "8": ("PENDING", 0, "Dependency")}
    (tmp_path / "jobs").mkdir()
    # the table job was killed (kill -9) and SLURM no longer knows it: failed, not cancelled
    (tmp_path / "jobs" / "final.json").write_text(json.dumps({"job_id": "4", "state": "running"}))
    states = slurm_cluster.job_states(str(tmp_path), registry, queue)
    said = {k: (s.what, s.restarts, s.why) for k, s in states.items()}
    assert said["train:r:1"] == ("ending", 0, "SLURM is ending it (COMPLETING)")
    assert said["eval:r:1"] == ("queued", 0, "waiting for the jobs it needs")
    assert said["final"] == ("failed", 0, "it started and ended without a result (killed?)")
    assert said["train:s:1"] == ("failed", 0, "SLURM: OUT_OF_MEMORY (past its --mem)")
    assert said["eval:s:1"] == ("cancelled", 0, "a job it needs failed or was cancelled")
    # a job cancelled while it waited: SLURM's last reason ("Dependency", "None") says nothing
    for reason in ("Dependency", "None"):
        s = slurm_cluster.job_states(str(tmp_path), registry, {"6": ("CANCELLED", 0, reason)})["eval:s:1"]
        assert (s.what, s.why) == ("cancelled", "")
    for word in ("PREEMPTED", "NODE_FAIL", "TIMEOUT"):
        s = slurm_cluster.job_states(str(tmp_path), registry, {"5": (word, 1, "None")})["train:s:1"]
        assert s.what == "failed" and s.why.startswith(f"SLURM: {word} (") and s.restarts == 1
    # after a requeue, the job that matters now is the training (its log), not the evaluation
    state, now = row_state(["prepare:d", "train:t:1", "eval:t:1"], states, registry, False)
    assert state == "queued (requeued; waiting for its start time)" and now == "train:t:1"
    state, now = row_state(["prepare:d", "train:s:1", "eval:s:1"], states, registry, False)
    assert state == "failed (train job 5: SLURM: OUT_OF_MEMORY (past its --mem))" and now == "train:s:1"


@pytest.mark.parametrize("script, message", [
    ("echo 'squeue: error: Socket timed out' >&2; exit 1", "squeue failed (exit status 1: squeue: error: Socket"),
    ("echo '12 RUNNING 0 None'; echo 'garbage'", "squeue answered 'garbage'"),
    ("echo '12 WAITING 0 None'", "squeue answered '12 WAITING 0 None'"),
    ("sleep 5", "squeue did not answer within 0.5 s"),
])
def test_a_queue_that_fails_times_out_or_answers_garbage_is_one_line(tmp_path, monkeypatch, script, message):
    monkeypatch.setenv("PATH", fake_squeue(tmp_path, script)["PATH"])
    monkeypatch.setattr(slurm_cluster, "TIMEOUT", 0.5)
    with pytest.raises(SlurmError) as e:
        slurm_cluster.read_queue()
    assert str(e.value).startswith(message) and "\n" not in str(e.value), e.value


def _no_op():
    return None


def _fake_sbatch(tmp_path, monkeypatch, script):
    """sbatch (and squeue, which answers nothing) first on PATH: ``script`` (sh)."""
    env = fake_squeue(tmp_path, "exit 0")
    sbatch_path = tmp_path / "fake-bin" / "sbatch"
    sbatch_path.write_text(f"#!/bin/sh\n{script}\n")
    sbatch_path.chmod(0o755)
    monkeypatch.setenv("PATH", env["PATH"])


def test_sbatchs_refusal_is_said_once_in_the_error(tmp_path, monkeypatch, capsys):
    """submitit prints sbatch's stderr before it raises: the refusal appears once, in
    the one-line SlurmError naming the step and what was submitted before it."""
    from fairseq_localness.slurm.submit import sbatch

    _fake_sbatch(tmp_path, monkeypatch, "echo 'sbatch: error: Batch job submission failed: Invalid node name "
                 "specified' >&2\nexit 1")
    with pytest.raises(SlurmError) as e:
        sbatch(_no_op, {"time": 5}, str(tmp_path / "state"), 3, "train:r:1", ["prepare:d"])
    assert str(e.value) == ("sbatch refused train:r:1: sbatch: error: Batch job submission failed: Invalid node name "
                            "specified; submitted before it: prepare:d")
    assert capsys.readouterr().err == ""
    # anything else printed on the way (a warning of submitit's) is passed on
    import submitit

    submit = submitit.SlurmExecutor.submit
    monkeypatch.setattr(submitit.SlurmExecutor, "submit",
                        lambda self, fn: (print("UserWarning: a warning", file=sys.stderr), submit(self, fn))[1])
    with pytest.raises(SlurmError):
        sbatch(_no_op, {"time": 5}, str(tmp_path / "state"), 3, "train:r:1", [])
    assert capsys.readouterr().err == "UserWarning: a warning\n"


def test_an_sbatch_that_does_not_answer_is_stopped_and_said_in_one_line(tmp_path, monkeypatch, capsys):
    """sbatch retries for as long as the controller is busy: past the SLURM commands'
    time limit it is stopped, and the error says that a job it may have queued is named
    by the next submission."""
    from fairseq_localness.slurm import cluster
    from fairseq_localness.slurm.submit import sbatch

    _fake_sbatch(tmp_path, monkeypatch, "echo 'sbatch: error: Slurm temporarily unable to accept job, sleeping and "
                 "retrying' >&2\nexec sleep 60")
    monkeypatch.setattr(cluster, "TIMEOUT", 1.0)
    started = time.time()
    with pytest.raises(SlurmError) as e:
        sbatch(_no_op, {"time": 5}, str(tmp_path / "state"), 3, "eval:r:1", ["train:r:1"])
    assert time.time() - started < 20
    assert str(e.value) == ("sbatch did not answer within 1 s for eval:r:1 (a busy controller? "
                            "FAIRSEQ_LOCALNESS_SLURM_TIMEOUT sets the limit); a job it may have queued all the same "
                            "is named by the next submission or --status; submitted before it: train:r:1")
    assert capsys.readouterr().err == ""  # (sbatch's words are not said twice)


@pytest.mark.timeout(200)
def test_train_sh_slurm_status_cancel_and_its_refusals(cluster, tiny_data_bin, tmp_path):
    save = tmp_path / "held"
    p = train_slurm(tiny_data_bin, save, "--cpu", "--time", "5", "--dry-run")
    task = re.search(r"^    bash \S+/train\.sh (?!.*--dry-run).* --slurm-task ", p.stdout, re.M)
    assert p.returncode == 0 and task, p.stdout
    p = train_slurm(tiny_data_bin, save, "--cpu", "--slurm-arg", "signal=USR1@5")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "train.sh: error: --slurm-arg signal=...: sbatch's --signal is set by the job graph itself; expected another "
        "sbatch option (not: " + " ".join(SET_BY_OPTION + SET_BY_GRAPH) + ")"], p.stderr
    held = ("--cpu", "--time", "5", "--slurm-arg", "begin=now+3600")
    p = train_slurm(tiny_data_bin, save, *held)
    assert p.returncode == 0, p.stderr
    job = re.search(r"submitted train:held: job (\d+)", p.stderr).group(1)
    try:
        p = train_slurm(tiny_data_bin, save, *held, "--status")
        # (SLURM gives the reason Resources instead of BeginTime while its one node runs another
        # test's job: both are a queued job's reasons; the words of each are tested without the
        # cluster, test_slurm_states_are_mapped_once)
        assert p.returncode == 0 and re.match(
            rf"train:held: queued \((waiting for its start time|waiting for resources)\); job {job}; "
            rf"log {re.escape(str(save))}/slurm/logs/{job}_0_log\.err", p.stdout), p.stdout + p.stderr
        p = train_slurm(tiny_data_bin, save, *held)  # queued: not again
        assert p.returncode == 0 and "0 job(s) submitted, 1 queued" in p.stderr, p.stderr
        p = train_slurm(tiny_data_bin, save, *held, "--cancel")
        assert p.returncode == 0 and p.stdout == f"train.sh: cancelled 1 job(s): train:held (job {job})\n", p.stdout
        assert job not in squeue_ids()
    finally:
        subprocess.run(["scancel", job], capture_output=True)


def test_train_sh_one_trainer_per_run_directory(tiny_data_bin, tmp_path):
    # a training holds SAVE_DIR/.train.lock: a second one of the same directory stops, naming it
    import fcntl

    save = tmp_path / "run"
    save.mkdir()
    with open(save / ".train.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        (save / ".train.lock").write_text("pid 123 on elsewhere")
        p = run_command(["bash", TRAIN, "--arch", "transformer", "--data-bin", tiny_data_bin.data_bin, "--save-dir",
                         str(save), "--max-update", "2", "--src", tiny_data_bin.src, "--tgt", tiny_data_bin.tgt,
                         "--cpu", "--", *TINY_MODEL_ARGS], env=tool_env(), timeout=120)
    assert p.returncode == 2 and p.stderr.splitlines()[-1] == (
        f"train.sh: error: --save-dir: another training is running in '{save}' (pid 123 on elsewhere); one trainer "
        "per run directory: wait for it or stop it"), p.stderr[-2000:]
    assert not os.path.exists(save / "checkpoint_last.pt")
