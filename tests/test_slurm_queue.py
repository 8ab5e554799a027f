"""What the SLURM commands take from the queue and the registry, without a cluster:
squeue's listing whatever the environment, job ids that SLURM gave another job, live
jobs that the registry lost, a registry that cannot be read, the work directory's lock,
and bad input that would reach the job's script (docs/slurm.md, "The queue's word")."""
import argparse
import io
import json
import os
import threading
import time

import pytest

from conftest import tool_env
from fairseq_localness.slurm import SlurmError, UsageError, check_slurm_arg
from fairseq_localness.slurm import cluster, graph, status, submit
from fairseq_localness.slurm.cluster import Queue, job_prefix, job_states, load_registry, read_queue, strangers
from fairseq_localness.slurm.jobs import Step


def _fake_squeue(tmp_path, script):
    """A directory first on PATH whose squeue runs ``script`` (sh)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "squeue").write_text("#!/bin/sh\n" + script + "\n")
    (bin_dir / "squeue").chmod(0o755)
    return f"{bin_dir}{os.pathsep}{tool_env()['PATH']}"


def test_squeue_lists_every_job_of_the_account_whatever_the_environment(tmp_path, monkeypatch):
    """squeue runs with -a (hidden partitions too), for the account the process runs as
    (not $USER), and without the SQUEUE_* variables and SLURM_CLUSTERS that would narrow
    its listing and hide a live job (which would then read as ended)."""
    seen = tmp_path / "seen"
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path, f'echo "$@" > {seen}.args; env > {seen}.env'))
    for name, value in (("SQUEUE_PARTITION", "debug"), ("SQUEUE_ACCOUNT", "other"), ("SQUEUE_NAMES", "x"),
                        ("SLURM_CLUSTERS", "elsewhere"), ("USER", "somebody-else"), ("LOGNAME", "somebody-else")):
        monkeypatch.setenv(name, value)
    assert read_queue() == {}
    args = open(f"{seen}.args").read().split()
    assert "-a" in args and args[args.index("-u") + 1] == str(os.getuid())
    env = open(f"{seen}.env").read()
    assert "SQUEUE_" not in env and "SLURM_CLUSTERS" not in env and "USER=somebody-else" in env


def test_the_queue_reads_names_and_leaves_out_other_jobs_it_cannot_read(tmp_path, monkeypatch):
    lines = ["101 RUNNING 0 fl-abcdef-train_r_1 None", "102 PENDING 1 fl-abcdef-eval_r_1 ReqNodeNotAvail, x",
             "103 RUNNING 0 fl-abcdef-train_r_2", "200+0 RUNNING 0 hetero None", "300 ODD_STATE 0 someone-else None"]
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path, "printf '%s\\n' " + " ".join(f"'{x}'" for x in lines)))
    queue = read_queue({"101", "102"})
    assert queue["101"] == ("RUNNING", 0, "None") and queue["102"] == ("PENDING", 1, "ReqNodeNotAvail, x")
    assert queue.names["101"] == "fl-abcdef-train_r_1" and "300" not in queue
    assert queue["103"] == ("RUNNING", 0, "") and queue.names["103"] == "fl-abcdef-train_r_2"  # (no reason)
    assert queue["200"][0] == "RUNNING"  # (a heterogeneous job's first component)
    with pytest.raises(SlurmError, match="squeue answered '300 ODD_STATE"):
        read_queue({"300"})  # a line of one of the run's jobs that is not squeue's
    with pytest.raises(SlurmError, match="squeue answered '300 ODD_STATE"):
        read_queue()  # (strict where no job ids are given)


def _registry(state_dir, **keys):
    return {key.replace("_", ":"): {"job_id": job, "kind": key.split("_")[0], "row": "r", "seed": "1",
                                    "log": "-"} for key, job in keys.items()}


def test_a_job_id_that_slurm_gave_another_job_is_not_the_runs(tmp_path):
    """Ids restart or wrap around: a registry id that the queue lists under a name not of
    this work directory is another job; the run's own is gone (here: it never recorded a
    start, so cancelled), and its state is not the other job's."""
    state_dir = str(tmp_path / "state")
    registry = _registry(state_dir, train_r_1="101")
    prefix = job_prefix(state_dir)
    theirs = Queue({"101": ("RUNNING", 0, "None")}, {"101": "other-project-train"})
    assert job_states(state_dir, registry, theirs)["train:r:1"].what == "cancelled"
    ours = Queue({"101": ("RUNNING", 0, "None")}, {"101": prefix + "train_r_1"})
    assert job_states(state_dir, registry, ours)["train:r:1"].what == "running"
    assert job_states(state_dir, registry, {"101": ("RUNNING", 0, "None")})["train:r:1"].what == "running"


