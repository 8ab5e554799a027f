"""fairseq-localness-train-check: the checks ``scripts/train.sh`` and
``scripts/demo.sh`` make before they start fairseq-train (``scripts/lib.sh``:
``check_arch``, ``check_train_args``), and that ``scripts/reproduce`` makes of its
configurations' architectures before a run.

    fairseq-localness-train-check arch ARCH...
    fairseq-localness-train-check args --prog PROG [--hardware] [--print-longest-pair] [--resume-from DIR]
                                       -- ARG...
    fairseq-localness-train-check resume DIR

``arch``: exit status 0 where every ARCH is a registered architecture (fairseq's own
and this package's), else status 1 and two lines on stdout: the unregistered ones
(sorted, space-separated), then the architectures expected instead.

``args``: the fairseq-train arguments ARG... (with ``--user-dir`` and ``--arch``) are
parsed as fairseq-train parses them, so an unknown option, a bad value or a model
option the architecture refuses (this package's models check theirs when the command
line is parsed) stops with exit status 2 and one line ``PROG: error: ...`` naming the
option, before fairseq-train creates ``--save-dir``. Attention heads that do not divide
the embedding size are checked for any architecture; the ``--arch`` first, as
``arch`` does. With ``--print-longest-pair`` it then prints the longest training pair
fairseq batches, in tokens: ``max(source, target)`` over the pairs of every train
split (``train``, ``train1``, ...) of every data directory, read with fairseq's own
index reader, pairs longer than the model's ``--max-source/target-positions`` left
out (fairseq drops them before batching); 0 where the data cannot be read that way
(raw text).

``resume DIR`` prints what a training in the run directory DIR resumes from, one
line ``resume: WHAT`` (:func:`resume_point`): ``none`` (no ``checkpoint_last.pt``),
``last`` (``checkpoint_last.pt``, fairseq's own resume), ``unreadable PATH`` (the
last one cannot be read: cut short while it was saved; PATH is the newest readable
checkpoint with the full training state, empty where there is none) or ``refused
MESSAGE`` (a checkpoint refused as unsafe: train.sh stops with MESSAGE).

Once the arguments pass, ``args`` prints in this order, each where asked: with
``--hardware`` a line ``hardware: N CC XLA`` (:func:`hardware`), with
``--resume-from DIR`` the ``resume`` line for DIR, and with ``--print-longest-pair``
the number, last. train.sh makes all of its checks in this one process.

A console script (rather than ``python -c``) so that the checks are one readable
module, and so that the test suite's fork server starts it from a process that has
fairseq imported already (docs/testing.md).
"""
import argparse
import itertools
import os
import re
import stat
import sys
from typing import List, Optional

PROG = "fairseq-localness-train-check"


def arch_problem(arch: str) -> Optional[str]:
    """None if ``arch`` is registered with fairseq (once this package is imported:
    fairseq's architectures and ours), else the list of the expected ones."""
    import fairseq_localness  # noqa: F401  (registers our models)
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.models import FairseqEncoderDecoderModel as EncoderDecoder

    if arch in ARCH_MODEL_REGISTRY:
        return None
    names = sorted(ARCH_MODEL_REGISTRY)
    ours = [a for a in names if ARCH_MODEL_REGISTRY[a].__module__.startswith("fairseq_localness")]
    transformers = [a for a in names
                    if a.startswith("transformer") and issubclass(ARCH_MODEL_REGISTRY[a], EncoderDecoder)]
    return ("fairseq_localness architectures: %s; fairseq encoder-decoder transformer architectures: %s "
            "(%d registered in all)" % (", ".join(ours) or "(none)", ", ".join(transformers), len(names)))


def _arch_in(argv: List[str]) -> Optional[str]:
    return argv[argv.index("--arch") + 1] if "--arch" in argv[:-1] else None


