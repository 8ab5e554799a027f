"""The fork server of the tests' commands (``tests/zygote.py``, :func:`conftest.run_command`):
which commands it forks, and that a forked command prints and returns what the
real process does (the same command run both ways), times out as a subprocess
does, and leaves no process behind."""
import os
import re
import time

import pytest

import conftest
from conftest import USER_DIR, run_fairseq, tool_env, tool_path, train_command

pytestmark = pytest.mark.skipif(not conftest.FORK, reason=f"{conftest.FORK_ENV}=0: no command is forked")

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| ", re.M)
TIMINGS = re.compile(r"\b(wps|ups|wall|train_wall|gb_free)([= ])[\d.]+|\d+(\.\d+)?\s?(seconds|s)\b|"
                     r"(time|Time)[: ]+[\d.]+|\(\d+\.\d+ sentences/s, \d+\.\d+ tokens/s\)")


def _both(monkeypatch, tool, args, **kwargs):
    """``tool args`` forked, then as a real subprocess."""
    monkeypatch.setattr(conftest, "FORK", True)
    forked = run_fairseq(tool, args, check=False, **kwargs)
    monkeypatch.setattr(conftest, "FORK", False)
    real = run_fairseq(tool, args, check=False, **kwargs)
    return forked, real


def _same(text):
    return TIMINGS.sub("<t>", TIMESTAMP.sub("", text))


def test_which_commands_are_forked(monkeypatch, tmp_path):
    monkeypatch.setattr(conftest, "FORK", True)
    train = tool_path("fairseq-train")

    def server(cmd, env=None, cwd=None):
        return conftest._fork_server([str(a) for a in cmd], cwd, tool_env(env))

    assert server([train, "data", "--user-dir", USER_DIR]) is not None
    assert server([tool_path("fairseq-localness-average"), "--inputs", "x"]) is not None
    # without --user-dir a zygote of fairseq alone (a real run would not import this
    # package); another one, or this one named otherwise, runs for real
    alone = server([train, "data"])
    assert alone is not None and alone is not server([train, "data", "--user-dir", USER_DIR])
    assert conftest._SERVERS[(train, "")] is alone
    assert server([train, "data", "--user-dir", str(tmp_path)]) is None
    assert server([train, "data", f"--user-dir={USER_DIR}"]) is None
    assert server([train, "data", "--user-dir", USER_DIR, "--user-dir", USER_DIR]) is None
    # read when the interpreter starts or a module is imported
    assert server([train, "data", "--user-dir", USER_DIR], env={"PYTHONWARNINGS": ""}) is None
    assert server([train, "data", "--user-dir", USER_DIR], env={"LOGLEVEL": "DEBUG"}) is None
    # read while the command runs
    assert server([train, "data", "--user-dir", USER_DIR], env={"FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS": "1"})
    assert server(["bash", "-c", "true"]) is None
    assert server(["prlimit", "--as=1000000", "--", "bash", "-c", "true"]) is None
    assert server(["prlimit", "--as=1000000", "--", train, "--user-dir", USER_DIR]) is None
    limited = ["prlimit", "--as=1000000", "--", train, "--user-dir", USER_DIR]
    assert conftest._address_space_limit(limited) == (1000000, limited[3:])
    other = ["prlimit", "--cpu=1", "--", train]
    assert conftest._address_space_limit(other) == (None, other)
    assert server([train, "data", "--user-dir", USER_DIR], cwd=str(tmp_path / "missing")) is None
    assert conftest._fork_server([train, "--user-dir", USER_DIR], None, None) is None  # (inherits os.environ)
    monkeypatch.setattr(conftest, "FORK", False)
    assert server([train, "data", "--user-dir", USER_DIR]) is None


def test_exit_statuses_and_messages_are_the_real_ones(monkeypatch, tmp_path):
    cases = [
        ("fairseq-localness-average", []),  # argparse: status 2, usage on stderr
        ("fairseq-train", ["--help", "--user-dir", USER_DIR]),  # status 0, help on stdout
        # an uncaught exception: its traceback, status 1
        ("fairseq-train", [tmp_path / "missing", "--user-dir", USER_DIR, "--task", "translation",
                           "--arch", "transformer"]),
        # this package's one-line refusal (its sys.excepthook), status 1
        ("fairseq-generate", [tmp_path, "--user-dir", USER_DIR, "--path", tmp_path / "none.pt"]),
    ]
    for tool, args in cases:
        forked, real = _both(monkeypatch, tool, args, cwd=str(tmp_path))
        assert forked.returncode == real.returncode, (tool, args, forked.stderr[-2000:], real.stderr[-2000:])
        assert _same(forked.stdout) == _same(real.stdout), (tool, args)
        assert _same(forked.stderr) == _same(real.stderr), (tool, args, forked.stderr[-2000:], real.stderr[-2000:])
    assert real.returncode == 1 and "none.pt" in real.stderr


