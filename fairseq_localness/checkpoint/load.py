"""``torch.load`` for fairseq checkpoints, refusing anything a fairseq checkpoint
does not hold (the switch, the order of the checks, and the one line).

:func:`torch_load_checkpoint` reads the file once (:func:`read_checkpoint`: a
regular file, no FIFO, device or directory, no larger than the memory available),
then loads those bytes in four steps, each of which can refuse it in one line
(:class:`~fairseq_localness.checkpoint.errors.CheckpointError`) before the next
starts; the bytes checked are the bytes loaded:

1. the container: torch's zip format, every member stored and inside the file
   (:func:`~fairseq_localness.checkpoint.scan.read_container`);
2. the pickle, read as opcodes on a symbolic stack: every global, call and
   storage checked against what fairseq checkpoints hold
   (:func:`~fairseq_localness.checkpoint.scan.scan`);
3. torch's restricted unpickler (``weights_only=True``) with exactly those globals
   allowed (:data:`~fairseq_localness.checkpoint.scan.GLOBALS`), which builds it;
4. the loaded state: only data, bounded when copied, registered components, no
   interpolation, literals where fairseq evaluates
   (:func:`~fairseq_localness.checkpoint.settings.check_state`).

The one switch: ``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1`` in the environment (or
``--trust-checkpoint`` on this package's command lines, which sets it) loads with
``weights_only=False`` and none of the checks of steps 1 to 3 (the file is still read
once, as a regular file), as fairseq does on
torch < 2.6, i.e. runs whatever the file asks; it is logged once per process. There
is no fallback from the safe load to the full one. The settings fairseq evaluates
are literals whether or not the file is trusted (step 4's
:func:`~fairseq_localness.checkpoint.settings.check_settings`, and
:mod:`~fairseq_localness.checkpoint.literals`): trust is about the pickle.
"""
import argparse
import contextlib
import io
import logging
import os
import pickle
import stat

import torch

from fairseq_localness.checkpoint import scan as scanning
from fairseq_localness.checkpoint.errors import (TRUST_ENV, CheckpointError, MalformedCheckpointError,
                                                 UntrustedCheckpointError, short_error)
from fairseq_localness.checkpoint.model_size import remember_weights
from fairseq_localness.checkpoint.settings import check_settings, check_state
from fairseq_localness.checkpoint.values import check_finite

logger = logging.getLogger("fairseq_localness.checkpoint")

TRUST_FLAG = "--trust-checkpoint"

_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")
_logged_trust = [False]