def check_args(prog: str, argv: List[str]):
    """``argv`` parsed by fairseq-train's parser (exit status 2 and one line naming the
    option where it is refused); returns the parsed arguments."""
    sys.argv[0] = prog  # the parsers fairseq builds take their name from it
    arch = _arch_in(argv)
    problem = arch_problem(arch) if arch else None
    if problem:
        sys.stderr.write("%s: error: --arch: %r is not a registered architecture. Expected one of the %s\n"
                         % (prog, arch, problem))
        sys.exit(2)
    from fairseq import options

    def error(message):
        sys.stderr.write("%s: error: %s (in the fairseq-train arguments)\n" % (prog, message))
        sys.exit(2)

    parser = options.get_training_parser()
    parser.error = error
    args = options.parse_args_and_arch(parser, argv)
    for side in ("encoder", "decoder"):
        dim, heads = getattr(args, side + "_embed_dim", None), getattr(args, side + "_attention_heads", None)
        if isinstance(dim, int) and isinstance(heads, int) and (heads < 1 or dim % heads):
            allowed = ", ".join(str(h) for h in range(1, min(dim, 64) + 1) if dim % h == 0)
            error("--%s-attention-heads %d: must divide --%s-embed-dim %d (allowed: %s%s)"
                  % (side, heads, side, dim, allowed, ", ..." if dim > 64 else ""))
    return args


def longest_pair(args) -> int:
    """The longest training pair fairseq batches, in tokens (see the module docstring)."""
    import numpy as np
    from fairseq import utils
    from fairseq.data import data_utils, indexed_dataset
    from fairseq.models.transformer import DEFAULT_MAX_SOURCE_POSITIONS, DEFAULT_MAX_TARGET_POSITIONS

    src, tgt = args.source_lang, args.target_lang
    # the positions fairseq batches within (task and model read the same two options)
    max_positions = (getattr(args, "max_source_positions", None) or DEFAULT_MAX_SOURCE_POSITIONS,
                     getattr(args, "max_target_positions", None) or DEFAULT_MAX_TARGET_POSITIONS)
    longest = 0
    for data in utils.split_paths(args.data):
        for k in itertools.count():
            prefix = os.path.join(data, "train%s.%s-%s." % (k or "", src, tgt))
            impl = args.dataset_impl or indexed_dataset.infer_dataset_impl(prefix + src)
            if impl not in ("mmap", "lazy", "cached") or not all(
                    indexed_dataset.dataset_exists(prefix + lang, impl) for lang in (src, tgt)):
                if k == 0 and impl == "raw":
                    return 0  # raw text: fairseq reads it whole; not looked at here
                break
            sizes = []
            for lang in (src, tgt):
                dataset = data_utils.load_indexed_dataset(prefix + lang, None, impl)
                # a copy while the dataset lives: an mmap dataset closes its map when freed
                sizes.append(np.array(dataset.sizes, dtype=np.int64))
                del dataset
            s, t = sizes
            kept = (s <= max_positions[0]) & (t <= max_positions[1])
            if kept.any():
                longest = max(longest, int(np.maximum(s, t)[kept].max()))
    return longest


def _readable(path: str) -> bool:
    """The package's checks of the container and the pickle (docs/security.md; with
    FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1, a full load): False for a file cut short (a
    kill during fairseq's copy) or otherwise damaged; a checkpoint refused as unsafe is
    not taken for a cut-short one: its refusal (UntrustedCheckpointError) is raised."""
    from fairseq_localness.checkpoint import UntrustedCheckpointError, check_file, torch_load_checkpoint, trusted
    from fairseq_localness.checkpoint.load import open_regular

    trust = trusted()  # (a ValueError where the switch is neither yes nor no)
    try:
        if trust:
            torch_load_checkpoint(path, map_location="cpu")
        else:
            with open_regular(path) as f:  # (a FIFO is not waited for: not readable)
                check_file(f, path)
        return True
    except UntrustedCheckpointError:
        raise
    except Exception:  # (MalformedCheckpointError: cut short or damaged; or what a trusted load raises)
        return False


