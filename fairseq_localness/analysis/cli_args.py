"""The analysis tools' command lines: the error a tool reports to its user, logging,
running a tool's ``main``, the options the tools share (checkpoints, splits, output
directory, threads) and the parsing of ``NAME=FILE`` lists and labels.
"""
import argparse
import logging
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_localness.analysis.outputs import ensure_dir

logger = logging.getLogger("fairseq_localness.analysis")


class AnalysisError(Exception):
    """A problem with the user's inputs; the CLIs print it and exit with status 2."""


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is when a record comes (not as it was
    when the handler was made: a caller, e.g. a test harness, may have replaced it)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def setup_logging():
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
        handlers=[_CurrentStderr()],
        force=True,  # importing fairseq may already have configured the root logger
    )
    for noisy in ("matplotlib", "PIL", "fairseq.tasks.text_to_speech"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_cli(prog: str, main, argv=None, parser: Optional[argparse.ArgumentParser] = None):
    """Parse ``argv`` with ``parser`` and call ``main(args)`` (see :func:`run_main`)."""
    setup_logging()
    return run_main(prog, main, parser.parse_args(argv))


def run_main(prog: str, main, args):
    """``main(args)``; an :class:`AnalysisError` ends the program with its message
    (exit status 2), not a traceback."""
    setup_logging()
    try:
        return main(args)
    except AnalysisError as e:
        logger.error("%s: error: %s", prog, e)
        sys.exit(2)


def add_checkpoint_args(p: argparse.ArgumentParser, multiple: bool = False):
    """``DATA``, ``--path`` (repeatable with ``multiple``), ``--labels``, ``--cpu``."""
    p.add_argument("data", nargs="?", default=None,
                   help="binarized data directory (fairseq-preprocess output); default: the one "
                   "recorded in the checkpoint")
    if multiple:
        p.add_argument("--path", action="append", required=True, metavar="CHECKPOINT",
                       help="checkpoint file; repeat to compare several models")
        p.add_argument("--labels", nargs="+", default=None,
                       help="one name per --path for tables and legends (default: the file names' directories)")
    else:
        p.add_argument("--path", required=True, metavar="CHECKPOINT", help="checkpoint file")
    p.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is available")
    add_threads_arg(p)


def add_threads_arg(p: argparse.ArgumentParser):
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default: torch's choice); on a busy or shared machine --threads 1 "
                   "is often much faster for small models")


def start_tool(args) -> str:
    """The start of a tool that runs models: ``--threads`` applied, ``--output-dir``
    made; returns the output directory."""
    set_threads(args.threads)
    return ensure_dir(args.output_dir)


def set_threads(n: int):
    if n and n > 0:
        import torch

        torch.set_num_threads(n)


class single_thread:
    """Run a block with one torch CPU thread (tiny matrices: more threads only add
    synchronisation), restoring the previous setting."""

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)
        return False


def add_split_args(p: argparse.ArgumentParser, default_split: str = "valid", default_max: Optional[int] = None):
    p.add_argument("--split", default=default_split, help=f"split of DATA to run over (default: {default_split})")
    p.add_argument("--max-sentences", type=int, default=default_max,
                   help="use at most this many sentences (default: %s)" % ("all" if default_max is None else default_max))
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")


def add_output_args(p: argparse.ArgumentParser):
    p.add_argument("--output-dir", required=True, help="directory for the CSV/JSON tables and PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def labels_for(paths: Sequence[str], labels: Optional[Sequence[str]]) -> List[str]:
    """``--labels`` or, by default, each checkpoint's directory name (its file name
    when the directories coincide)."""
    if labels is not None:
        if len(labels) != len(paths):
            raise AnalysisError(f"--labels: got {len(labels)} labels for {len(paths)} --path checkpoints")
        return list(labels)
    names = [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]
    if len(set(names)) < len(names):
        names = [os.path.basename(p) for p in paths]
    if len(set(names)) < len(names):
        names = [f"model{i + 1}" for i in range(len(paths))]
    return names


def parse_named(values: Sequence[str], option: str, repeats: bool = False) -> List[Tuple[str, str]]:
    """``["name=path", ...]`` -> ``[(name, path), ...]``; a bare ``path`` is named after
    its file. With ``repeats``, a name may come several times (the runs of one system,
    e.g. its seeds); otherwise names must be unique."""
    out = []
    for v in values:
        if "=" in v and not os.path.exists(v):
            name, path = v.split("=", 1)
            if not name:
                raise AnalysisError(f"{option} {v!r}: empty name before '='; expected NAME=FILE")
        else:
            name, path = os.path.splitext(os.path.basename(v))[0], v
        out.append((name, path))
    names = [n for n, _ in out]
    if not repeats and len(set(names)) < len(names):
        raise AnalysisError(f"{option}: the names {names} are not unique; give NAME=FILE")
    if repeats:
        paths = [os.path.abspath(p) for _, p in out]
        dup = next((p for p in paths if paths.count(p) > 1), None)
        if dup is not None:
            raise AnalysisError(f"{option}: {dup!r} is given twice; expected each run once")
    return out


def group_named(named: Sequence[Tuple[str, str]]) -> List[Tuple[str, List[str]]]:
    """``[(name, path), ...]`` -> ``[(name, [path, ...]), ...]`` in first-seen order."""
    groups: Dict[str, List[str]] = {}
    for name, path in named:
        groups.setdefault(name, []).append(path)
    return list(groups.items())


def require_file(path: str, what: str):
    if not os.path.isfile(path):
        raise AnalysisError(f"{what} {path!r} does not exist")
