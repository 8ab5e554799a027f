"""Helpers of the reproduce scripts' tests (tests/test_reproduce_*.py,
tests/test_rehearse.py): run a script of scripts/reproduce/, read the commands its
dry run prints, the value of an option in one of them."""
import os
import shlex
import subprocess

from conftest import REPO, tool_env

REPRO = os.path.join(REPO, "scripts", "reproduce")
SCRIPTS = ["yang2018_table4.sh", "xu2019_table1.sh", "xu2019_table2.sh", "song2019_table2.sh",
           "song2019_table3.sh", "song2019_table4.sh", "dc_table1.sh", "dc_table2.sh"]


def reproduce(script, *args, env=None, cwd=None):
    cmd = ["bash", os.path.join(REPRO, script)] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, env=tool_env(env), cwd=cwd, timeout=120)


def commands(stdout):
    """The dry run's commands (non-comment lines before the table), split like a shell."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("# table"):
            break
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


def by_script(cmds, name):
    return [c for c in cmds if (c[0] == "bash" and c[1].endswith("/" + name)) or (len(c) > 1 and c[1].endswith("/" + name))]


def opt(cmd, name):
    """The value of the last occurrence of option `name` in `cmd`."""
    idx = [i for i, w in enumerate(cmd) if w == name]
    assert idx, f"{name} missing from {shlex.join(cmd)}"
    return cmd[idx[-1] + 1]


def dry_run(script, work, *args):
    p = reproduce(script, "--dry-run", "--work-dir", work, *args)
    assert p.returncode == 0, p.stderr
    return p