def test_training_and_translating_print_what_real_processes_print(monkeypatch, tiny_data_bin, tmp_path):
    """Two updates and a translation of the test set, with stdin: the same lines (but
    for times), the same checkpoint's translations."""
    outputs = {}
    for fork in (True, False):
        monkeypatch.setattr(conftest, "FORK", fork)
        save_dir = tmp_path / str(fork)
        train = run_fairseq("fairseq-train", train_command("transformer", tiny_data_bin, str(save_dir)))
        lines = tiny_data_bin.lines("test", "src", segmented=True)[:3]
        translate = run_fairseq("fairseq-interactive", [
            tiny_data_bin.data_bin, "--user-dir", USER_DIR, "--path", save_dir / "checkpoint_last.pt",
            "--source-lang", "src", "--target-lang", "tgt", "--beam", "2"], input="\n".join(lines) + "\n")
        outputs[fork] = [_same(text.replace(str(save_dir), "<dir>"))
                         for p in (train, translate) for text in (p.stdout, p.stderr)]
        assert "| INFO | fairseq_cli.train | " in train.stdout  # (fairseq-train's logging: stdout)
        assert translate.stdout.count("\nH-") == 3
    assert outputs[True] == outputs[False]


def test_a_forked_command_past_its_time_is_killed_with_its_group(monkeypatch, tiny_data_bin, tmp_path):
    monkeypatch.setattr(conftest, "FORK", True)
    started = set()

    class Recording(set):
        def add(self, pid):
            started.add(pid)
            super().add(pid)

    monkeypatch.setattr(conftest, "_CHILD_GROUPS", Recording())
    args = train_command("transformer", tiny_data_bin, str(tmp_path / "run"), max_update=100000)
    with pytest.raises(pytest.fail.Exception, match="command ran longer than 2 s and was killed"):
        run_fairseq("fairseq-train", args, timeout=2)
    (pid,) = started
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
    assert not conftest._CHILD_GROUPS


PRELOAD_SCRIPT = r'''
import os, sys
sys.path.insert(0, sys.argv[1])
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode


class Calls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__qualname__", str(func)))
        return func(*args, **(kwargs or {}))


class Operators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


import zygote

with Calls() as calls, Operators() as operators:
    zygote._preload(*sys.argv[2:])
print(len(os.listdir("/proc/self/task")), sorted(set(calls.seen + operators.seen)))
with Calls() as calls, Operators() as operators:  # (the probe: an operation is seen)
    torch.zeros(2) + 1
print(sorted(set(calls.seen + operators.seen)))
'''


def test_the_zygote_runs_no_torch_operation_and_no_thread():
    """Forking a process whose OpenMP (or any) threads have started can deadlock the
    child: the imports of fairseq-train's zygote (fairseq, fairseq_cli, this package)
    run no torch function or operator (a probe after them is seen) and leave one
    thread."""
    import subprocess
    import sys

    tool = "fairseq-train"
    out = subprocess.run([sys.executable, "-c", PRELOAD_SCRIPT, os.path.dirname(conftest.ZYGOTE), tool_path(tool),
                          conftest._console_entries()[tool], USER_DIR], capture_output=True, text=True, check=True,
                         env=tool_env()).stdout
    preload, probe = out.strip().splitlines()[-2:]
    assert preload == "1 []", out
    assert "aten.zeros.default" in probe and "aten.add.Tensor" in probe, out


def test_an_address_space_limit_is_applied_to_a_forked_command(monkeypatch, tiny_data_bin, tmp_path):
    """``prlimit --as=N`` before a script: forked with the limit. 300 MB, less than
    the imports take (the zygote's address space is the real process's after them):
    the command fails both ways; 1.5 GB: it trains both ways."""
    for limit, fails in ((300 << 20, True), (1536 << 20, False)):
        for fork in (True, False):
            monkeypatch.setattr(conftest, "FORK", fork)
            args = train_command("transformer", tiny_data_bin, str(tmp_path / f"{limit}{fork}"))
            proc = conftest.run_command(["prlimit", f"--as={limit}", "--", tool_path("fairseq-train"), *args],
                                        env=tool_env(), timeout=120)
            assert (proc.returncode != 0) == fails, (limit, fork, proc.stderr[-2000:])