def test_live_jobs_named_for_the_work_directory_that_the_registry_lacks_are_found(tmp_path):
    state_dir = str(tmp_path / "state")
    prefix = job_prefix(state_dir)
    assert prefix.startswith("fl-") and len(prefix) == 10 and job_prefix(state_dir + "/") == prefix
    queue = Queue({"101": ("RUNNING", 0, "None"), "102": ("PENDING", 0, "None"), "103": ("COMPLETED", 0, "None"),
                   "104": ("RUNNING", 0, "None"), "105": ("SPECIAL_EXIT", 0, "None")},
                  {"101": prefix + "train_r_1", "102": prefix + "train-lane0", "103": prefix + "eval_r_1",
                   "104": "fl-000000-train_r_1", "105": prefix + "train_r_2"})
    registry = _registry(state_dir, train_r_1="101")
    assert strangers(state_dir, registry, queue) == [("102", prefix + "train-lane0"), ("105", prefix + "train_r_2")]


def test_special_exit_is_a_held_job_not_a_failed_one(tmp_path):
    state_dir = str(tmp_path)
    state = job_states(state_dir, _registry(state_dir, train_r_1="7"), {"7": ("SPECIAL_EXIT", 1, "None")})
    assert state["train:r:1"].live and "scontrol release" in state["train:r:1"].why


def test_a_registry_that_cannot_be_read_stops_instead_of_reading_as_nothing_submitted(tmp_path):
    state_dir = tmp_path / "state"
    assert load_registry(str(state_dir)) == {}  # none: nothing submitted
    state_dir.mkdir()
    for text in ("", "{\"train:r:1\": {\"job_id\"", "[1, 2]", "{\"train:r:1\": 5}"):
        (state_dir / "submitted.json").write_text(text)
        with pytest.raises(SlurmError) as e:
            load_registry(str(state_dir))
        assert str(e.value).startswith(str(state_dir / "submitted.json")) and "\n" not in str(e.value)
    (state_dir / "submitted.json").write_text("")
    args = argparse.Namespace(state_dir=str(state_dir), graph=str(_graph(tmp_path)), prog="slurm")
    with pytest.raises(SlurmError, match="submitted.json: cannot be read"):
        status.status(args)


def _graph(tmp_path):
    path = tmp_path / "graph.tsv"
    path.write_text("JOB\ttrain:r:1\ttrain\tr\t1\t1\t1\t0\t\nCMD\ttrain:r:1\techo hi\n")
    return path


def test_a_graph_line_with_a_tab_too_many_is_refused(tmp_path):
    path = tmp_path / "graph.tsv"
    path.write_text("JOB\ttrain:run\ttrain\trun\t1\t1\t1\t0\t\nCMD\ttrain:run\tfairseq-train --save-dir a\tb\n")
    with pytest.raises(UsageError, match=r"graph.tsv:2: a CMD line of 4 tab-separated fields, expected 3"):
        graph.read_graph(str(path))
    assert list(graph.read_graph(str(_graph(tmp_path)))[1]) == ["train:r:1"]


