"""Shared fixtures and helpers for running fairseq through its real command lines.

- ``tiny_data_bin`` (session fixture): a small corpus from the embedded generator,
  segmented with sentencepiece and binarized with fairseq's preprocessing, built once
  per test session (~6 s). Returns a :class:`TinyData`.
- :func:`run_fairseq`: run a fairseq (or fairseq-localness) command line installed
  next to this Python, with the output captured; raises with the tail of stderr
  if the command fails.
- :func:`train_and_generate`: train any registered architecture for a couple of
  updates with tiny dimensions, then translate the tiny test set with
  ``fairseq-generate`` (beam 2), checking that every sentence was translated.
- ``one_thread``: one torch thread for the test (tiny matrices).

Each fairseq process costs ~4-5 s of start-up (importing fairseq), so a test that
goes through the CLI should start as few of them as it can. :func:`run_command`
forks the console scripts of fairseq and of this package from a process that has
done those imports (``tests/zygote.py``, :func:`_fork_server`; docs/testing.md), and
so do the shell scripts that tests run, through the stand-ins that :func:`tool_env`
puts first on ``PATH`` (``tests/fork_client.py``, :class:`_ScriptForks`);
``FAIRSEQ_LOCALNESS_TEST_FORK=0`` runs them all as real subprocesses.

Time limits: every test has one (``pytest.ini``: 300 s, fixtures included; a slow
test raises its own with ``@pytest.mark.timeout(N)``). When a test runs past it,
:func:`pytest_timeout_set_timer` prints ``TIMEOUT: <test id>`` before pytest-timeout
dumps the threads' stacks and ends the run. With ``FAIRSEQ_LOCALNESS_TEST_STATUS``
set to a file name, the id of each test is written there when it starts (``running
<id>``), when it times out (``timeout <id>``) and ``finished`` at the end of the
session, so a supervisor (``.ci/run``) can name a test that hung or crashed the run.

Commands run by :func:`run_command` (and so :func:`run_fairseq`, :func:`run_script`)
get a process group of their own, killed as a whole when the command or the test
runs out of time, so no worker outlives its test.

Process groups: ``torch.distributed.init_process_group`` is refused in the pytest
process (:func:`_refuse_process_groups`): a test that needs one runs it in a
subprocess with a timeout, where a hang (gloo waiting for a peer) cannot stop the
suite.
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import List, Optional, Sequence

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")
BIN_DIR = os.path.dirname(sys.executable)


def _find_user_dir() -> str:
    import importlib.util

    spec = importlib.util.find_spec("fairseq_localness")
    assert spec is not None, "fairseq_localness is not installed in this Python (run make install)"
    return list(spec.submodule_search_locations)[0]


USER_DIR = _find_user_dir()
"""The --user-dir for every fairseq command: the installed fairseq_localness package."""

TINY_MODEL_ARGS = [
    "--encoder-layers", "3", "--decoder-layers", "3",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
]
"""Model size used by :func:`train_and_generate` unless told otherwise."""


def pytest_configure(config):
    _refuse_process_groups()
    if hasattr(config.option, "loadscopereorder"):
        # pytest-xdist (3.x) would hand out the files by their number of tests, most
        # first, in place of the order of pytest_collection_modifyitems: the long files
        # with few tests (tests/test_localness_cli.py, tests/test_readme.py, ...) would
        # come last and run alone at the end
        config.option.loadscopereorder = False
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # `make test` runs one worker more than the cores (pytest-xdist): one torch thread each,
        # as the commands the tests start have (tool_env), so workers do not fight.
        import torch

        torch.set_num_threads(1)


LONGEST_FIRST = (
    "test_slurm.py", "test_pipeline.py", "test_rehearse.py", "test_localness_cli.py", "test_checkpoint_limits.py",
    "test_hybrid_transformer.py", "test_dc_transformer.py", "test_readme.py", "test_train_script.py",
    "test_layerdrop.py", "test_hysan_transformer.py", "test_analysis.py", "test_time_limits.py", "test_distributed.py",
    "test_checkpoint_safety.py", "test_evaluation.py", "test_faults.py", "test_checkpoint_files.py",
)
"""Test files started before the others, longest first (:func:`pytest_collection_modifyitems`):
the order of their times in a run of ``make test`` on 2 cores (``--durations``)."""


def pytest_collection_modifyitems(session, config, items):
    """The longest files start first. pytest-xdist (``--dist loadfile``) hands whole
    files to the workers in collection order (its reordering by the number of tests is
    turned off in :func:`pytest_configure`), each worker taking the next file as it
    finishes one, so a long file collected late would run alone at the end while the
    other worker has nothing left: the files of :data:`LONGEST_FIRST` come first, in its
    order (tests/test_slurm.py, 5.5 minutes alone, most of it waiting for its cluster's
    jobs, overlaps the others), then the others, the most tests first (the files of
    a few short tests make the end)."""
    counts = {}
    for item in items:
        name = os.path.basename(str(item.fspath))
        counts[name] = counts.get(name, 0) + 1

    def rank(item):
        name = os.path.basename(str(item.fspath))
        if name in LONGEST_FIRST:
            return LONGEST_FIRST.index(name), 0, name
        return len(LONGEST_FIRST), -counts[name], name

    items.sort(key=rank)


@pytest.fixture
def one_thread():
    """Tiny matrices: one thread (two OpenMP threads on a shared 2-core machine wait
    for each other far longer than these products take)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# --------------------------------------------------------------------------- time limits
