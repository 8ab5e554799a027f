"""Loading fairseq checkpoints without running code from them.

A checkpoint is a pickle; unpickling can call any function the file names
(``os.system``, ``subprocess.Popen``, ``builtins.exec``, ...). torch >= 2.6 therefore
loads with ``weights_only=True`` by default: only tensors, containers and primitive
types, plus the globals on an allowlist. :func:`torch_load_checkpoint` loads fairseq
checkpoints that way, with the allowlist :data:`CHECKPOINT_GLOBALS`: exactly what a
fairseq 0.12 checkpoint holds besides tensors and primitive types. It was found with
``torch.serialization.get_unsafe_globals_in_checkpoint`` on checkpoints written by
``fairseq-train`` for every model of this package and fairseq's own transformer,
fp32, ``--bf16`` and ``--memory-efficient-bf16`` on the CPU, ``--store-ema`` (and
``save_ema_as_checkpoint``'s output), ``checkpoint_last.pt`` with its optimizer state,
epoch and update checkpoints, a resumed run and an average written by
``fairseq-localness-average``: each holds ``argparse.Namespace`` (the model's options,
``cfg.model``, and the legacy ``args``) and nothing else. (``--fp16`` trains on CUDA
GPUs only; its checkpoints differ from bf16 ones only by a float ``loss_scale`` in the
optimizer state.)

A checkpoint that names any other global is refused before anything of it is turned
into objects: the pickle is first read as opcodes (no object is built) and every
global it names that is neither torch's own safe set nor on the allowlist is listed
in one line (:class:`UntrustedCheckpointError`), which says how to trust the file on
purpose. The ``weights_only`` unpickler then refuses anything the scan could not see.

The one switch: ``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1`` in the environment (or
``--trust-checkpoint`` on this package's command lines, which sets it) loads with
``weights_only=False``, as fairseq does on torch < 2.6, i.e. runs whatever the file
asks; it is logged once per process. There is no fallback from the safe load to the
full one.
"""
import argparse
import contextlib
import io
import logging
import os
import pickle
import re
import sys
from typing import List, Optional

import torch

logger = logging.getLogger("fairseq_localness.safe_load")

TRUST_ENV = "FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS"
"""Set to 1 to load checkpoints with full unpickling (their code runs)."""

TRUST_FLAG = "--trust-checkpoint"

CHECKPOINT_GLOBALS = (argparse.Namespace,)
"""The globals a fairseq 0.12 checkpoint holds beyond torch's own safe set."""

_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")
_logged_trust = [False]


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint needs globals outside the allowlist; the message is one line."""


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


def _name(f) -> str:
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    return str(getattr(f, "name", "<checkpoint stream>"))


def refusal(name: str, globals_: List[str]) -> str:
    """The one line that refuses a checkpoint needing ``globals_``."""
    listed = ", ".join(sorted(globals_)) if globals_ else "a global outside the allowlist"
    return (f"refusing to load checkpoint '{name}': it needs {listed}, which a fairseq checkpoint does not hold "
            f"and which unpickling could use to run code; if you trust this file, set {TRUST_ENV}=1 to load it "
            "with full unpickling (see docs/security.md)")


def _python3_name(name: str) -> str:
    """A global as Python 3 calls it: torch pickles with protocol 2, which writes
    some names as Python 2 had them (``subprocess.call`` as ``commands.call``)."""
    import _compat_pickle

    module, _, attr = name.rpartition(".")
    if (module, attr) in _compat_pickle.NAME_MAPPING:
        return ".".join(_compat_pickle.NAME_MAPPING[(module, attr)])
    return f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{attr}"


def unsafe_globals(f) -> Optional[List[str]]:
    """The globals a ``torch.save`` file names beyond torch's safe set and the
    allowlist, read from its pickle's opcodes (nothing is built); ``None`` where the
    file is not in torch's zip format (the ``weights_only`` unpickler checks it)."""
    start = f.tell() if hasattr(f, "seek") else None
    try:
        with torch.serialization.safe_globals(list(CHECKPOINT_GLOBALS)):
            return sorted(_python3_name(g) for g in torch.serialization.get_unsafe_globals_in_checkpoint(f))
    except (ValueError, RuntimeError):  # legacy (non-zip) format, or not a torch file
        return None
    finally:
        if start is not None:
            f.seek(start)


def _supported() -> bool:
    s = torch.serialization
    return hasattr(s, "safe_globals") and hasattr(s, "get_unsafe_globals_in_checkpoint")


def torch_load_checkpoint(f, map_location=None, **kw):
    """``torch.load`` for fairseq checkpoints: ``weights_only=True`` with the globals
    of :data:`CHECKPOINT_GLOBALS` allowed, unless the trust switch is set.

    ``f`` and ``map_location`` and any other keyword are ``torch.load``'s;
    ``weights_only`` is not accepted (the switch decides). Raises
    :class:`UntrustedCheckpointError` (one line) for a checkpoint that needs any
    other global, before it is unpickled.
    """
    if "weights_only" in kw:
        raise TypeError(f"torch_load_checkpoint: weights_only is decided by {TRUST_ENV}, not by the caller")
    if trusted():
        if not _logged_trust[0]:
            _logged_trust[0] = True
            logger.warning("%s=1: loading checkpoints with full unpickling (any code they hold runs)", TRUST_ENV)
        return torch.load(f, map_location=map_location, weights_only=False, **kw)
    name = _name(f)
    if not _supported():
        raise UntrustedCheckpointError(
            f"cannot load checkpoint '{name}' safely: torch {torch.__version__} has no "
            f"torch.serialization.safe_globals (torch >= 2.5 has); upgrade torch, or trust the file on purpose with "
            f"{TRUST_ENV}=1 (see docs/security.md)")
    if isinstance(f, (bytes, bytearray)):
        f = io.BytesIO(f)
    found = unsafe_globals(f)
    if found:
        raise UntrustedCheckpointError(refusal(name, found))
    with torch.serialization.safe_globals(list(CHECKPOINT_GLOBALS)):
        try:
            return torch.load(f, map_location=map_location, weights_only=True, **kw)
        except pickle.UnpicklingError as e:  # what the opcode scan could not see
            text = str(e)
            named = re.findall(r"GLOBAL (\S+) was not an allowed global", text)
            if not named:
                named = re.findall(r"Unsupported (?:global|operand|class)[^\n.]*", text)[:1]
            raise UntrustedCheckpointError(refusal(name, named)) from None


_HOOK_MARK = "_fairseq_localness_checkpoint_refusal"


def install_excepthook():
    """Print an uncaught :class:`UntrustedCheckpointError` as one line
    (``<program>: error: <message>``, exit status 1) instead of a traceback: fairseq's
    command lines (``fairseq-generate``, ``fairseq-train``, ...) do not catch it.
    Every other exception goes to the previous hook. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, _HOOK_MARK, False):
        return

    def excepthook(kind, value, tb):
        if isinstance(value, UntrustedCheckpointError):
            prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"
            sys.stderr.write(f"{prog}: error: {value}\n")
            sys.stderr.flush()
            return
        previous(kind, value, tb)

    setattr(excepthook, _HOOK_MARK, True)
    excepthook.__wrapped__ = previous
    sys.excepthook = excepthook
