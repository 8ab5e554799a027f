"""The one-line errors of checkpoint loading.

Every checkpoint this package refuses, for whatever reason, ends in one
:class:`CheckpointError`: ``refusing to load checkpoint '<file>': <reason>``, one
line, printed as ``<program>: error: <message>`` by fairseq's command lines
(:func:`install_excepthook`) and by this package's tools.
"""
import os
import pickle
import sys

TRUST_ENV = "FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS"
"""Set to 1 to load checkpoints with full unpickling (their code runs)."""

TRUST_HINT = (f"if you trust this file, set {TRUST_ENV}=1 to load it with full unpickling "
              "(see docs/security.md)")


_CONTROL = dict.fromkeys([*range(0x20), 0x7F, *range(0x80, 0xA0)])


def _one_line(text: str) -> str:
    """``text`` on one line, its whitespace collapsed and any other control character
    (a terminal's escape sequences in a name a file chose) shown as ``\\xNN``."""
    text = " ".join(str(text).split())
    if any(ord(c) in _CONTROL for c in text):
        text = "".join(c if ord(c) not in _CONTROL else f"\\x{ord(c):02x}" for c in text)
    return text


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_repr(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (its end replaced by "..."), to
    name a value from a checkpoint inside a one-line reason."""
    return _cut(repr(value), limit)


def short_error(error, limit: int = 200, whole: bool = False, kind: bool = False) -> str:
    """``error`` (an exception, or a message) as a short part of a one-line reason:
    its first line (``whole``: all its lines, the whitespace collapsed), cut to
    ``limit`` characters; with ``kind`` the exception's type name in front
    (``ValueError: ...``), and that name alone where the message is empty."""
    text = str(error)
    line = _one_line(text) if whole else (text.strip().splitlines() or [""])[0].strip()
    line = _cut(line, limit)
    if not line:
        return type(error).__name__
    return f"{type(error).__name__}: {line}" if kind else line


class CheckpointError(pickle.UnpicklingError):
    """A checkpoint this package does not load; ``str()`` is one line naming the file
    and the reason. ``file`` and ``reason`` are its parts."""

    def __init__(self, file: str, reason: str, hint: str = ""):
        self.file, self.reason = str(file), _one_line(reason)
        message = f"refusing to load checkpoint '{self.file}': {self.reason}"
        if hint:
            message += f"; {hint}"
        super().__init__(_one_line(message))


class MalformedCheckpointError(CheckpointError):
    """The file is not a complete, well-formed ``torch.save`` checkpoint: cut short,
    damaged, or something else. Trusting it would not help."""


class UntrustedCheckpointError(CheckpointError):
    """The file asks for something a fairseq checkpoint never holds and that could run
    code or exhaust memory; ``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1`` loads it anyway
    (``trust_helps=False`` where it would not: a setting fairseq evaluates is parsed as
    a literal, trusted or not)."""

    def __init__(self, file: str, reason: str, trust_helps: bool = True):
        super().__init__(file, reason, TRUST_HINT if trust_helps else "")


_HOOK_MARK = "_fairseq_localness_checkpoint_refusal"


def program_name() -> str:
    return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"


def install_excepthook():
    """Print an uncaught :class:`CheckpointError` as one line (``<program>: error:
    <message>``, exit status 1) instead of a traceback: fairseq's command lines
    (``fairseq-generate``, ``fairseq-train``, ...) do not catch it. Every other
    exception goes to the previous hook. Idempotent."""
    previous = sys.excepthook
    if getattr(previous, _HOOK_MARK, False):
        return

    def excepthook(kind, value, tb):
        if isinstance(value, CheckpointError):
            sys.stderr.write(f"{program_name()}: error: {value}\n")
            sys.stderr.flush()
            return
        previous(kind, value, tb)

    setattr(excepthook, _HOOK_MARK, True)
    excepthook.__wrapped__ = previous
    sys.excepthook = excepthook