def test_submission_busy_check_status_and_cancel_name_the_live_jobs_the_registry_lost(tmp_path, monkeypatch,
                                                                                      capsys):
    """A job sbatch queued whose registry entry was never written: a submission and a
    local run stop, naming it and nothing submitted; --status and --cancel name it with
    the scancel that cancels it (and cancel nothing of its own)."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "submitted.json").write_text(json.dumps(_registry(str(state_dir), prepare_d="100")))
    prefix = job_prefix(str(state_dir))
    queue = Queue({"100": ("COMPLETED", 0, "None"), "101": ("RUNNING", 0, "None")},
                  {"100": prefix + "prepare_d", "101": prefix + "train_r_1"})
    monkeypatch.setattr(cluster, "read_queue", lambda known=None: queue)
    monkeypatch.setattr(status, "need_slurm", lambda: None)
    monkeypatch.setattr(submit, "check", lambda args: None)
    monkeypatch.setattr(submit, "sbatch", lambda *a: pytest.fail("submitted beside a live job"))
    monkeypatch.setenv("PATH", _fake_squeue(tmp_path, "exit 0"))
    args = argparse.Namespace(state_dir=str(state_dir), graph=str(_graph(tmp_path)), prog="slurm", dry_run=False)
    with pytest.raises(SlurmError, match=r"^job 101 \(" + prefix + r"train_r_1\): queued or running, named for "):
        submit.submit(args)
    monkeypatch.setattr("sys.stdin", io.StringIO("r\t1\td\n"))
    with pytest.raises(UsageError, match=r"^job 101 \(.*\): live on the cluster"):
        status.busy(args)
    status.status(args)
    status.cancel(args)
    out = capsys.readouterr().out
    assert out.count("live job(s) named for") == 2 and out.count("'scancel 101'") == 2
    assert "cancelled 0 job(s)" in out


def test_cancel_waits_for_a_submission_in_progress(tmp_path, monkeypatch):
    state_dir = str(tmp_path / "state")
    os.makedirs(state_dir)
    monkeypatch.setattr(status, "need_slurm", lambda: None)
    monkeypatch.setattr(cluster, "read_queue", lambda known=None: Queue())
    args = argparse.Namespace(state_dir=state_dir, graph=str(_graph(tmp_path)), prog="slurm")
    finished = []
    with cluster.locked(state_dir):
        worker = threading.Thread(target=lambda: (status.cancel(args), finished.append(time.time())))
        worker.start()
        time.sleep(0.5)
        assert not finished  # (waiting for the lock)
        released = time.time()
    worker.join(10)
    assert finished and finished[0] >= released


@pytest.mark.parametrize("option", ["account", "mem", "qos", "constraint", "partition"])
def test_a_line_break_in_an_option_that_reaches_the_script_is_refused(option):
    args = argparse.Namespace(signal_delay=30, time=None, slurm_arg=[], partition=None, mem=None, account=None,
                              qos=None, constraint=None)
    setattr(args, option, "proj\ntouch /tmp/injected #")
    with pytest.raises(UsageError, match=rf"^--{option}: 'proj\\ntouch .*control character"):
        submit.check(args)
    with pytest.raises(UsageError, match="without control characters"):
        check_slurm_arg("comment=a\x0bb")


@pytest.mark.parametrize("key", ["tasks-per-node", "clusters", "cluster", "gres", "cpus-per-gpu", "ntasks-per-gpu"])
def test_slurm_arg_refuses_the_neighbours_of_what_the_graph_sets(key):
    with pytest.raises(UsageError, match=rf"^--slurm-arg {key}=\.\.\.: sbatch's --"):
        check_slurm_arg(f"{key}=4")


def test_a_tasks_failure_is_not_overwritten_by_task_zeros_start(tmp_path, monkeypatch):
    """Tasks of one job: another task's failure written first stays when task 0 then
    records its start (same job id, same restart count); a later restart's start does not
    keep it."""
    step = Step("train:r:1", ["true"], str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "55")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    monkeypatch.setenv("SLURM_PROCID", "1")
    step._write(state="failed", message="task 1: out of memory", log="-")
    monkeypatch.setenv("SLURM_PROCID", "0")
    step._write(state="running", log="-")
    path = tmp_path / "jobs" / "train_r_1.json"
    assert json.loads(path.read_text())["state"] == "failed"
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    step._write(state="running", log="-")
    assert json.loads(path.read_text())["state"] == "running"


def test_a_job_is_known_by_the_name_recorded_at_its_submission_however_the_directory_is_spelled(tmp_path):
    """The registry records each job's name: the state directory reached through a link
    (or relative to another directory) names the same jobs; a registry written before
    names were recorded takes the prefix of either spelling."""
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    name = job_prefix(str(real / "slurm")) + "train_r_1"
    queue = Queue({"101": ("RUNNING", 0, "None")}, {"101": name})
    recorded = {"train:r:1": {"job_id": "101", "name": name, "kind": "train", "row": "r", "seed": "1", "log": "-"}}
    for spelling in (real / "slurm", tmp_path / "link" / "slurm"):
        assert job_states(str(spelling), recorded, queue)["train:r:1"].what == "running"
        assert job_states(str(spelling), _registry(str(spelling), train_r_1="101"), queue)["train:r:1"].live
        assert strangers(str(spelling), {}, queue) == [("101", name)]
    other = Queue({"101": ("RUNNING", 0, "None")}, {"101": name + "x"})
    assert job_states(str(real / "slurm"), recorded, other)["train:r:1"].what == "cancelled"
    # a job of this directory that SLURM gave a recorded job's id (its ids restarted): not
    # the recorded one, so a stranger (the submission stops instead of running its row twice)
    assert strangers(str(real / "slurm"), recorded, other) == [("101", name + "x")]
    assert strangers(str(real / "slurm"), recorded, queue) == []


def _check_args(**given):
    return argparse.Namespace(**dict(dict(signal_delay=30, time=None, slurm_arg=[], partition=None, mem=None,
                                          account=None, qos=None, constraint=None), **given))


@pytest.mark.parametrize("variable", ["SBATCH_JOB_NAME", "SLURM_CLUSTERS", "SBATCH_CLUSTERS", "SBATCH_ARRAY_INX",
                                      "SBATCH_TIMELIMIT", "SBATCH_NO_REQUEUE", "SBATCH_SIGNAL", "SBATCH_OUTPUT",
                                      "SBATCH_WAIT", "SBATCH_EXPORT", "SBATCH_GPUS_PER_NODE"])
def test_an_environment_that_would_hide_rename_or_change_the_runs_jobs_is_refused(variable, monkeypatch):
    """sbatch's variables override the options of the job's script, where the graph's
    are (SBATCH_ARRAY_INX=0-1 queued two trainings of one row; SBATCH_TIMELIMIT and
    SBATCH_NO_REQUEUE left a job queued for ever past its partition's limit)."""
    monkeypatch.setenv(variable, "other")
    with pytest.raises(UsageError, match=rf"^{variable}='other' is set: sbatch would .*; expected it unset"):
        submit.check(_check_args())


def _fake_commands(tmp_path, **scripts):
    """A directory first on PATH whose commands run the given ``sh`` scripts."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir(exist_ok=True)
    for name, script in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + script + "\n")
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}{os.pathsep}{tool_env()['PATH']}"


def test_the_drivers_sbatch_options_and_their_variables_agree_and_sinfo_lists_every_partition(tmp_path, monkeypatch):
    """SBATCH_ACCOUNT (or _PARTITION, _QOS, _CONSTRAINT, _MEM_PER_NODE) that differs from
    the driver's option is refused (sbatch would take the variable's); where the option
    is not given the variable is taken as it, so that --time is checked against the
    partition SBATCH_PARTITION names. sinfo runs without the SINFO_* variables (with
    SINFO_PARTITION=gpu it listed nothing, and --time went unchecked)."""
    seen = tmp_path / "sinfo.env"
    path = _fake_commands(tmp_path, sinfo=f"env > {seen}; echo \"$@\" > {seen}.args; "
                          "printf 'debug* 1:00:00\\ngpu 2:00:00\\n'",
                          **{name: "exit 0" for name in ("sbatch", "squeue", "scontrol", "scancel")})
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("SBATCH_ACCOUNT", "theirs")
    with pytest.raises(UsageError, match=r"^SBATCH_ACCOUNT='theirs' is set and --account is 'mine': sbatch would "
                                         r"take the variable's"):
        submit.check(_check_args(account="mine"))
    monkeypatch.delenv("SBATCH_ACCOUNT")
    monkeypatch.setenv("SINFO_PARTITION", "gpu")
    monkeypatch.setenv("SBATCH_PARTITION", "gpu")
    args = _check_args(time="1:30:00")
    submit.check(args)  # (gpu's limit: 2 hours)
    assert args.partition == "gpu" and args.time_minutes == 90
    assert "SINFO_" not in seen.read_text() and "-a" in open(f"{seen}.args").read().split()
    with pytest.raises(UsageError, match=r"--time 180: longer than partition gpu's limit of 120 minutes"):
        submit.check(_check_args(time="3:00:00"))
    args = _check_args(partition="gpu", time="1:00:00")  # (the same value: taken)
    submit.check(args)
    with pytest.raises(UsageError, match=r"^SBATCH_PARTITION='gpu' is set and --partition is 'debug'"):
        submit.check(_check_args(partition="debug"))
    monkeypatch.delenv("SBATCH_PARTITION")
    # a list, as sbatch takes it: each one known, --time within the largest limit, and a job
    # without --time gets the smallest; sinfo lists the hidden partitions too (-a)
    args = _check_args(partition="debug,gpu", time="1:30:00")
    submit.check(args)
    assert args.time_minutes == 90
    args = _check_args(partition="debug,gpu")
    submit.check(args)
    assert args.time_minutes == 60
    with pytest.raises(UsageError, match=r"--time 180: longer than partition debug,gpu's limit of 120 minutes"):
        submit.check(_check_args(partition="debug,gpu", time="3:00:00"))
    with pytest.raises(UsageError, match=r"--partition: unknown partition 'nope'; this cluster's: debug gpu"):
        submit.check(_check_args(partition="gpu,nope"))
    assert cluster.minutes_of("30:00") == 30 and cluster.minutes_of("2-00:00:00") == 2880  # (sinfo's forms)
    assert cluster.minutes_of("infinite") is None


def test_the_slurm_commands_run_without_the_variables_that_change_what_they_list_or_act_on(tmp_path, monkeypatch):
    """scancel with SCANCEL_STATE=PENDING cancelled nothing of a running job and said it
    had; SLURM_CLUSTERS would point it at another cluster than the one squeue reads."""
    seen = tmp_path / "scancel.env"
    monkeypatch.setenv("PATH", _fake_commands(tmp_path, scancel=f"env > {seen}"))
    for name, value in (("SCANCEL_STATE", "PENDING"), ("SCANCEL_USER", "x"), ("SLURM_CLUSTERS", "elsewhere"),
                        ("SQUEUE_STATES", "all"), ("SBATCH_ACCOUNT", "kept")):
        monkeypatch.setenv(name, value)
    cluster.ask(["scancel", "101"])
    env = seen.read_text()
    assert "SCANCEL_" not in env and "SLURM_CLUSTERS" not in env
    assert "SQUEUE_STATES=all" in env and "SBATCH_ACCOUNT=kept" in env  # (another command's: left)


@pytest.mark.parametrize("value", ["abc", "", "nan", "inf", "-inf", "0", "-5"])
def test_a_slurm_timeout_that_is_not_a_number_of_seconds_is_one_line(value, monkeypatch):
    monkeypatch.setattr(cluster, "TIMEOUT", cluster._timeout(value))
    monkeypatch.setenv(cluster.TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=rf"^FAIRSEQ_LOCALNESS_SLURM_TIMEOUT={value!r}: expected a number of "
                                         r"seconds > 0"):
        cluster.ask(["squeue"])
    assert cluster._timeout(None) == 30 and cluster._timeout("2.5") == 2.5


def test_the_lock_is_taken_where_its_file_can_only_be_read(tmp_path):
    """A shared lock opens the lock file for reading (NFS's flock emulation needs it; a
    lock file another user created may be read-only to this one); one that cannot be
    opened at all is one line."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    (state_dir / "lock").write_text("")
    os.chmod(state_dir / "lock", 0o444)
    with cluster.locked(str(state_dir), exclusive=False):
        pass
    if os.geteuid() != 0:  # (root opens it for writing anyway)
        with pytest.raises(SlurmError, match="the lock of the state directory cannot be opened"):
            with cluster.locked(str(state_dir)):
                pass
    missing = tmp_path / "file"
    missing.write_text("")
    with pytest.raises(SlurmError, match="the lock of the state directory cannot be opened"):
        with cluster.locked(str(missing / "state")):
            pass


