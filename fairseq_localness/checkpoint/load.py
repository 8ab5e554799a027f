"""``torch.load`` for fairseq checkpoints, refusing anything a fairseq checkpoint
does not hold (the switch, the order of the checks, and the one line).

:func:`torch_load_checkpoint` loads a checkpoint in four steps, each of which can
refuse it in one line (:class:`~fairseq_localness.checkpoint.errors.CheckpointError`)
before the next starts:

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
``weights_only=False`` and none of the checks of steps 1 to 3, as fairseq does on
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


def _size(f) -> int:
    try:
        return os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, io.UnsupportedOperation):
        here = f.tell()
        end = f.seek(0, io.SEEK_END)
        f.seek(here)
        return end


def check_file(f, name: str) -> None:
    """Steps 1 and 2 of :func:`torch_load_checkpoint` on the open binary file ``f``
    (left where it was)."""
    start = f.tell()
    try:
        head = f.read(4)
        f.seek(start)
        if head != b"PK\x03\x04":
            _refuse_foreign(head + f.read(8), name)
        container = scanning.read_container(f, name, _size(f))
        scanning.scan(container, name)
    finally:
        f.seek(start)


def torch_load_checkpoint(f, map_location=None, **kw):
    """``torch.load`` for fairseq checkpoints (see the module docstring).

    ``f`` (a path, an open binary file or bytes), ``map_location`` and any other
    keyword are ``torch.load``'s; ``weights_only`` is not accepted (the switch
    decides). Raises :class:`~fairseq_localness.checkpoint.errors.CheckpointError`
    (one line) for a checkpoint it refuses; an open file is left where it was.
    """
    if "weights_only" in kw:
        raise TypeError(f"torch_load_checkpoint: weights_only is decided by {TRUST_ENV}, not by the caller")
    if trusted():
        if not _logged_trust[0]:
            _logged_trust[0] = True
            logger.warning("%s=1: loading checkpoints with full unpickling (any code they hold runs)", TRUST_ENV)
        state = torch.load(f, map_location=map_location, weights_only=False, **kw)
        if isinstance(state, dict):  # trusted or not, no setting fairseq evaluates runs code
            check_settings({key: state.get(key) for key in ("cfg", "args")}, _name(f), plain=False)
            check_finite(state, _name(f))
            remember_weights(state, _name(f))
        return state
    name = _name(f)
    if not hasattr(torch.serialization, "safe_globals"):
        raise UntrustedCheckpointError(
            name, f"torch {torch.__version__} has no torch.serialization.safe_globals (torch >= 2.5 has), so it "
            "cannot be loaded safely; upgrade torch")
    if isinstance(f, (bytes, bytearray)):
        f = io.BytesIO(f)
    with contextlib.ExitStack() as stack:
        if isinstance(f, (str, os.PathLike)):
            try:
                f = stack.enter_context(open(f, "rb"))
            except OSError as e:
                raise MalformedCheckpointError(name, f"it cannot be opened ({e.strerror or e})") from None
        check_file(f, name)
        start = f.tell()
        try:
            with torch.serialization.safe_globals(allowed_globals()):
                state = torch.load(f, map_location=map_location, weights_only=True, **kw)
        except CheckpointError:
            raise
        except pickle.UnpicklingError as e:  # what the scan let through and torch's unpickler did not
            reason = str(e).split("WeightsUnpickler error:", 1)[-1].strip()
            raise UntrustedCheckpointError(
                name, f"torch's restricted unpickler refuses it ({short_error(reason)})") from None
        except (RuntimeError, ValueError, TypeError, KeyError, IndexError, AttributeError, EOFError, OSError,
                OverflowError, MemoryError, UnicodeDecodeError, AssertionError) as e:
            f.seek(start)
            raise MalformedCheckpointError(name, f"torch cannot read it ({short_error(e, kind=True)})") from None
    check_state(state, name)
    remember_weights(state, name)
    return state
