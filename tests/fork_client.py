"""The stand-in for a console script that the tests' shell scripts start
(``scripts/*.sh`` running ``fairseq-train``, ``fairseq-generate``, ...; docs/testing.md).

:func:`conftest.script_fork_dir` writes, for every console script of fairseq and of
this package, a file of that name whose first line runs this Python with ``-SEs`` (no
site packages, no ``PYTHON*`` variables: it starts in milliseconds) and which calls
:func:`main` with the real script's path. Put first on ``PATH`` (``tool_env``), the
scripts' own ``find_python`` (``scripts/lib.sh``) then takes its directory's
``python`` (which runs this Python) and keeps it first on ``PATH``.

:func:`main` asks the pytest worker that ran the test (the socket named by
:data:`SOCKET_ENV`) to start the command; the worker answers either ``exec`` (the
command must run as a real process: the stand-in replaces itself with the real
script next to the tests' Python, with its path as ``argv[0]``) or hands the request
on to the fork server of that script (``tests/zygote.py``), which forks the command
with the stand-in's directory, environment, arguments and stdin/stdout/stderr and
answers ``pid <n>`` and then ``status <waitpid status>`` on the same socket.

While the command runs, the stand-in is the process its shell waits for:
``SIGTERM``, ``SIGINT``, ``SIGHUP``, ``SIGQUIT``, ``SIGUSR1`` and ``SIGUSR2`` sent to it
are sent on to the command (those that come while it asks, once the command is
forked; those it was started with ignored, the command ignores too, as a real process
would); if the stand-in itself is killed, the
fork server sees its socket close and kills the command's process group. It ends
with the command's exit status, or by the signal that ended the command.
"""
import json
import os
import signal
import socket
import sys

from zygote import PASSED_ON as FORWARDED

SOCKET_ENV = "FAIRSEQ_LOCALNESS_TEST_FORK_SOCKET"


def _address_space():
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def _lines(conn):
    """The answer lines of the fork server, as they come."""
    pending = b""
    while True:
        data = conn.recv(4096)
        if not data:
            if pending:
                yield pending.decode()
            return
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            yield line.decode()


def _run_forked(path: str, real: str):
    """The command's waitpid status, or None where it must run as a real process."""
    # signals that come before the command's pid is known are kept and passed on then
    pending, target = [], []

    def forward(signum, _frame):
        if not target:
            pending.append(signum)
            return
        try:
            os.kill(target[0], signum)  # (to the command, as a real `kill <pid>`)
        except OSError:
            pass

    ignored = [s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
    for signum in FORWARDED:
        if signum not in ignored:
            signal.signal(signum, forward)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(path)
        # signals this process was started with ignored (a non-interactive shell's
        # background job ignores SIGINT and SIGQUIT): the command ignores them too
        request = {"argv": [real] + sys.argv[1:], "cwd": os.getcwd(), "env": dict(os.environ),
                   "address_space": _address_space(), "ignored_signals": [int(s) for s in ignored]}
        socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    except OSError:
        conn.close()
        return _real(pending)
    answers = _lines(conn)
    started = next(answers, "")
    if not started.startswith("pid "):  # "exec", or the fork server could not fork
        conn.close()
        return _real(pending)
    target.append(int(started.split()[1]))
    for signum in pending:
        forward(signum, None)
    for line in answers:
        if line.startswith("status "):
            return int(line.split()[1])
    sys.stderr.write(f"{os.path.basename(real)}: the tests' fork server ended while it ran\n")
    return 1 << 8


def _real(pending):
    """None (run the real script), after the signals kept while asking: the first of
    them ends this process, as it would have ended the command (the handlers are
    reset first, so that one coming now ends it too)."""
    for signum in FORWARDED:
        if signal.getsignal(signum) not in (signal.SIG_IGN, signal.SIG_DFL):
            signal.signal(signum, signal.SIG_DFL)
    if pending:
        os.kill(os.getpid(), pending[0])
    return None


def main(real: str) -> None:
    path = os.environ.get(SOCKET_ENV)
    status = _run_forked(path, real) if path else None
    if status is None:
        os.execv(real, [real] + sys.argv[1:])
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):  # (SIGKILL, SIGSTOP: never caught anyway)
            pass
        os.kill(os.getpid(), signum)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