def _submission(tmp_path, monkeypatch, queue, registry, first_id=200):
    """A state directory with ``registry``, a graph of a training, its evaluation and the
    table, and submit's SLURM calls recorded: [(what, key or job id, dependency)]."""
    state_dir = tmp_path / "state"
    state_dir.mkdir(exist_ok=True)
    (state_dir / "submitted.json").write_text(json.dumps(registry))
    path = tmp_path / "graph.tsv"
    path.write_text("JOB\ttrain:r:1\ttrain\tr\t1\t1\t1\t0\t\nCMD\ttrain:r:1\techo train\n"
                    "JOB\teval:r:1\teval\tr\t1\t1\t1\t0\ttrain:r:1\nCMD\teval:r:1\techo eval\n"
                    "JOB\tfinal\tfinal\t-\t-\t1\t1\t0\ttrain:r:1 eval:r:1\nCMD\tfinal\t#table echo table\n")
    calls, new_ids = [], iter(range(first_id, first_id + 100))
    monkeypatch.setattr(cluster, "read_queue", lambda known=None: queue)
    monkeypatch.setattr(submit, "check", lambda args: setattr(args, "time_minutes", 60))
    monkeypatch.setattr(submit, "ask", lambda cmd: calls.append((cmd[0], cmd[1], None)))
    monkeypatch.setattr(submit, "sbatch", lambda step, params, *a: (
        calls.append(("sbatch", step.key if hasattr(step, "key") else a[2], params.get("dependency", ""))),
        str(next(new_ids)))[1])
    args = argparse.Namespace(state_dir=str(state_dir), graph=str(path), prog="slurm", dry_run=False, max_jobs=10,
                              max_running=0, max_requeues=3, slurm_arg=[], signal_delay=90, partition=None,
                              cpus_per_task=None, mem=None, account=None, qos=None, constraint=None)
    return args, calls


