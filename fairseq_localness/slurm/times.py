"""SLURM's time limits (``--time``), parsed and checked against the requeue warning.

Standard library only: ``scripts/reproduce/plan.py`` loads this file by its path,
without importing the package (which imports fairseq and torch), so that the
reproduce driver and ``python -m fairseq_localness.slurm`` read ``--time`` alike.
"""
import re

FORMATS = "minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")


def time_seconds(value: str) -> int:
    """``value`` in SLURM's time formats (:data:`FORMATS`), in seconds; ValueError with
    the message to print when it is none of them."""
    m = _TIME.fullmatch(value)
    if not m:
        raise ValueError(f"--time: expected a SLURM time: {FORMATS}; got '{value}'")
    days, a, b, c = (int(x) if x else None for x in m.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        return ((days * 24 + a) * 60 + (b or 0)) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS
        return (a * 60 + b) * 60 + c
    if b is not None:  # MM:SS
        return a * 60 + b
    return a * 60  # minutes


def time_minutes(value: str, delay: int) -> int:
    """``value`` (:func:`time_seconds`) in whole minutes, rounded up; ValueError when
    less than 30 s would remain for a job before SLURM's warning, sent ``delay``
    seconds (``--signal-delay``) before the limit."""
    seconds = time_seconds(value)
    if seconds - delay < 30:
        raise ValueError(f"--time {value}: too short for one validation: a job is told to save and requeue "
                         f"--signal-delay {delay} s before its limit; expected at least {delay + 30} s "
                         f"({-(-(delay + 30) // 60)} min), or a shorter --signal-delay")
    return -(-seconds // 60)