STATUS_ENV = "FAIRSEQ_LOCALNESS_TEST_STATUS"


def _status_path() -> Optional[str]:
    """The status file of this process: ``$FAIRSEQ_LOCALNESS_TEST_STATUS`` itself, or
    ``<it>.<worker>`` in a pytest-xdist worker (``gw0``, ``gw1``, ...), so parallel
    workers do not overwrite each other's state."""
    path = os.environ.get(STATUS_ENV)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return f"{path}.{worker}" if path and worker else path


def _write_status(text: str) -> None:
    path = _status_path()
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")


def pytest_runtest_logstart(nodeid, location):
    _write_status(f"running {nodeid}")


def pytest_sessionfinish(session, exitstatus):
    _close_fork_servers()
    _write_status("finished")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item, settings):
    """pytest-timeout's thread method, with the test named first on the terminal and
    in the status file (pytest-timeout itself prints only the stacks)."""
    if settings.method != "thread":
        return None
    import pytest_timeout

    def expire():
        capman = item.config.pluginmanager.getplugin("capturemanager")
        if capman:
            capman.suspend_global_capture(item)
        terminal = item.config.get_terminal_writer()
        terminal.line("")
        terminal.sep("!", f"TIMEOUT: {item.nodeid} ran longer than {settings.timeout:g} s", red=True)
        terminal.flush()
        _write_status(f"timeout {item.nodeid}")
        for pgid in list(_CHILD_GROUPS):  # the test's commands would outlive the run
            _kill_group(pgid)
        pytest_timeout.timeout_timer(item, settings)  # dumps the stacks, os._exit(1)

    timer = threading.Timer(settings.timeout, expire)
    timer.name = f"pytest_timeout {item.nodeid}"
    timer.daemon = True

    def cancel():
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel
    timer.start()
    return True


def _refuse_process_groups():
    import torch.distributed as dist

    def init_process_group(*args, **kwargs):
        raise RuntimeError(
            "tests create torch.distributed process groups in a subprocess (with a timeout), never in the "
            "pytest process, where a hang would stop the whole suite; see tests/test_distributed.py")

    if dist.is_available():
        dist.init_process_group = init_process_group


# --------------------------------------------------------------------------- commands
def tool_path(tool: str) -> str:
    """The console script ``tool`` installed next to this Python (else from PATH)."""
    path = os.path.join(BIN_DIR, tool)
    if os.path.exists(path):
        return path
    found = shutil.which(tool)
    assert found, f"{tool} is not installed next to {sys.executable} nor on PATH"
    return found


def tool_env(extra: Optional[dict] = None) -> dict:
    """Environment for subprocesses: this Python's bin directory first on PATH (and
    before it the stand-ins that fork the console scripts a shell script starts,
    :class:`_ScriptForks`), one thread per process (tiny models; keeps parallel test
    runs from fighting)."""
    env = dict(os.environ)
    env["PATH"] = BIN_DIR + os.pathsep + env.get("PATH", "")
    forks = script_fork_dir()
    if forks is not None:  # the scripts' console scripts, forked (tests/fork_client.py)
        env["PATH"] = forks.directory + os.pathsep + env["PATH"]
        env[forks.SOCKET_ENV] = forks.socket_path
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.setdefault("PYTHONWARNINGS", "ignore")
    if extra:
        env.update(extra)
    return env