def trusted() -> bool:
    """Whether ``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS`` asks for full unpickling.

    Raises ``ValueError`` for a value that is neither yes (1, true, yes) nor no
    (unset, empty, 0, false, no)."""
    value = os.environ.get(TRUST_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{TRUST_ENV}={os.environ[TRUST_ENV]!r}: expected 1 (trust checkpoints: full unpickling, "
                     "their code runs) or 0/unset (the safe load)")


@contextlib.contextmanager
def trusting(trust: bool = True):
    """What ``--trust-checkpoint`` does: inside, with ``trust``, every checkpoint this
    process (and a process it starts) loads is trusted; the environment is restored
    on leaving."""
    if not trust:
        yield
        return
    before = os.environ.get(TRUST_ENV)
    os.environ[TRUST_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def add_trust_argument(parser: argparse.ArgumentParser):
    """Add ``--trust-checkpoint`` to a command line (run the command inside
    ``trusting(args.trust_checkpoint)``)."""
    parser.add_argument(
        TRUST_FLAG, action="store_true",
        help="load the checkpoints with full unpickling, which runs any code they hold: only for files "
        f"you trust that the safe load refuses (the same as {TRUST_ENV}=1; see docs/security.md)")


def allowed_globals():
    """The objects behind :data:`~fairseq_localness.checkpoint.scan.GLOBALS`, as
    ``torch.serialization.safe_globals`` takes them (numpy's functions under both of
    their names: ``numpy.core`` before numpy 2, ``numpy._core`` after)."""
    import numpy as np

    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    allowed = [argparse.Namespace, np.ndarray, np.dtype]
    # numpy >= 1.25 builds each dtype as an instance of its own class (numpy.dtypes.Int64DType, ...)
    allowed += sorted({type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"} - {np.dtype}, key=str)
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed.append((multiarray._reconstruct, f"{module}._reconstruct"))
    return allowed


def _name(f) -> str:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    return str(getattr(f, "name", "<checkpoint stream>"))


def _refuse_foreign(head: bytes, name: str):
    """The refusal of a file that is not a zip, from its first bytes."""
    if head[:1] == b"\x80" and head[2:3] == b"\x8a":
        raise UntrustedCheckpointError(
            name, "it is in torch's legacy serialization format (torch < 1.6), whose storages are allocated at "
            "the sizes the file claims; fairseq-train has written the zip format since torch 1.6")
    if head[:1] == b"\x80":
        raise UntrustedCheckpointError(name, "it is a plain pickle, not torch.save's zip format")
    if not head:
        raise MalformedCheckpointError(name, "it is empty")
    raise MalformedCheckpointError(
        name, "it is not in torch.save's zip format (not a checkpoint, or not one written by torch >= 1.6)")


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def not_regular(mode: int) -> str:
    """What a file of ``os.stat`` mode ``mode`` is, if it is not a regular file ("" if it is)."""
    if stat.S_ISREG(mode):
        return ""
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def refuse_not_regular(name: str, mode: int):
    kind = not_regular(mode)
    if kind:
        raise MalformedCheckpointError(name, f"it is {kind}, not a regular file: a checkpoint is a file "
                                       "torch.save wrote")


def open_regular(path, name: str = ""):
    """``open(path, "rb")`` for a checkpoint: opened without waiting for a writer (a
    FIFO would block ``open``), and refused in one line unless it is a regular file."""
    name = name or os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise MalformedCheckpointError(name, f"it cannot be opened ({e.strerror or e})") from None
    try:
        refuse_not_regular(name, os.fstat(fd).st_mode)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
        f.raw.name = os.fspath(path)  # (what errors and fairseq's messages name)
        return f
    except BaseException:
        os.close(fd)
        raise


def memory_available() -> int:
    """The bytes this process can still allocate, as far as the system says (the
    smaller of ``MemAvailable`` and the room left under ``ulimit -v``), or 0 if it
    cannot say."""
    limits = []
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            limits.append(max(soft - used, 0))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else 0


def read_checkpoint(f, name: str) -> bytes:
    """The bytes of a checkpoint, read once: ``f`` is a path, an open binary file (read
    from where it is to its end), bytes, or a binary stream. A path or a file must be a
    regular file (no FIFO, device or directory), no larger than the memory available;
    all that is checked and loaded afterwards is these bytes, whatever happens to the
    file meanwhile."""
    if isinstance(f, (bytes, bytearray, memoryview)):
        return bytes(f)
    with contextlib.ExitStack() as stack:
        if isinstance(f, (str, os.PathLike)):
            f = stack.enter_context(open_regular(f, name))
        size = None
        try:
            info = os.fstat(f.fileno())
        except (AttributeError, OSError, io.UnsupportedOperation):
            info = None
        if info is not None:
            refuse_not_regular(name, info.st_mode)
            size = max(info.st_size - f.tell(), 0)
            available = memory_available()
            if available and size > available:
                raise MalformedCheckpointError(
                    name, f"it is {size:,} bytes, more than the {available:,} bytes of memory available to load it")
        try:
            data = f.read() if size is None else f.read(size)
        except MemoryError:
            raise MalformedCheckpointError(name, f"it is {size:,} bytes, more than this process can hold in "
                                           "memory" if size is not None else "it is more than this process can hold "
                                           "in memory") from None
        except OSError as e:
            raise MalformedCheckpointError(name, f"it cannot be read ({e.strerror or e})") from None
    if not isinstance(data, bytes):
        raise TypeError(f"torch_load_checkpoint: {name} is not opened in binary mode")
    return data


def check_file(f, name: str) -> None:
    """Steps 1 and 2 of :func:`torch_load_checkpoint` on the seekable binary stream
    ``f``, which holds the checkpoint from where it is to its end (left where it was)."""
    start = f.tell()
    try:
        head = f.read(4)
        f.seek(start)
        if head != b"PK\x03\x04":
            _refuse_foreign(head + f.read(8), name)
        size = f.seek(0, io.SEEK_END) - start
        f.seek(start)
        container = scanning.read_container(f, name, size)
        scanning.scan(container, name)
    finally:
        f.seek(start)


def _load(data: bytes, name: str, map_location, kw):
    """Steps 1 to 4 on the bytes of one checkpoint."""
    if trusted():
        if not _logged_trust[0]:
            _logged_trust[0] = True
            logger.warning("%s=1: loading checkpoints with full unpickling (any code they hold runs)", TRUST_ENV)
        state = torch.load(io.BytesIO(data), map_location=map_location, weights_only=False, **kw)
        if isinstance(state, dict):  # trusted or not, no setting fairseq evaluates runs code
            check_settings({key: state.get(key) for key in ("cfg", "args")}, name, plain=False)
            check_finite(state, name)
            remember_weights(state, name)
        return state
    if not hasattr(torch.serialization, "safe_globals"):
        raise UntrustedCheckpointError(
            name, f"torch {torch.__version__} has no torch.serialization.safe_globals (torch >= 2.5 has), so it "
            "cannot be loaded safely; upgrade torch")
    buffer = io.BytesIO(data)
    check_file(buffer, name)
    try:
        with torch.serialization.safe_globals(allowed_globals()):
            state = torch.load(buffer, map_location=map_location, weights_only=True, **kw)
    except CheckpointError:
        raise
    except pickle.UnpicklingError as e:  # what the scan let through and torch's unpickler did not
        reason = str(e).split("WeightsUnpickler error:", 1)[-1].strip()
        raise UntrustedCheckpointError(
            name, f"torch's restricted unpickler refuses it ({short_error(reason)})") from None
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError, EOFError, OSError,
            OverflowError, MemoryError, UnicodeDecodeError, AssertionError) as e:
        raise MalformedCheckpointError(name, f"torch cannot read it ({short_error(e, kind=True)})") from None
    check_state(state, name)
    remember_weights(state, name)
    return state


def torch_load_checkpoint(f, map_location=None, **kw):
    """``torch.load`` for fairseq checkpoints (see the module docstring).

    ``f`` (a path, an open binary file or bytes), ``map_location`` and any other
    keyword are ``torch.load``'s; ``weights_only`` is not accepted (the switch
    decides). The file is read once (:func:`read_checkpoint`): the bytes checked
    are the bytes loaded. Raises
    :class:`~fairseq_localness.checkpoint.errors.CheckpointError` (one line) for a
    checkpoint it refuses; an open file is then left where it was.
    """
    if "weights_only" in kw:
        raise TypeError(f"torch_load_checkpoint: weights_only is decided by {TRUST_ENV}, not by the caller")
    trusted()  # (a value of the switch that is neither yes nor no is an error before anything is read)
    name = _name(f)
    start = None
    if not isinstance(f, (str, os.PathLike, bytes, bytearray, memoryview)):
        with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
            start = f.tell()
    try:
        return _load(read_checkpoint(f, name), name, map_location, kw)
    except CheckpointError:
        if start is not None:
            with contextlib.suppress(OSError, io.UnsupportedOperation):
                f.seek(start)
        raise