def hardware() -> str:
    """``N CC XLA``: the visible CUDA devices, the compute capability (major) of the
    first (0 without one) and 1 where ``torch_xla`` is installed (fairseq 0.12's
    ``--bf16`` means training on TPUs), else 0; ``0 0 0`` where torch cannot tell."""
    import importlib.util
    import warnings

    try:
        with warnings.catch_warnings():  # (torch warns on a machine whose CUDA driver it cannot use)
            warnings.simplefilter("ignore")
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            major = torch.cuda.get_device_capability(0)[0] if count else 0
        return "%d %d %d" % (count, major, importlib.util.find_spec("torch_xla") is not None)
    except Exception:
        return "0 0 0"


def resume_point(save_dir: str) -> str:
    """What a training in ``save_dir`` resumes from (the module docstring's ``resume``):
    ``none``, ``last``, ``unreadable PATH`` (PATH empty where no checkpoint is readable)
    or ``refused MESSAGE``. The candidates where ``checkpoint_last.pt`` cannot be read
    are the checkpoints fairseq writes with the full training state (not averages),
    newest first."""
    from fairseq_localness.checkpoint import UntrustedCheckpointError

    last = os.path.join(save_dir, "checkpoint_last.pt")
    try:
        if not os.path.exists(last):
            return "none"
        if not stat.S_ISREG(os.stat(last).st_mode):  # (a FIFO would never end, a device never answer)
            return (f"refused {last} is not a regular file (a FIFO, device or directory); expected the "
                    "checkpoint fairseq writes there, or none")
        if _readable(last):
            return "last"
        names = [n for n in os.listdir(save_dir) if re.fullmatch(r"checkpoint(_best|\d+|_\d+_\d+)\.pt", n)]
        paths = sorted((os.path.join(save_dir, n) for n in names), key=os.path.getmtime, reverse=True)
        return "unreadable " + next((p for p in paths if _readable(p)), "")
    except (UntrustedCheckpointError, ValueError) as e:
        return "refused " + str(e).replace("\n", " ")
    except OSError as e:  # the folder cannot be listed, a checkpoint vanished while it was looked at
        return f"refused cannot read the run directory '{save_dir}' ({e.strerror or e}); expected a folder this " \
               "user can list"


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("arch", help="is every ARCH a registered architecture?")
    a.add_argument("archs", nargs="+", metavar="ARCH")
    t = sub.add_parser("args", help="parse fairseq-train arguments as fairseq-train does")
    t.add_argument("--prog", default=PROG, help="the script named in error messages")
    t.add_argument("--hardware", action="store_true", help="print the CUDA devices, capability and torch_xla")
    t.add_argument("--print-longest-pair", action="store_true", help="print the longest training pair, in tokens")
    t.add_argument("--resume-from", metavar="DIR", help="print what a training in DIR resumes from (as resume does)")
    t.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- ARG...", help="the fairseq-train arguments")
    r = sub.add_parser("resume", help="what a training in the run directory DIR resumes from")
    r.add_argument("save_dir", metavar="DIR")
    return p


def cli_main(argv=None):
    args = get_parser().parse_args(argv)
    if args.command == "arch":
        unknown = sorted({arch for arch in args.archs if arch_problem(arch)})
        if unknown:
            print(" ".join(unknown))
            print(arch_problem(unknown[0]))
            sys.exit(1)
        return
    if args.command == "resume":
        print("resume: " + resume_point(args.save_dir))
        return
    train_argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    parsed = check_args(args.prog, train_argv)
    if args.hardware:
        print("hardware: " + hardware())
    if args.resume_from:
        print("resume: " + resume_point(args.resume_from))
    if args.print_longest_pair:
        try:
            longest = longest_pair(parsed)
        except Exception as e:  # fairseq-train will say what is wrong with the data
            sys.stderr.write("%s: warning: could not read the sizes of the training pairs (%s: %s)\n"
                             % (args.prog, type(e).__name__, e))
            longest = 0
        print(longest)


if __name__ == "__main__":
    cli_main()