def fairseq_import_stub(directory) -> str:
    """Write ``directory/python``, a stand-in for the scripts' ``$PYTHON``: the
    checks they run first (the architectures, the fairseq-train arguments: an import
    of fairseq, seconds per call; ``fairseq-localness-train-check``, which the scripts
    run as a module where ``$PYTHON``'s directory does not have it) pass at once,
    everything else runs this Python. Returns its path."""
    python = os.path.join(str(directory), "python")
    with open(python, "w") as f:
        f.write('#!/bin/bash\n[[ "$*" == *"import fairseq_localness"* ]] && exit 0\n'
                '[[ "$*" == *"fairseq_localness.cli.train_check "* ]] && exit 0\n'
                f'exec {shlex.quote(sys.executable)} "$@"\n')
    os.chmod(python, 0o755)
    return python


def _failure(cmd, proc) -> str:
    return (
        f"command failed with exit status {proc.returncode}:\n  {' '.join(map(str, cmd))}\n"
        f"--- stdout (end) ---\n{proc.stdout[-3000:]}\n--- stderr (end) ---\n{proc.stderr[-3000:]}"
    )


_CHILD_GROUPS = set()
"""Process groups of the commands running now (see :func:`run_command`)."""


def _kill_group(pgid: int) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_command(cmd: Sequence, cwd: Optional[str] = None, input: Optional[str] = None,
                env: Optional[dict] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` in a process group of
    its own: past ``timeout`` the whole group (torchrun's workers, a tool's children)
    is killed and the test fails naming the command; if the test itself runs out of
    time, the group is killed before the run ends.

    A console script of fairseq or of this package is forked from a process that
    has already imported what it imports (:func:`_fork_server`, ``tests/zygote.py``)
    unless ``FAIRSEQ_LOCALNESS_TEST_FORK=0``; everything else is a subprocess."""
    cmd = [str(a) for a in cmd]
    limit, argv = _address_space_limit(cmd)
    server = _fork_server(argv, cwd, env)
    if server is not None:
        proc = server.run(cmd, argv, cwd, input, env, timeout, limit)
        if proc is not None:
            _log_fork(True, argv)
            return proc
    _log_fork(False, cmd)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, start_new_session=True,
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _CHILD_GROUPS.add(proc.pid)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        _timed_out(cmd, timeout, err)
    finally:
        _CHILD_GROUPS.discard(proc.pid)
        if proc.poll() is None:
            _kill_group(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _timed_out(cmd, timeout, err):
    pytest.fail(f"command ran longer than {timeout:g} s and was killed with its processes:\n  {' '.join(cmd)}\n"
                f"--- stderr (end) ---\n{err[-3000:]}", pytrace=False)


# --------------------------------------------------------------------------- fork server
FORK_ENV = "FAIRSEQ_LOCALNESS_TEST_FORK"
"""``0``: every command is a real subprocess (no fork server)."""

FORK = os.environ.get(FORK_ENV, "1") != "0"
"""Whether :func:`run_command` forks console scripts (:data:`FORK_ENV`, read once)."""

ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "zygote.py")

_RUNTIME_ENV = {"PYTEST_CURRENT_TEST", "FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS", "FAIRSEQ_LOCALNESS_TEST_FORK_LOG"}
"""The variables a command's environment may change from the zygote's and still be
forked: read only while the command runs (fairseq_localness.checkpoint.errors.TRUST_ENV
is read at each load; the fork log is written by the tests' process alone), never at
start-up or import. Any other difference (PYTHON*,
OMP_*, LOGLEVEL, read when the interpreter starts or a module is imported) runs a
real subprocess."""


def _address_space_limit(cmd: List[str]):
    """``(N, the command)`` for ``prlimit --as=N -- <command>`` (the forked child
    sets the same limit on itself, as prlimit does before it runs the command; the
    zygote's address space, which the child starts with, is the real process's after
    its imports, a few MB more: a limit leaves it no more room than a real process),
    else ``(None, cmd)``."""
    import re

    if len(cmd) > 3 and cmd[0] == "prlimit" and re.fullmatch(r"--as=\d+", cmd[1]) and cmd[2] == "--":
        return int(cmd[1][len("--as="):]), cmd[3:]
    return None, cmd


def _console_entries() -> dict:
    """``{script name: "module:function"}`` for the console scripts of fairseq
    (``fairseq_cli``) and of this package."""
    global _ENTRIES
    if _ENTRIES is None:
        from importlib.metadata import entry_points

        _ENTRIES = {ep.name: ep.value for ep in entry_points(group="console_scripts")
                    if ep.value.split(".")[0] in ("fairseq_cli", "fairseq_localness")}
    return _ENTRIES


_ENTRIES = None
_SERVERS = {}
"""The running fork servers, by (script, user dir)."""
_SERVERS_LOCK = threading.Lock()


FORK_LOG_ENV = "FAIRSEQ_LOCALNESS_TEST_FORK_LOG"
"""A file: each command a test or its scripts start is appended to it, as ``forked``
or ``process`` (a real one), with the test's id."""


def _log_fork(forked: bool, cmd: Sequence) -> None:
    path = os.environ.get(FORK_LOG_ENV)
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
        with open(path, "a") as f:
            f.write(f"{'forked' if forked else 'process'}\t{test}\t{shlex.join(map(str, cmd))[:300]}\n")


def _forking_env(env: dict) -> dict:
    return {k: v for k, v in env.items() if k not in _RUNTIME_ENV}


_SHELL_ENV = {"PATH", "PWD", "OLDPWD", "SHLVL", "_", "PYTHON"}
"""Variables a shell script changes on its way (``PATH``: ``scripts/lib.sh`` puts its
Python's directory first; ``PYTHON``: the interpreter the scripts run, read by no
interpreter) that a command started by the script may have changed and still be
forked."""

_STARTUP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA_", "NCCL_",
                     "LC_", "HYDRA_", "FAIRSEQ", "MALLOC_", "LD_", "SCIPY_", "SKLEARN_", "JOBLIB_", "NUMEXPR_",
                     "NUMPY_", "MPL", "TQDM_")
_STARTUP_NAMES = {"LOGLEVEL", "LANG", "LANGUAGE", "TMPDIR", "TEMP", "TMP", "HOME", "TZ", "TERM", "COLUMNS"}


def _script_env_forks(env: dict, base: dict) -> bool:
    """Whether a command that a shell script started with ``env`` may be forked from a
    zygote started with ``base``: every variable of ``base`` unchanged (beyond
    :data:`_RUNTIME_ENV` and :data:`_SHELL_ENV`), and the variables the script added
    none that an interpreter, torch, fairseq or this package may read at start-up or
    import (``PYTHON*``, ``OMP_*``, ``FAIRSEQ*``, ``LOGLEVEL``, locale, temporary
    directory, ...; :data:`_STARTUP_PREFIXES`, :data:`_STARTUP_NAMES`). The others
    (the scripts' own settings) are read while the command runs, from the environment
    the fork takes. The commands of a SLURM job run as real processes, tracked by
    the job."""
    if "SLURM_JOB_ID" in env and "SLURM_JOB_ID" not in base:
        return False  # (a SLURM job's commands: real processes, in the job's process tracking)
    ignored = _RUNTIME_ENV | _SHELL_ENV
    for key, value in base.items():
        if key not in ignored and env.get(key) != value:
            return False
    return not any(key not in base and key not in ignored
                   and (key.startswith(_STARTUP_PREFIXES) or key in _STARTUP_NAMES) for key in env)


def _fork_server(cmd: List[str], cwd: Optional[str], env: Optional[dict],
                 scripted: bool = False) -> Optional["_ForkServer"]:
    """The fork server for ``cmd``, started on first use, or None where ``cmd`` must
    run as a real subprocess: the switch is off; it is not a console script of
    fairseq or of this package installed next to this Python (bash scripts,
    torchrun, ``python -c``; ``prlimit --as=N --`` before a script is forked with
    the limit, :func:`_address_space_limit`); a script of fairseq whose command line names
    a ``--user-dir`` other than this package's, or names it twice or as
    ``--user-dir=...`` (the zygote of a fairseq script imports this package, through
    fairseq, only for this package's ``--user-dir``; without one, fairseq alone, as
    the real run); an environment that differs from
    the zygote's beyond :data:`_RUNTIME_ENV` (``scripted``, a command a shell script
    started: :func:`_script_env_forks`); a ``cwd`` that is not a directory (the
    subprocess raises as before)."""
    if not FORK or env is None:
        return None
    script = cmd[0]
    entry = _console_entries().get(os.path.basename(script))
    if entry is None or os.path.dirname(script) != BIN_DIR or (cwd is not None and not os.path.isdir(cwd)):
        return None
    user_dir = ""
    named = [i for i, a in enumerate(cmd) if a.startswith("--user")]
    if entry.startswith("fairseq_cli.") and named:
        if len(named) != 1 or cmd[named[0]] != "--user-dir" or cmd[named[0] + 1:named[0] + 2] != [USER_DIR]:
            return None
        user_dir = USER_DIR
    base = _forking_env(tool_env())
    if not (_script_env_forks(env, base) if scripted else _forking_env(env) == base):
        return None
    key = (script, user_dir)
    with _SERVERS_LOCK:  # (tests may run commands from threads: one zygote each)
        server = _SERVERS.get(key)
        if server is None or server.env != base:
            if server is not None:
                server.close()
            server = _SERVERS[key] = _ForkServer(script, entry, user_dir, base)
    return server if server.usable else None


class _ForkServer:
    """The tests' side of a ``tests/zygote.py`` process (its docstring says how it
    works and why)."""

    def __init__(self, script: str, entry: str, user_dir: str, env: dict):
        import socket

        self.script, self.env, self.usable = script, env, False
        self.lock = threading.Lock()
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, ZYGOTE, str(theirs.fileno()), script, entry, user_dir],
                                     pass_fds=[theirs.fileno()], env=env, cwd=tempfile.gettempdir(),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.log,
                                     start_new_session=True)
        theirs.close()
        self.control.settimeout(300)
        try:
            answer = self.control.recv(4096).decode()
        except OSError as e:
            answer = f"error {e}"
        self.control.settimeout(None)
        if answer == "ready":
            self.usable = True
        else:
            self._give_up(answer or "error it ended while importing")

    def _give_up(self, why: str) -> None:
        import warnings

        self.log.seek(0)
        warnings.warn(f"fork server of {self.script} unusable, its commands run as subprocesses: {why}\n"
                      f"{self.log.read().decode(errors='replace')[-2000:]}")
        self.close()

    def close(self) -> None:
        self.usable = False
        self.control.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc.pid)
            self.proc.wait()

    def hand_on(self, conn, request: dict, fds: List[int]) -> bool:
        """Send a fork client's request (``tests/fork_client.py``) to the zygote, with
        the client's socket to answer on and its stdio ``fds``: the zygote answers the
        client itself. False if it could not be sent."""
        return self.usable and not self._send(request, [conn.fileno()] + list(fds))

    def _send(self, request: dict, fds: List[int]) -> str:
        """Send ``request`` with ``fds`` (the socket to answer on, stdin, stdout, stderr)
        to the zygote: "" once sent, else ``error <why>``."""
        import json
        import socket

        try:
            with self.lock:
                socket.send_fds(self.control, [json.dumps(request).encode()], fds)
        except OSError as e:
            return f"error {e}"
        return ""

    def run(self, cmd: List[str], argv: List[str], cwd: Optional[str], input: Optional[str], env: dict,
            timeout: float, limit: Optional[int] = None) -> Optional[subprocess.CompletedProcess]:
        """Run ``argv`` (``cmd`` without its ``prlimit --as=<limit> --``) in a child
        of the zygote, as :func:`run_command` runs ``cmd`` as a subprocess; None if
        the zygote could not fork it (it then runs as one)."""
        import socket

        mine, theirs = socket.socketpair()
        stdin_r, stdin_w = os.pipe() if input is not None else (os.open(os.devnull, os.O_RDONLY), None)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        request = {"argv": argv, "cwd": os.path.abspath(cwd or os.getcwd()), "env": env, "address_space": limit}
        sent = self._send(request, [theirs.fileno(), stdin_r, out_w, err_w])
        for fd in (stdin_r, out_w, err_w):
            os.close(fd)
        theirs.close()
        answers = mine.makefile("r")
        started = sent or answers.readline().strip()
        if not started.startswith("pid "):
            for fd in (stdin_w, out_r, err_r):
                if fd is not None:
                    os.close(fd)
            answers.close()
            mine.close()
            self._give_up(started or "error it ended")
            return None
        pid = int(started.split()[1])
        _CHILD_GROUPS.add(pid)
        status = None
        try:
            out, err, finished = _communicate(stdin_w, out_r, err_r, input, timeout)
            if not finished:
                _kill_group(pid)
                out, err, _ = _communicate(None, out_r, err_r, None, None, out, err)
                _timed_out(cmd, timeout, err)
            mine.settimeout(timeout)
            line = answers.readline().strip()
            if not line.startswith("status "):
                raise RuntimeError(f"the fork server of {self.script} ended while running: {' '.join(cmd)}")
            status = int(line.split()[1])
        finally:
            _CHILD_GROUPS.discard(pid)
            if status is None:
                _kill_group(pid)
            answers.close()
            mine.close()
        return subprocess.CompletedProcess(cmd, os.waitstatus_to_exitcode(status), out, err)


def _communicate(stdin_w, out_r, err_r, input, timeout, out="", err=""):
    """Popen.communicate on raw descriptors: writes ``input`` (text) to ``stdin_w``
    and reads ``out_r``/``err_r`` to their end, decoded as Popen's ``text=True``
    does; closes them all. Returns (stdout, stderr, finished before ``timeout``)."""
    import locale
    import selectors
    import time

    encoding = locale.getpreferredencoding(False)
    data = {out_r: [], err_r: []}
    pending = memoryview(input.encode(encoding)) if stdin_w is not None else None
    deadline = None if timeout is None else time.monotonic() + timeout
    finished = True
    with selectors.DefaultSelector() as selector:
        for fd in (out_r, err_r):
            selector.register(fd, selectors.EVENT_READ)
        if stdin_w is not None:
            if pending:
                selector.register(stdin_w, selectors.EVENT_WRITE)
            else:
                os.close(stdin_w)
        while selector.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                finished = False
                break
            for key, _ in selector.select(left):
                fd = key.fd
                if fd == stdin_w:
                    try:
                        pending = pending[os.write(fd, pending[:65536]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(fd)
                        os.close(fd)
                    continue
                chunk = os.read(fd, 65536)
                if chunk:
                    data[fd].append(chunk)
                else:
                    selector.unregister(fd)
        for key in list(selector.get_map().values()):
            if key.fd == stdin_w:
                os.close(stdin_w)
    if finished:
        os.close(out_r)
        os.close(err_r)

    def text(chunks):
        return b"".join(chunks).decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

    return out + text(data[out_r]), err + text(data[err_r]), finished


def _close_fork_servers():
    global _SCRIPT_FORKS
    if _SCRIPT_FORKS:
        _SCRIPT_FORKS.close()
    _SCRIPT_FORKS = None
    for server in _SERVERS.values():
        server.close()
    _SERVERS.clear()


class _ScriptForks:
    """The console scripts that the tests' shell scripts start, forked: a directory of
    stand-ins (``tests/fork_client.py``), one per console script of fairseq and of this
    package, and a ``python`` that runs this Python, put first on ``PATH`` by
    :func:`tool_env`; and the socket they ask on, answered by a thread of this process
    (the test's own: a command started by the test's scripts asks the process that
    runs the test). Each request goes to :func:`_fork_server` (``scripted``) and on
    to the zygote with the stand-in's socket and stdio, or is answered ``exec``: the
    stand-in then runs the real script."""

    from fork_client import SOCKET_ENV

    def __init__(self):
        import socket

        self.directory = tempfile.mkdtemp(prefix="fairseq-localness-forks-")
        tests = os.path.dirname(os.path.abspath(__file__))
        for name in _console_entries():
            real = os.path.join(BIN_DIR, name)
            if os.path.exists(real):
                self._write(name, f"#!{sys.executable} -SEs\nimport sys\nsys.path.insert(0, {tests!r})\n"
                                  f"from fork_client import main\nmain({real!r})\n")
        self._write("python", f"#!/bin/bash\nexec {shlex.quote(sys.executable)} \"$@\"\n")
        self.socket_path = os.path.join(self.directory, "fork.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.listener.bind(self.socket_path)
            self.listener.listen(64)
        except OSError:
            self.close()
            raise
        threading.Thread(target=self._accept, name="script forks", daemon=True).start()

    def _write(self, name: str, text: str) -> None:
        path = os.path.join(self.directory, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed at the end of the session
                return
            threading.Thread(target=self._answer, args=(conn,), name="script fork", daemon=True).start()

    def _answer(self, conn) -> None:
        import json
        import socket

        fds, forked, argv = [], False, ["?"]
        try:
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            request = json.loads(message)
            argv, cwd, env = request["argv"], request["cwd"], request["env"]
            server = _fork_server(argv, cwd, env, scripted=True) if len(fds) == 3 else None
            forked = server is not None and server.hand_on(conn, request, fds)
        except Exception:
            forked = False
        finally:
            if not forked:  # (once handed on, only the zygote answers)
                try:
                    conn.send(b"exec\n")
                except OSError:
                    pass
            for fd in fds:
                os.close(fd)
            conn.close()
        _log_fork(forked, argv)

    def close(self) -> None:
        self.listener.close()
        shutil.rmtree(self.directory, ignore_errors=True)


_SCRIPT_FORKS = None
_SCRIPT_FORKS_PID = None


def script_fork_dir() -> Optional[_ScriptForks]:
    """The stand-ins' directory and socket of this process (:class:`_ScriptForks`),
    made on first use; None without forking (``FAIRSEQ_LOCALNESS_TEST_FORK=0``)."""
    global _SCRIPT_FORKS, _SCRIPT_FORKS_PID
    if not FORK:
        return None
    with _SERVERS_LOCK:
        if _SCRIPT_FORKS_PID != os.getpid():
            _SCRIPT_FORKS_PID = os.getpid()
            try:
                _SCRIPT_FORKS = _ScriptForks()
            except OSError as e:  # (a socket path too long, ...): every command runs for real
                import warnings

                warnings.warn(f"the shell scripts' console scripts run as real processes: {e}")
                _SCRIPT_FORKS = None
    return _SCRIPT_FORKS


def run_fairseq(
    tool: str,
    args: Sequence,
    cwd: Optional[str] = None,
    check: bool = True,
    input: Optional[str] = None,
    env: Optional[dict] = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """Run ``tool`` (e.g. ``fairseq-train``) with ``args``; output captured as text.

    With ``check`` (default) a non-zero exit fails the test with the command and the
    end of its stdout/stderr.
    """
    cmd = [tool_path(tool)] + [str(a) for a in args]
    proc = run_command(cmd, cwd=cwd, input=input, env=tool_env(env), timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(_failure(cmd, proc), pytrace=False)
    return proc


def run_script(script: str, args: Sequence, cwd: Optional[str] = None, check: bool = True,
               env: Optional[dict] = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``scripts/<script>`` with bash; like :func:`run_fairseq`."""
    cmd = ["bash", os.path.join(SCRIPTS, script)] + [str(a) for a in args]
    proc = run_command(cmd, cwd=cwd, env=tool_env(env), timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(_failure(cmd, proc), pytrace=False)
    return proc


# --------------------------------------------------------------------------- tiny data
@dataclass
class TinyData:
    data_bin: str  # fairseq-preprocess output (joined dictionary, sentencepiece model copied in)
    raw_dir: str  # the generated corpus: {train,valid,test}.{src,tgt}, *.phenomena.jsonl
    bpe_dir: str  # segmented text
    src: str = "src"
    tgt: str = "tgt"

    @property
    def spm_model(self) -> str:
        return os.path.join(self.data_bin, "sentencepiece.bpe.model")

    def lines(self, split: str, lang: str, segmented: bool = False) -> List[str]:
        d = self.bpe_dir if segmented else self.raw_dir
        with open(os.path.join(d, f"{split}.{lang}"), encoding="utf-8") as f:
            return f.read().splitlines()


TINY_SIZES = dict(train_size=200, valid_size=16, test_size=12)  # test size: not a multiple of 8


def build_tiny_data(base_dir: str) -> TinyData:
    """Generate, segment (sentencepiece, joint) and binarize a tiny corpus in base_dir."""
    import sentencepiece as spm

    from fairseq_localness.corpus import CorpusConfig, write_corpus

    raw = os.path.join(base_dir, "raw")
    bpe = os.path.join(base_dir, "bpe")
    data_bin = os.path.join(base_dir, "data-bin")
    write_corpus(raw, CorpusConfig(seed=7, **TINY_SIZES))
    os.makedirs(bpe)
    prefix = os.path.join(bpe, "sentencepiece.bpe")
    spm.SentencePieceTrainer.train(
        input=",".join(os.path.join(raw, f"train.{x}") for x in ("src", "tgt")),
        model_prefix=prefix, vocab_size=120, model_type="bpe", character_coverage=1.0,
        hard_vocab_limit=False, bos_id=-1, eos_id=-1, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    for split in ("train", "valid", "test"):
        for lang in ("src", "tgt"):
            with open(os.path.join(raw, f"{split}.{lang}"), encoding="utf-8") as f:
                lines = f.read().splitlines()
            with open(os.path.join(bpe, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(" ".join(sp.encode(line, out_type=str)) + "\n" for line in lines)
    run_fairseq("fairseq-preprocess", [
        "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", os.path.join(bpe, "train"), "--validpref", os.path.join(bpe, "valid"),
        "--testpref", os.path.join(bpe, "test"), "--destdir", data_bin,
        "--joined-dictionary", "--workers", "1",
    ])
    shutil.copy(prefix + ".model", os.path.join(data_bin, "sentencepiece.bpe.model"))
    for name, value in (("SEGMENTATION", "sentencepiece"), ("TOKENIZATION", "none")):
        for d in (bpe, data_bin):
            with open(os.path.join(d, name), "w") as f:
                f.write(value + "\n")
    return TinyData(data_bin=data_bin, raw_dir=raw, bpe_dir=bpe)


_TINY: Optional[TinyData] = None


def get_tiny_data(base_dir: Optional[str] = None) -> TinyData:
    """The session's tiny data, built on first use (in base_dir, else a temp dir)."""
    global _TINY
    if _TINY is None:
        if base_dir is None:
            base_dir = tempfile.mkdtemp(prefix="fairseq_localness_tiny_")
            import atexit

            atexit.register(shutil.rmtree, base_dir, True)
        _TINY = build_tiny_data(base_dir)
    return _TINY


@pytest.fixture(scope="session")
def tiny_data_bin(tmp_path_factory) -> TinyData:
    """Tiny binarized corpus (``.data_bin``) and its raw text (``.raw_dir``)."""
    return get_tiny_data(str(tmp_path_factory.mktemp("tiny_data")))


# --------------------------------------------------------------------------- train + generate
def train_command(arch: str, data: TinyData, save_dir: str, extra_args: Sequence = (),
                  model_args: Sequence = TINY_MODEL_ARGS, max_update: int = 2) -> List[str]:
    """fairseq-train arguments for a few updates on the tiny data."""
    return [
        data.data_bin, "--user-dir", USER_DIR, "--task", "translation",
        "--source-lang", data.src, "--target-lang", data.tgt, "--arch", arch,
        "--optimizer", "adam", "--lr", "1e-3", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--max-tokens", "1024", "--max-update", str(max_update),
        "--save-dir", save_dir, "--seed", "1", "--num-workers", "0",
        "--log-format", "simple", "--log-interval", "1", "--no-progress-bar",
        *model_args, *extra_args,
    ]


@dataclass
class CliRun:
    checkpoint: str  # the trained checkpoint (checkpoint_last.pt)
    train_log: str  # fairseq-train's stdout + stderr
    generate_output: str  # fairseq-generate's stdout (S-/T-/H-/D-/P- lines)
    hypotheses: List[str]  # H- lines' text (segmented), in test-set order


def parse_hypotheses(generate_output: str) -> List[str]:
    """Hypotheses of fairseq-generate/-interactive output, ordered by sentence id."""
    hyps = {}
    for line in generate_output.splitlines():
        if line.startswith("H-"):
            ident, _score, text = (line[2:].split("\t") + ["", ""])[:3]
            hyps[int(ident)] = text
    return [hyps[i] for i in sorted(hyps)]


def train_and_generate(arch: str, extra_args: Sequence = (), tmp_path=None, *,
                       model_args: Sequence = TINY_MODEL_ARGS, max_update: int = 2, beam: int = 2,
                       data: Optional[TinyData] = None) -> CliRun:
    """Train ``arch`` for ``max_update`` updates and translate the tiny test set.

    ``extra_args`` go to fairseq-train after the tiny model size (so they can change
    it); pass ``model_args=[]`` to keep a preset's own dimensions. Fails the test if
    either command fails or a test sentence is left untranslated.
    """
    data = data or get_tiny_data()
    base = str(tmp_path) if tmp_path is not None else tempfile.mkdtemp(prefix="train_and_generate_")
    save_dir = os.path.join(base, "checkpoints")
    train = run_fairseq("fairseq-train", train_command(arch, data, save_dir, extra_args, model_args, max_update))
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.isfile(checkpoint), f"fairseq-train wrote no {checkpoint}:\n{train.stderr[-2000:]}"
    gen = run_fairseq("fairseq-generate", [
        data.data_bin, "--user-dir", USER_DIR, "--task", "translation",
        "--source-lang", data.src, "--target-lang", data.tgt, "--path", checkpoint,
        "--gen-subset", "test", "--beam", str(beam), "--batch-size", "5",
        "--max-len-a", "1.5", "--max-len-b", "5",
    ])
    hyps = parse_hypotheses(gen.stdout)
    n_test = len(data.lines("test", data.src))
    assert len(hyps) == n_test, f"translated {len(hyps)} of {n_test} test sentences:\n{gen.stdout[-2000:]}"
    return CliRun(checkpoint=checkpoint, train_log=train.stdout + train.stderr,
                  generate_output=gen.stdout, hypotheses=hyps)


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path):
    """``path`` is a file that starts as a PNG does."""
    assert os.path.isfile(path), f"{path} was not written"
    with open(path, "rb") as f:
        assert f.read(8) == PNG_MAGIC, f"{path} is not a PNG"