def _queue(registry, train, evaluation, final):
    """The queue of the registry's training, evaluation and table jobs in these states."""
    keys = ("train:r:1", "eval:r:1", "final")
    return Queue({registry[k]["job_id"]: state for k, state in zip(keys, (train, evaluation, final))},
                 {registry[k]["job_id"]: registry[k]["name"] for k in keys})


def _three_jobs(tmp_path, train, evaluation, final, **records):
    """A registry of jobs 101 (training), 102 (evaluation) and 103 (table) with their
    names and ``records``' fields, and the queue of them in these states."""
    state_dir = str(tmp_path / "state")
    prefix = job_prefix(state_dir)
    registry = {k: dict(r, name=prefix + graph.safe(k)) for k, r in
                _registry(state_dir, train_r_1="101", eval_r_1="102", final="103").items()}
    for key, fields in records.items():
        registry[key.replace("_", ":")].update(fields)
    return _queue(registry, train, evaluation, final), registry


def test_a_live_prepare_job_of_other_rows_is_kept_only_where_it_prepares_what_these_need(tmp_path, monkeypatch):
    """A dataset's prepare job is shared by the rows of a submission, and prepares their
    directions: one still live from a submission of other rows (vi-en) is not what en-vi
    needs, and its rows would wait for it and fail (dc_table2.sh --only en-vi... after
    --only vi-en...); the submission stops, naming it. Where it prepares all that this
    submission needs it is kept. Each prepare job's commands are recorded."""
    state_dir = str(tmp_path / "state")
    prefix = job_prefix(state_dir)
    cmds = {"vi-en": "prepare --out data/vi-en", "en-vi": "prepare --out data/en-vi"}
    registry = {"prepare:d": {"job_id": "100", "name": prefix + "prepare_d", "kind": "prepare", "row": "-",
                              "seed": "-", "log": "-", "commands": [cmds["vi-en"]]}}
    queue = Queue({"100": ("RUNNING", 0, "None")}, {"100": prefix + "prepare_d"})
    args, calls = _submission(tmp_path, monkeypatch, queue, registry)
    graph_file = tmp_path / "prepare.tsv"
    args.graph = str(graph_file)
    for wanted, refused in (([cmds["en-vi"]], True), ([cmds["vi-en"], cmds["en-vi"]], True),
                            ([cmds["vi-en"]], False)):
        graph_file.write_text("JOB\tprepare:d\tprepare\t-\t-\t1\t1\t0\t\n"
                              + "".join(f"CMD\tprepare:d\t{c}\n" for c in wanted)
                              + "JOB\ttrain:r:1\ttrain\tr\t1\t1\t1\t0\tprepare:d\nCMD\ttrain:r:1\techo train\n")
        (tmp_path / "state" / "submitted.json").write_text(json.dumps(registry))
        calls.clear()
        if refused:
            with pytest.raises(SlurmError, match=r"^prepare:d \(job 100, running\): live, it prepares this dataset "
                                                 r"for other rows, without all that these rows need"):
                submit.submit(args)
            assert calls == []
        else:
            submit.submit(args)
            assert calls == [("sbatch", "train:r:1", "afterok:100")], calls
    registry.pop("prepare:d")  # (a first submission: the prepare job recorded with its commands)
    queue.pop("100")
    queue.names.pop("100")
    (tmp_path / "state" / "submitted.json").write_text(json.dumps(registry))
    submit.submit(args)
    saved = json.loads((tmp_path / "state" / "submitted.json").read_text())
    assert saved["prepare:d"]["commands"] == [cmds["vi-en"]] and "commands" not in saved["train:r:1"]


