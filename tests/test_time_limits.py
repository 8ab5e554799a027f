"""The test suite's own time limits: every test has one, a test that runs past it
stops the run at once and is named, and .ci/supervise names the test a run hung in
even when the per-test limit is off."""
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO, run_command, tool_env

HANG = '''
import time


def test_quick():
    pass


def test_hangs():
    time.sleep(600)


def test_after():
    pass
'''


def test_every_test_has_a_time_limit(pytestconfig):
    assert int(pytestconfig.getini("timeout")) == 300
    assert pytestconfig.getini("timeout_method") == "thread"


def _pytest(tmp_path, *options):
    (tmp_path / "test_hang.py").write_text(HANG)
    return [sys.executable, "-m", "pytest", "-c", os.path.join(REPO, "pytest.ini"), "--rootdir", str(tmp_path),
            "-p", "conftest", "-p", "no:cacheprovider", *options, str(tmp_path / "test_hang.py")]


def _env(tmp_path):
    env = tool_env({"PYTHONPATH": os.path.join(REPO, "tests")})
    env.pop("FAIRSEQ_LOCALNESS_TEST_STATUS", None)
    for name in list(env):  # this suite's own pytest-xdist worker must not leak into the run under test
        if name.startswith("PYTEST_XDIST") or name == "PYTEST_CURRENT_TEST":
            del env[name]
    return env


def test_a_hung_test_is_named_and_stops_the_run(tmp_path):
    status = tmp_path / "status"
    env = dict(_env(tmp_path), FAIRSEQ_LOCALNESS_TEST_STATUS=str(status))
    start = time.monotonic()
    proc = subprocess.run(_pytest(tmp_path, "-o", "timeout=3"), capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert time.monotonic() - start < 60
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "TIMEOUT: test_hang.py::test_hangs ran longer than 3 s" in out, out[-3000:]
    assert "time.sleep(600)" in out  # the stacks of the hung test
    assert status.read_text().strip() == "timeout test_hang.py::test_hangs"
    assert "test_after" not in out  # the run stopped there


def test_supervise_names_the_test_a_run_hung_in(tmp_path):
    """With the per-test limit off, the total limit of .ci/supervise stops the run
    and names the test that was running."""
    start = time.monotonic()
    proc = subprocess.run(
        [os.path.join(REPO, ".ci", "supervise"), "--limit", "20", "--", *_pytest(tmp_path, "-o", "timeout=0")],
        capture_output=True, text=True, env=_env(tmp_path), cwd=tmp_path, timeout=120)
    assert time.monotonic() - start < 60
    assert proc.returncode == 124, (proc.returncode, proc.stderr[-2000:])
    assert ("supervise: TIMEOUT: the test run took longer than 20 s; it was stopped in "
            "test_hang.py::test_hangs") in proc.stderr


def test_supervise_passes_a_clean_run_through(tmp_path):
    proc = subprocess.run(
        [os.path.join(REPO, ".ci", "supervise"), "--", *_pytest(tmp_path, "-k", "quick")],
        capture_output=True, text=True, env=_env(tmp_path), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "supervise:" not in proc.stderr


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path):
    """run_command (behind run_fairseq and run_script) kills the command's whole
    process group, so no worker (torchrun's, a tool's) outlives the test."""
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="ran longer than 2 s and was killed with its processes"):
        run_command(["bash", "-c", "sleep 300 & echo $! > child.pid; wait"], timeout=2, cwd=tmp_path)
    assert time.monotonic() - start < 30
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    break  # killed, waiting to be reaped
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the command's child {pid} is still running")


def test_a_hung_test_is_named_with_parallel_workers(tmp_path):
    """`make test` runs pytest-xdist workers: a worker's hung test still ends that
    worker at its limit, the run fails, and .ci/supervise names the test from the
    worker's own status file."""
    pytest.importorskip("xdist")
    start = time.monotonic()
    proc = subprocess.run(
        [os.path.join(REPO, ".ci", "supervise"), "--",
         *_pytest(tmp_path, "-o", "timeout=3", "-n", "2", "-p", "xdist")],
        capture_output=True, text=True, env=_env(tmp_path), cwd=tmp_path, timeout=120)
    assert time.monotonic() - start < 90
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert ("supervise: TIMEOUT: test_hang.py::test_hangs ran past its time limit and was stopped; "
            "the run fails") in proc.stderr, proc.stderr[-2000:]
