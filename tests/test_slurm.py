"""--slurm of the reproduce drivers and of train.sh, through a real SLURM cluster.

The cluster is the one-machine cluster of scripts/slurm/local_cluster.sh (Debian's
slurm-wlm and munge, slurmctld and slurmd as root): .ci/run starts it before the tests;
the fixture starts it where it is not running, and the tests are skipped, with the
reason, only where it cannot start (not root, no apt). Jobs are submitted through
submitit with the CPU fakes of --rehearse and tiny models; nothing of SLURM is mocked.

- a driver's --rehearse --slurm end to end: every row a job, the table the same as the
  local rehearsal's; a second --slurm submits nothing; --status says done with BLEU;
- a failing row: failed in --status with its log's last line, the other row finishes,
  the table marks it; --cancel; --dry-run prints the graph and submits nothing;
- scontrol requeue of a training job mid-run: it resumes from its checkpoint;
- a job whose --time is shorter than its training is requeued and finishes;
- a two-task job (--gpus-per-node 2 --cpu) trains through srun over gloo;
- bad input: one line, exit status 2, nothing submitted.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from conftest import REPO, TINY_MODEL_ARGS, run_command, tool_env
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


@pytest.mark.timeout(600)
def test_a_rehearsal_through_slurm_gives_the_local_table(cluster, tmp_path):
    local, remote = str(tmp_path / "local"), str(tmp_path / "slurm")
    t0 = time.time()
    p = driver("--rehearse", "--slurm", "--work-dir", remote, "--only", ROWS, "--time", "10", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "6 job(s) submitted" in p.stderr, p.stderr
    # the driver returns as soon as the graph is queued
    assert time.time() - t0 < 60
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


@pytest.mark.timeout(500)
def test_a_failing_row_is_marked_failed_and_the_others_finish(cluster, tmp_path):
    # two seeds: enc-dc's second seed fails to train; the three other runs finish and the
    # table over the seeds says what failed
    work = str(tmp_path / "work")
    env = {"REPRODUCE_PIPELINE_DIR": failing_pipeline(tmp_path, "enc-dc/seed2")}
    p = driver("--rehearse", "--slurm", "--seeds", "2", "--work-dir", work, "--only", ROWS, "--time", "10", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "10 job(s) submitted" in p.stderr, p.stderr[-3000:]
    wait_jobs(work, timeout=400)
    lines = status_lines(work, "--seeds", "2")
    assert len(lines) == 5, lines
    for run in ("transformer seed 1", "transformer seed 2", "enc-dc seed 1"):
        line = next(x for x in lines if x.startswith(run + ":"))
        assert re.match(rf"{run}: done; jobs \d+ \d+ \d+; update 6; BLEU \d+\.\d\d; log /", line), line
    bad = next(x for x in lines if x.startswith("enc-dc seed 2:"))
    assert re.match(r"enc-dc seed 2: failed \(train job \d+ failed: exit status 3: train\.sh: error: a failure of "
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
    # submitted to start in an hour, then cancelled
    p = driver("--rehearse", "--slurm", "--work-dir", work, "--only", ROWS, "--slurm-arg", "begin=now+3600")
    assert p.returncode == 0, p.stderr
    assert all(re.match(r"\S+ seed 1: queued; jobs \d+ \d+ \d+; update -; BLEU -; log ", x)
               for x in status_lines(work)[:2])
    p = driver("--rehearse", "--slurm", "--work-dir", work, "--only", ROWS, "--slurm-arg", "begin=now+3600")
    assert "0 job(s) submitted" in p.stderr  # queued: not again
    p = driver("--rehearse", "--cancel", "--work-dir", work, "--only", ROWS)
    assert p.returncode == 0 and re.match(r"dc_table1\.sh: cancelled 6 job\(s\)", p.stdout), p.stdout + p.stderr
    time.sleep(1)
    lines = status_lines(work)
    assert all("failed (" in x and "cancelled" in x for x in lines[:2]), lines


@pytest.mark.parametrize("args, message", [
    (["--slurm", "--partition", "nosuch"], "dc_table1.sh: error: --partition: unknown partition 'nosuch'; "
                                           "this cluster's: debug"),
    (["--slurm", "--time", "1"], "dc_table1.sh: error: --time 1: too short for one validation"),
    (["--slurm", "--gpus", "4", "--gpus-per-node", "2"], "dc_table1.sh: error: --gpus 4 and --nodes 1 "
                                                          "--gpus-per-node 2: conflicting GPU counts"),
    (["--slurm", "--time", "soon"], "dc_table1.sh: error: --time: expected a SLURM time"),
    (["--slurm", "--slurm-arg", "dependency=afterok:1"], "dc_table1.sh: error: --slurm-arg dependency=afterok:1: "
                                                         "sbatch's --dependency is set by the driver itself"),
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
    env["PATH"] = env["PATH"].split(os.pathsep)[0] + os.pathsep + str(bindir)
    p = run_command(["bash", os.path.join(REPRO, "dc_table1.sh"), "--rehearse", "--slurm", "--work-dir",
                     str(tmp_path / "w"), "--only", "transformer"], env=env, timeout=120)
    assert p.returncode == 2 and p.stderr.splitlines()[-1].startswith(
        "dc_table1.sh: error: --slurm: no SLURM commands on PATH (sbatch"), p.stderr


def test_status_without_its_graph_is_a_usage_error(tmp_path):
    p = run_command([sys.executable, "-m", "fairseq_localness.slurm", "status", "--state-dir", str(tmp_path)],
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


@pytest.mark.timeout(400)
def test_scontrol_requeue_resumes_from_the_checkpoint(cluster, tiny_data_bin, tmp_path):
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


@pytest.mark.timeout(400)
def test_a_job_past_its_time_limit_is_requeued_and_finishes(cluster, tiny_data_bin, tmp_path):
    # --time 1 with the warning 30 s ahead: at most about 25 s of training per run, on
    # any machine; fairseq stops after 36 s of training counted over the runs (its
    # --stop-time-hours adds the time of the runs before, saved in the checkpoint), so
    # the job is requeued at least once and then finishes, however fast the machine
    save = tmp_path / "short"
    p = train_slurm(tiny_data_bin, save, "--cpu", "--time", "1", "--signal-delay", "30", "--max-requeues", "8",
                    updates=1_000_000, extra=["--save-interval-updates", "20", "--stop-time-hours", "0.01"])
    assert p.returncode == 0, p.stderr
    job = re.search(r"job (\d+)", p.stderr).group(1)
    wait_for(lambda: job not in squeue_ids(), 360, f"job {job}")
    state = job_state(save)
    assert state["state"] == "done" and state["restarts"] >= 1, state
    log = job_log(save, job)
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
    assert max(updates_logged(save)) > max(restores(log))