def test_a_queued_job_that_waits_for_a_job_submitted_again_is_replaced_after_it(tmp_path, monkeypatch, capsys):
    """The training failed and its evaluation is still queued (SLURM has not yet killed it
    for its dependency, or never will): submitting again replaces the evaluation, which
    would wait for the failed training forever, by one after the new training; the table
    job waits for the new jobs, not the cancelled ones."""
    queue, registry = _three_jobs(tmp_path, ("FAILED", 0, "NonZeroExitCode"),
                                  ("PENDING", 0, "DependencyNeverSatisfied"), ("PENDING", 0, "Dependency"))
    args, calls = _submission(tmp_path, monkeypatch, queue, registry)
    submit.submit(args)
    # (the queued table job first: cancelling the evaluation could otherwise start it)
    assert calls == [("scancel", "103", None), ("sbatch", "train:r:1", ""), ("scancel", "102", None),
                     ("sbatch", "eval:r:1", "afterok:200"), ("sbatch", "final", "afterany:200:201")], calls
    saved = json.loads((tmp_path / "state" / "submitted.json").read_text())
    assert {k: r["job_id"] for k, r in saved.items()} == {"train:r:1": "200", "eval:r:1": "201", "final": "202"}
    assert saved["eval:r:1"]["after"] == ["200"] and saved["train:r:1"]["after"] == []
    assert "1 queued job(s) cancelled and submitted again after the new job(s) they wait for: eval:r:1" in (
        capsys.readouterr().err)
    # a queued evaluation whose training is live stays, and so does the table job: nothing to submit
    queue = _queue(saved, ("RUNNING", 0, "None"), ("PENDING", 0, "Dependency"), ("PENDING", 0, "Dependency"))
    args, calls = _submission(tmp_path, monkeypatch, queue, saved)
    submit.submit(args)
    assert calls == [] and "0 job(s) submitted, 3 queued, running or done" in capsys.readouterr().err
    # --dry-run names the job it would replace, and replaces nothing
    queue = _queue(saved, ("CANCELLED", 0, "None"), ("PENDING", 0, "Dependency"), ("PENDING", 0, "Dependency"))
    args, calls = _submission(tmp_path, monkeypatch, queue, saved)
    args.dry_run = True
    submit.submit(args)
    out = capsys.readouterr().out
    assert calls == [] and "job eval:r:1 (eval): " in out and "(replacing queued job 201, which waits for a job " \
        "that failed, was cancelled or was submitted again)" in out, out