SCRIPT = r'''
fairseq-localness-average --inputs missing --output out.pt; echo "average: status $?"
echo "the cat sat on the mat" | fairseq-score --ref ref.txt | tail -1; echo "score: status ${PIPESTATUS[1]}"
rm -f in; mkfifo in  # (open for writing below: the command waits on its stdin until killed)
for signal in TERM KILL; do
    fairseq-score --ref ref.txt < in > /dev/null & pid=$!  # (a real one may still be importing)
    exec 3> in
    sleep 3; kill -$signal $pid; wait $pid; echo "$signal: status $?"
    # the input stays open (fd 4) to the end: a command whose stand-in was killed
    # outright is ended by the zygote's kill, which may come a moment after the shell
    # moves on, not by the end of its input
    exec 4>&3 3>&-
done
reading() {  # a process is waiting on the fifo $1 as its input: a command past its imports
    local p wchan
    for p in /proc/[0-9]*; do
        [[ "$p/fd/0" -ef "$1" ]] || continue
        wchan=; read -r wchan < "$p/wchan" 2>/dev/null  # (no newline at its end)
        case "$wchan" in *pipe_read*|pipe_wait) return 0 ;; esac
    done
    return 1
}
rm -f in2; mkfifo in2
set -m  # (a background job that does not ignore SIGINT)
fairseq-score --ref ref.txt < in2 > /dev/null 2> int.err & pid=$!
exec 3> in2
# SIGINT once the command reads its input: during a real one's imports a
# KeyboardInterrupt may end it otherwise (or be caught by an import)
for _ in $(seq 300); do reading in2 && break; sleep 0.2; done
kill -INT $pid; wait $pid; echo "INT: status $?"
exec 3>&-
'''


def test_the_console_scripts_a_shell_script_starts_are_forked_and_end_as_real_processes(monkeypatch, tmp_path):
    """A shell script's ``fairseq-*`` commands go through the stand-ins of
    ``tests/fork_client.py``: the same output and statuses as real processes; a
    ``SIGTERM`` or ``SIGINT`` to the stand-in reaches the command (``SIGINT``: the
    command's own ``KeyboardInterrupt``, status 130), and a stand-in killed outright
    takes its command with it."""
    (tmp_path / "ref.txt").write_text("the cat sat on the mat\n")
    log = tmp_path / "commands.log"
    monkeypatch.setenv(conftest.FORK_LOG_ENV, str(log))
    outputs = {}
    for fork in (True, False):
        monkeypatch.setattr(conftest, "FORK", fork)
        # (the shell starts with SIGINT at its default: one that a pytest worker or its
        # caller ignores would be ignored by the shell's jobs too, even under set -m)
        p = conftest.run_command(["env", "--default-signal=INT", "bash", "-c", SCRIPT], cwd=str(tmp_path),
                                 env=tool_env(), timeout=120)
        outputs[fork] = (p.returncode, _same(p.stdout), re.sub(r":\s+\d+ Killed", ": <pid> Killed", _same(p.stderr)))
        interrupted = (tmp_path / "int.err").read_text()
        assert interrupted.rstrip().endswith("KeyboardInterrupt"), interrupted  # (the command's own)
        assert "fork_client" not in interrupted
        if fork:
            forked = [line.split("\t")[2] for line in log.read_text().splitlines() if line.startswith("forked")]
            assert [os.path.basename(c.split()[0]) for c in forked] == \
                ["fairseq-localness-average"] + ["fairseq-score"] * 4, log.read_text()
            zygote = conftest._SERVERS[(tool_path("fairseq-score"), "")].proc.pid
            deadline = time.monotonic() + 10
            while _children(zygote) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _children(zygote)  # the killed stand-in's command is gone too
    assert outputs[True] == outputs[False]
    code, out, _ = outputs[True]
    assert code == 0 and "average: status 2" in out and "BLEU4 = 100.00" in out and "score: status 0" in out
    assert "TERM: status 143" in out and "KILL: status 137" in out and "INT: status 130" in out


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()
