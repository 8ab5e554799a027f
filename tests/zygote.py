"""A fork server ("zygote") for the console scripts the tests run (:func:`conftest.run_command`).

Each fairseq process spends ~4 s importing torch, fairseq (every task and model
module, scikit-learn and scipy among them) and this package before it reads its
command line; most of the suite's commands then refuse something in one line or
train two updates. A zygote does that importing once, for one console script, and
forks a copy of itself for each command, which starts where the real process would
be after its imports.

The zygote imports exactly what the real process imports before it runs, in the
same order, so the state a command starts from (the modules, their patches, the
logging set-up, the warning filters) is the real one:

1. the console script's module, as the script's ``from <module> import <function>``
   does (``fairseq_cli.train`` for ``fairseq-train``, which configures the logging
   before it imports fairseq; ``fairseq_cli.generate`` imports fairseq first, whose
   ``wav2vec2_classification`` configures it at DEBUG on stderr: the order decides
   which wins, so each script has a zygote of its own);
2. for a script of fairseq, then the ``--user-dir`` (this package), through
   fairseq's own ``import_user_module``, as the command line does when it is
   parsed. This order matters: in a real ``fairseq-train --user-dir ...`` run
   ``fairseq_cli.train`` is imported before ``fairseq_localness``, whose fixes
   (:mod:`fairseq_localness.compat`) replace attributes of fairseq's modules; with
   the package imported first, a module imported after it could bind the patched
   names, and the tests would see a behaviour real runs do not have.

What those imports print is kept and written first to each command's stdout and
stderr, as the real process would print it. The zygote never runs a torch
operation and starts no thread: before each fork it checks that it is still one
thread (forking a process with other threads, OpenMP's among them, can deadlock
the child), and refuses to fork otherwise.

For each command the child starts a session of its own (its process group is
killed on a timeout, as a subprocess's is), moves to the command's directory,
takes its environment, its argv and its stdin/stdout/stderr (received as file
descriptors), reseeds Python's and numpy's global random generators (as a fresh
process seeds them), and runs the console script itself as ``__main__`` (its
``from <module> import <function>`` finds the module imported). Its exit status is
the real one: ``SystemExit``'s code (``None``: 0; a message: printed, 1), an
uncaught exception through ``sys.excepthook`` (a traceback from the script's frame
on, or this package's one-line checkpoint errors) and 1 (a ``KeyboardInterrupt``: the
traceback, then the end by ``SIGINT``, as the interpreter ends). The atexit handlers registered while it ran
are run, stdio is flushed, and it ends with ``os._exit``.

Protocol (``python zygote.py <control fd> <script path> <module:function> [<user dir>]``):
the control descriptor is a ``SOCK_SEQPACKET`` socket; each message holds a JSON
request (``argv``, ``cwd``, ``env``, ``address_space``: a limit or null, ``ignored_signals``:
the signals the command starts with ignored) and four descriptors (a socket to answer on,
stdin, stdout, stderr). On the answer socket the zygote writes ``pid <n>\\n`` once
the child is forked (or ``error <why>\\n``), then ``status <waitpid status>\\n``
when it ends. The asker writes nothing on the answer socket: when it closes while
the command runs (the asker ended: a test's process, or a fork client of
``tests/fork_client.py`` killed by its shell or a timeout), the zygote kills the
command's process group, as the command would have died with a real process's
parent. The zygote ends when the control socket is closed, killing the process
groups of the commands still running.
"""
import os
import signal
import sys

PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""The signals a fork client (``tests/fork_client.py``) passes on to its command."""


def _preload(script: str, entry: str, user_dir: str):
    """Import what the real process imports before it runs, in its order (the
    script's ``from <module> import <function>`` then runs on imported modules)."""
    import importlib

    # a console script runs with its own directory first on sys.path
    sys.path[0] = os.path.dirname(script)
    sys.argv = [script]
    module, _, function = entry.partition(":")
    target = importlib.import_module(module)
    for name in function.split("."):
        target = getattr(target, name)  # (fails here, not in each command, if it is missing)
    if user_dir:
        # as fairseq's command lines do while parsing --user-dir (options.get_parser)
        from argparse import Namespace

        from fairseq import utils

        utils.import_user_module(Namespace(user_dir=user_dir))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _exit_code(code) -> int:
    """The exit status of an interpreter ended by ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _child(script: str, program, request: dict, fds, printed):
    """Run the command; returns its exit code and the signal it ends by (or None)."""
    import atexit
    import builtins
    import random
    import types

    os.setsid()
    if request.get("address_space") is not None:  # (prlimit --as=N)
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (request["address_space"],) * 2)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # the passed-on signals as a fresh interpreter has them: ignored where the command's
    # caller ignores them, else the default (SIGINT: KeyboardInterrupt), whatever the
    # zygote inherited from the process that started it
    ignored = set(request.get("ignored_signals") or ())
    for signum in PASSED_ON:
        if signum in ignored:
            signal.signal(signum, signal.SIG_IGN)
        else:
            signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    for fd, target in zip(fds, (0, 1, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    atexit._clear()  # (the zygote's own; a command runs those it registers)
    for fd, data in zip((1, 2), printed):
        while data:
            data = data[os.write(fd, data):]
    # the console script itself, as the interpreter runs it (its imports are done)
    main = types.ModuleType("__main__")
    main.__file__ = script
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    ended_by = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
        exec(program, main.__dict__)
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except BaseException:
        kind, value, tb = sys.exc_info()
        tb = tb.tb_next  # (from the script's frame on, as the interpreter prints it)
        sys.excepthook(kind, value.with_traceback(tb), tb)
        code = 1
        if issubclass(kind, KeyboardInterrupt):  # the interpreter then ends by SIGINT (130 in a shell)
            ended_by = signal.SIGINT
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120  # (as the interpreter does when the flush at exit fails)
    return code, ended_by


def serve(control_fd: int, script: str, entry: str, user_dir: str) -> None:
    import json
    import select
    import socket
    import tempfile

    control = socket.socket(fileno=control_fd)
    # what the imports print: kept, to be printed first by each command
    captured = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    saved = [os.dup(1), os.dup(2)]
    for f, fd in zip(captured, (1, 2)):
        os.dup2(f.fileno(), fd)
    _preload(script, entry, user_dir)
    with open(script, encoding="utf-8") as f:
        script_code = compile(f.read(), script, "exec")
    sys.stdout.flush()
    sys.stderr.flush()
    printed = []
    for f, fd, old in zip(captured, (1, 2), saved):
        f.seek(0)
        printed.append(f.read())
        f.close()
        os.dup2(old, fd)
        os.close(old)
    if _threads() != 1:
        control.send(f"error the zygote of {script} runs {_threads()} threads after its imports".encode())
        return
    control.send(b"ready")

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running = {}  # pid -> the socket its status goes to
    ended = {}  # pid -> status, of children that ended before they were registered

    def reap():
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            ended[pid] = status
        for pid in [p for p in ended if p in running]:
            answer = running.pop(pid)
            try:
                answer.sendall(f"status {ended.pop(pid)}\n".encode())
            except OSError:
                pass
            answer.close()

    def kill(pid):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:  # (not yet the leader of its own group)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    hung_up = set()  # pids whose asker closed its socket: killed, not yet reaped
    while True:
        watched = [answer for pid, answer in running.items() if pid not in hung_up]
        ready, _, _ = select.select([control, wake_r] + watched, [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
            reap()
        for pid, answer in list(running.items()):
            # the asker never writes after its request: a readable answer socket is
            # closed (a fork client killed, a test's process gone): so is the command
            if answer in ready and pid not in hung_up:
                hung_up.add(pid)
                kill(pid)
        hung_up &= set(running)
        if control not in ready:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
        except OSError:
            message, fds = b"", []
        if not message:  # the tests' process closed the control socket (or ended)
            break
        answer = socket.socket(fileno=fds[0])
        request = json.loads(message)
        if _threads() != 1:
            try:
                answer.sendall(f"error the zygote runs {_threads()} threads: it does not fork\n".encode())
            except OSError:
                pass
            answer.close()
            for fd in fds[1:]:
                os.close(fd)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        # the signals a fork client passes on may come at once: held until the child
        # runs the script (a SIGINT then raises KeyboardInterrupt where the script runs)
        signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
        pid = os.fork()
        if pid != 0:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, PASSED_ON)
        if pid == 0:
            code, ended_by = 1, None
            try:
                control.close()
                answer.close()
                for other in running.values():
                    other.close()
                os.close(wake_r)
                os.close(wake_w)
                code, ended_by = _child(script, script_code, request, fds[1:], printed)
            except BaseException:
                import traceback

                try:
                    traceback.print_exc()
                    sys.stderr.flush()
                except BaseException:
                    pass
            finally:
                if ended_by is not None:
                    signal.signal(ended_by, signal.SIG_DFL)
                    os.kill(os.getpid(), ended_by)
                os._exit(code & 0xFF)
        for fd in fds[1:]:
            os.close(fd)
        running[pid] = answer
        try:
            answer.sendall(f"pid {pid}\n".encode())
        except OSError:  # the asker is gone: its closed socket has the command killed below
            pass
        reap()
    for pid in running:
        kill(pid)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "")