def _other_rows(tmp_path, queue, registry, others):
    """``registry`` and ``queue`` with jobs of other rows: {key: (job id, after, queue state)}."""
    prefix = job_prefix(str(tmp_path / "state"))
    for key, (job_id, after, _) in others.items():
        registry[key] = {"job_id": job_id, "kind": key.split(":")[0], "row": key.split(":")[1], "seed": "1",
                         "log": "-", "name": prefix + graph.safe(key), "after": after}
    return Queue(dict(queue, **{job_id: state for job_id, _, state in others.values()}),
                 dict(queue.names, **{registry[k]["job_id"]: registry[k]["name"] for k in others}))


def test_queued_jobs_of_other_rows_left_waiting_for_a_job_that_ended_are_named(tmp_path, monkeypatch, capsys):
    """Other rows' queued jobs (recorded by earlier submissions, not in this graph) that
    wait for a job this submission submits again, or for one that failed, cannot be
    replaced by it (it has not their steps): the submission names them and says to
    submit their rows again; --dry-run names them too. So is one that waits for such a
    job (eval:x:1, recorded before the training it waits for). Not named: one that waits
    for a live job, one that waits for a job id an earlier submission replaced (that one
    named it), and this graph's own (replaced instead)."""
    pending, failed = ("PENDING", 0, "Dependency"), ("FAILED", 0, "NonZeroExitCode")
    others = {"eval:s:1": ("104", ["101"], pending), "eval:u:1": ("105", ["106"], pending),
              "train:u:1": ("106", [], ("RUNNING", 0, "None")), "eval:v:1": ("107", ["108"], pending),
              "train:v:1": ("108", [], failed), "eval:w:1": ("109", ["99"], pending),
              "eval:x:1": ("111", ["110"], pending), "train:x:1": ("110", ["101"], pending)}
    for train in (failed, ("COMPLETED", 0, "None")):  # (a done training is submitted again: its score is missing)
        queue, registry = _three_jobs(tmp_path, train, pending, pending)
        queue = _other_rows(tmp_path, queue, registry, others)
        for dry_run in (True, False):
            args, calls = _submission(tmp_path, monkeypatch, queue, json.loads(json.dumps(registry)))
            args.dry_run = dry_run
            submit.submit(args)
            out, err = capsys.readouterr()
            said = out if dry_run else err
            assert ("4 queued job(s) of rows not in this submission wait, directly or through one another, for a "
                    "job that " + ("would be" if dry_run else "is") + " submitted again now") in said, said
            assert ("eval:s:1 (job 104), eval:v:1 (job 107), eval:x:1 (job 111), train:x:1 (job 110); submit their "
                    "rows again") in said, said
            assert not [c for c in calls if c[1] in ("104", "105", "106", "107", "108", "109", "110", "111")], calls
            assert "eval:u:1" not in said and "eval:w:1" not in said and "eval:r:1 (job" not in said


