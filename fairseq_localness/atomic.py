"""Files written whole or not at all.

A file that a run writes and another process may read meanwhile (a job's state, the
results page, the benchmark's tables, a corpus) is written to a temporary file beside
it and renamed over it (``os.replace``, atomic within a file system): a reader sees the
old file or the new one, never a part; a write that fails or is interrupted leaves the
old file as it was and removes its temporary file. Each write has a temporary name of
its own, so that two processes writing the same file (two tasks of one SLURM job) do
not write into one temporary file; it is created with the permissions any new file
gets (the umask's), which the rename keeps. The temporary file is on disk before the
rename (``fsync``), and the rename before the write returns (``fsync`` of the
directory): after a crash the file is the old one or the new one, not an empty one (a
rename may reach the disk before the data it names, e.g. on XFS).
"""
import contextlib
import os
import uuid
from typing import Iterator


@contextlib.contextmanager
def replacing(path: str, suffix: str = "") -> Iterator[str]:
    """A temporary path beside ``path`` (ending in ``suffix``, e.g. ``".png"`` for a
    writer that reads the format from the name) for the block to write; renamed to
    ``path`` when the block ends, removed if it raises (``SystemExit`` and
    ``KeyboardInterrupt`` too)."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp{suffix}")
    try:
        yield tmp
        _sync(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:
        _sync(directory)
    except OSError:  # (a file system whose directories cannot be synced)
        pass


def _sync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text(path: str, text: str) -> None:
    """``text`` as ``path``'s whole content (UTF-8, ``\\n`` line ends), written whole or
    not at all (:func:`replacing`)."""
    with replacing(path) as tmp:
        with open(tmp, "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