def test_a_queued_job_whose_need_is_done_or_running_stays(tmp_path, monkeypatch, capsys):
    """The evaluation queued after a training that finished (waiting for a GPU: the
    graph holds the training until the row's score exists, so it is submitted again and
    resumes its last checkpoint), that runs, or that was requeued, is the run's normal
    state: a submission leaves it as it is."""
    for train in (("COMPLETED", 0, "None"), ("RUNNING", 0, "None"), ("REQUEUED", 1, "None")):
        queue, registry = _three_jobs(tmp_path, train, ("PENDING", 0, "Resources"), ("PENDING", 0, "Dependency"),
                                      eval_r_1={"after": ["101"]})
        args, calls = _submission(tmp_path, monkeypatch, queue, registry)
        submit.submit(args)
        assert not [c for c in calls if c[1] in ("102", "eval:r:1")], (train, calls)
        assert "cancelled and submitted again" not in capsys.readouterr().err
        assert calls == ([("scancel", "103", None), ("sbatch", "train:r:1", ""),
                          ("sbatch", "final", "afterany:102:200")] if train[0] == "COMPLETED" else []), calls


def test_a_submission_stopped_halfway_is_finished_by_the_next(tmp_path, monkeypatch, capsys):
    """The training was submitted again (job 200) and the cancel of the queued evaluation
    failed: the next submission replaces the evaluation, which waits for job 101, not
    200 (the registry records what each job waits for)."""
    queue, registry = _three_jobs(tmp_path, ("FAILED", 0, "None"), ("PENDING", 0, "DependencyNeverSatisfied"),
                                  ("PENDING", 0, "Dependency"), eval_r_1={"after": ["101"]})
    args, calls = _submission(tmp_path, monkeypatch, queue, registry)

    def scancel_fails(cmd):
        calls.append((cmd[0], cmd[1], None))
        if cmd[1] == "102":
            raise SlurmError("scancel failed (exit status 1: no); nothing was submitted, cancelled or recorded")

    monkeypatch.setattr(submit, "ask", scancel_fails)
    with pytest.raises(SlurmError, match=r"^scancel failed \(exit status 1: no\) \(replacing the queued eval:r:1 "
                                         r"job 102\); submitted and recorded before it: train:r:1; cancelled to be "
                                         r"replaced: final \(job 103\); submit again to finish$"):
        submit.submit(args)
    saved = json.loads((tmp_path / "state" / "submitted.json").read_text())
    assert saved["train:r:1"]["job_id"] == "200" and saved["eval:r:1"]["job_id"] == "102"
    queue = _queue(saved, ("PENDING", 0, "None"), ("PENDING", 0, "DependencyNeverSatisfied"),
                   ("CANCELLED", 0, "None"))
    args, calls = _submission(tmp_path, monkeypatch, queue, saved, first_id=201)
    submit.submit(args)
    assert calls == [("scancel", "102", None), ("sbatch", "eval:r:1", "afterok:200"),
                     ("sbatch", "final", "afterany:200:201")], calls


def test_sbatchs_refusal_after_a_cancel_names_the_cancelled_jobs(tmp_path, monkeypatch):
    queue, registry = _three_jobs(tmp_path, ("FAILED", 0, "None"), ("PENDING", 0, "DependencyNeverSatisfied"),
                                  ("PENDING", 0, "Dependency"))
    args, calls = _submission(tmp_path, monkeypatch, queue, registry)

    def refused(step, *a):
        raise SlurmError(f"sbatch refused {step.key}: no; nothing submitted")

    monkeypatch.setattr(submit, "sbatch", refused)
    with pytest.raises(SlurmError, match=r"^sbatch refused train:r:1: no; nothing submitted; cancelled to be "
                                         r"replaced: final \(job 103\); submit again to finish$"):
        submit.submit(args)


@pytest.mark.parametrize("name", ["w%j", "w\\x"], ids=["percent", "backslash"])
def test_a_state_directory_that_sbatch_would_read_as_a_pattern_is_refused(tmp_path, monkeypatch, name):
    state_dir = tmp_path / name / "slurm"
    args = argparse.Namespace(state_dir=str(state_dir), graph=str(_graph(tmp_path)), prog="slurm", dry_run=False)
    monkeypatch.setattr(submit, "check", lambda args: pytest.fail("checked the cluster"))
    with pytest.raises(UsageError, match=r"the run's SLURM state directory, has a '%' or a backslash; sbatch reads"):
        submit.submit(args)
    assert not (tmp_path / name).exists()
