"""Average the parameters of several fairseq checkpoints into a new checkpoint.

``fairseq-localness-average`` has the options and semantics of fairseq's
``scripts/average_checkpoints.py``, which the fairseq wheels do not ship:

- ``--inputs A.pt B.pt ...`` averages those files; ``--inputs DIR`` with
  ``--num-epoch-checkpoints N`` (files ``checkpoint<epoch>.pt``) or
  ``--num-update-checkpoints N`` (files ``checkpoint_<epoch>_<update>.pt``) averages
  the last N of them, optionally only those numbered ``<= --checkpoint-upper-bound``;
- everything except the parameters (``args``/``cfg``, optimizer history, ...) is
  copied from the first input (the newest one when a directory is given);
- floating-point parameters are averaged; integer buffers get the floor of their mean;
  a tensor under several names (tied embeddings) is summed once and stays tied.

It differs where fairseq's script is unsafe or unclear:

- checkpoints are loaded without running code from them
  (:func:`fairseq_localness.checkpoint.torch_load_checkpoint`: the globals fairseq
  checkpoints hold and nothing else, settings checked): a file the load would refuse,
  for its pickle or for its settings, is refused here too, naming it, so that no
  average passes on what a load would refuse, unless ``--trust-checkpoint`` (or
  ``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1``) says to unpickle it in full
  (docs/security.md). fairseq's script loads with full unpickling;
- sums are accumulated in float64 and cast back to each parameter's own dtype (fp16
  and bf16 checkpoints stay fp16/bf16 and lose no precision in the sum);
- every check happens before anything is written: missing files, too few
  checkpoints, mismatched parameter names or shapes, an output that is one of the
  inputs, or a missing output directory stop it with a message saying which;
- the checkpoints must be of the same model: the same architecture and the same
  value of every option the architecture's model class defines (``add_args``),
  dropout rates aside, so a transformer and a hybrid ``local_pattern`` model, whose
  parameters have the same names and shapes, are not averaged into a model of
  neither; ``--force`` averages them anyway (and checkpoints whose weights hold more than
  :data:`MAX_INTEGER_VALUES` integer or boolean values, which a fairseq model's do not);
- the result is written to a temporary file in the output's directory, flushed to
  disk, then renamed over ``--output`` in one step: an interrupted run leaves any
  previous ``--output`` intact and never a truncated file.
"""
import argparse
import collections
import logging
import os
import re
import sys
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_localness.atomic import replacing
from fairseq_localness.checkpoint import CheckpointError, add_trust_argument, torch_load_checkpoint, trusting

logger = logging.getLogger("fairseq_localness.average")


class AverageError(Exception):
    """A problem with the inputs or output; the message says which."""


def last_n_checkpoints(
    directory: str, n: int, update_based: bool, upper_bound: Optional[int] = None
) -> List[str]:
    """The last ``n`` checkpoints of ``directory``, newest first (fairseq's order)."""
    if not os.path.isdir(directory):
        raise AverageError(f"--inputs: expected a directory of checkpoints, '{directory}' is not one")
    if update_based:
        pattern, form = re.compile(r"checkpoint_\d+_(\d+)\.pt"), "checkpoint_<epoch>_<update>.pt"
    else:
        pattern, form = re.compile(r"checkpoint(\d+)\.pt"), "checkpoint<epoch>.pt"
    entries = []
    for name in os.listdir(directory):
        m = pattern.fullmatch(name)
        if m is not None:
            key = int(m.group(1))
            if upper_bound is None or key <= upper_bound:
                entries.append((key, name))
    if len(entries) < n:
        bound = f" numbered <= {upper_bound}" if upper_bound is not None else ""
        raise AverageError(
            f"found {len(entries)} checkpoint(s) named {form}{bound} in '{directory}', need {n}"
        )
    return [os.path.join(directory, name) for _, name in sorted(entries, reverse=True)[:n]]


def load_checkpoint(path: str) -> dict:
    """Load a fairseq checkpoint on CPU, without running code from it unless trusted
    (:func:`~fairseq_localness.checkpoint.torch_load_checkpoint`)."""
    try:  # (the path, not a file opened here: a FIFO would hang open(), the load refuses it)
        state = torch_load_checkpoint(path, map_location="cpu")
    except CheckpointError as e:
        raise AverageError(str(e)) from None
    except Exception as e:  # a truncated or foreign file: say which one
        raise AverageError(f"cannot load checkpoint '{path}': {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or "model" not in state:
        raise AverageError(f"'{path}' is not a fairseq checkpoint (no 'model' entry)")
    return state


def _describe_key_mismatch(path: str, expected: List[str], found: List[str], first: str) -> str:
    missing = [k for k in expected if k not in set(found)]
    extra = [k for k in found if k not in set(expected)]
    parts = []
    if missing:
        parts.append(f"missing {len(missing)}: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if extra:
        parts.append(f"unexpected {len(extra)}: {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    if not parts:
        parts.append("same names in a different order")
    return (
        f"'{path}' does not have the parameters of '{first}' ({'; '.join(parts)}); "
        "only checkpoints of the same model can be averaged"
    )


def model_config(state: dict) -> Tuple[Optional[str], dict]:
    """The architecture name and the model options saved in a fairseq checkpoint."""
    cfg = state.get("cfg")
    model = cfg.get("model") if isinstance(cfg, dict) or hasattr(cfg, "get") else None
    if model is None:
        model = state.get("args")
    if model is None:
        return None, {}
    if isinstance(model, argparse.Namespace):
        values = dict(vars(model))
    else:
        try:
            from omegaconf import OmegaConf

            values = OmegaConf.to_container(model) if OmegaConf.is_config(model) else dict(model)
        except ImportError:
            values = dict(model)
    return values.get("arch") or values.get("_name"), values


# model options that change how a model runs, not its parameters nor what they compute:
# checkpoints that differ in them are the same model (the kernels, --attention-impl, also
# differ between checkpoints saved before the option and after)
RUNTIME_OPTIONS = ("attention_impl",)


def _model_and_options(arch: str) -> Tuple[str, Optional[List[str]]]:
    """The registered model name of architecture ``arch`` (``transformer`` for
    ``transformer_iwslt_de_en``) and the options (argparse dests) its model class
    defines; ``(arch, None)`` if the architecture is not registered here."""
    try:
        import fairseq_localness  # noqa: F401  (registers this package's models)
        from fairseq.models import ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY
    except ImportError:
        return arch, None
    cls = ARCH_MODEL_REGISTRY.get(arch)
    if cls is None or not hasattr(cls, "add_args"):
        return arch, None
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS, allow_abbrev=False, add_help=False)
    cls.add_args(parser)
    names = [a.dest for a in parser._actions if "dropout" not in a.dest and "layerdrop" not in a.dest
             and a.dest not in RUNTIME_OPTIONS]
    return ARCH_MODEL_NAME_REGISTRY.get(arch, arch), names


def config_differences(first: dict, other: dict) -> List[str]:
    """How the model of checkpoint ``other`` differs from that of ``first`` (both
    loaded states): the architecture, else the options of its model class."""
    arch_a, a = model_config(first)
    arch_b, b = model_config(other)
    if arch_a is None or arch_b is None:
        return []
    model_a, names = _model_and_options(arch_a)
    model_b, _ = _model_and_options(arch_b)
    if model_a != model_b:
        return [f"--arch {arch_b} (model {model_b}) vs {arch_a} (model {model_a})"]
    if names is None:  # not registered here: every option saved with both that no training run changes
        names = [k for k in a if k in b and k.startswith(("encoder_", "decoder_", "share_"))]
    missing = object()
    return [
        f"--{k.replace('_', '-')} {b.get(k)} vs {a.get(k)}"
        for k in sorted(set(names))
        if a.get(k, missing) != b.get(k, missing)
    ]


def _tensor_key(t: torch.Tensor):
    """What makes two entries of a state dict one tensor: the same view of one storage."""
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype


def _tie(params: Dict[str, torch.Tensor], names: List[str]) -> List[List[str]]:
    """``names`` split into the groups that are one tensor in ``params`` (in order)."""
    parts: Dict[tuple, List[str]] = collections.OrderedDict()
    for name in names:
        parts.setdefault(_tensor_key(params[name]), []).append(name)
    return list(parts.values())


MAX_INTEGER_VALUES = 1 << 20
"""The most integer and boolean values a checkpoint to average may hold in its weights: a
fairseq model's are a few counters (``version`` buffers); each is summed in 64 bits (a
100 MB checkpoint of one boolean tensor took 2.1 GB to average)."""


def average_checkpoints(inputs: List[str], force: bool = False) -> dict:
    """Load ``inputs`` and return the first one's state with averaged parameters.

    A tensor that several names share (tied embeddings) is summed once, and stays
    shared in the average while it is shared in every input: the memory used is that
    of the distinct tensors, however many names point at them. Checkpoints of
    different models (:func:`config_differences`) are refused unless ``force``."""
    if not inputs:
        raise AverageError("--inputs: expected at least one checkpoint")
    sums: Dict[str, torch.Tensor] = collections.OrderedDict()  # one per group of tied names, by its first name
    groups: Dict[str, List[str]] = collections.OrderedDict()
    dtypes: Dict[str, torch.dtype] = {}
    keys: Optional[List[str]] = None
    new_state = None
    for path in inputs:
        state = load_checkpoint(path)
        params = state["model"]
        if keys is None:
            keys = list(params.keys())
            new_state = state
            groups.update((names[0], names) for names in _tie(params, keys))
            integers = sum(params[k].numel() for k in groups if not params[k].is_floating_point())
            if integers > MAX_INTEGER_VALUES and not force:
                raise AverageError(
                    f"'{path}' holds {integers:,} integer or boolean weight values, more than the "
                    f"{MAX_INTEGER_VALUES:,} of a fairseq model's counters; their sums take 64 bits each (8 times "
                    "a boolean's size). Expected a checkpoint of a trained model (pass --force to average anyway)")
        elif not force and (diff := config_differences(new_state, state)):
            raise AverageError(
                f"'{path}' is not the same model as '{inputs[0]}' ({'; '.join(diff[:5])}"
                f"{' ...' if len(diff) > 5 else ''}); averaging the parameters of different models gives a "
                f"model of neither. Expected checkpoints of one training run (pass --force to average anyway)"
            )
        if list(params.keys()) != keys:
            raise AverageError(_describe_key_mismatch(path, keys, list(params.keys()), inputs[0]))
        for k, names in groups.items():  # (before any sum is copied for names this input unties)
            for name in names:
                if k in sums and params[name].shape != sums[k].shape:
                    raise AverageError(
                        f"parameter '{name}' has shape {tuple(params[name].shape)} in '{path}' but "
                        f"{tuple(sums[k].shape)} in '{inputs[0]}'"
                    )
        for first, names in list(groups.items()):
            for part in _tie(params, names)[1:]:  # tied in the inputs so far, not in this one: sums of their own
                groups[first] = [n for n in groups[first] if n not in part]
                groups[part[0]] = part
                sums[part[0]], dtypes[part[0]] = sums[first].clone(), dtypes[first]
        for k, names in groups.items():
            p = params[k]
            if k not in sums:
                dtypes[k] = p.dtype
                sums[k] = p.detach().to(torch.float64 if p.is_floating_point() else torch.int64).clone()
                continue
            sums[k] += p.detach().to(sums[k].dtype)
        del state, params
    n = len(inputs)
    averaged_groups = {}
    for k, total in sums.items():  # (divided in place: no second copy of the sums)
        if total.is_floating_point():
            averaged_groups[k] = total.div_(n).to(dtypes[k])
        else:
            averaged_groups[k] = total.div_(n, rounding_mode="floor").to(dtypes[k])
        sums[k] = None  # (the sum in 64 bits freed as soon as its average exists, where it is a copy)
    owner = {name: first for first, names in groups.items() for name in names}
    new_state["model"] = collections.OrderedDict((k, averaged_groups[owner[k]]) for k in keys)
    return new_state


def save_atomic(state: dict, output: str):
    """``torch.save`` to a temporary file next to ``output``, on disk before it is renamed
    to ``output`` (:func:`fairseq_localness.atomic.replacing`)."""
    with replacing(output) as tmp:
        with open(tmp, "xb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())


def _same_file(a: str, b: str) -> bool:
    if os.path.exists(a) and os.path.exists(b):
        return os.path.samefile(a, b)
    return os.path.realpath(a) == os.path.realpath(b)


def resolve_inputs(args) -> List[str]:
    """Check the options and return the checkpoint files to average."""
    for name in ("num_update_checkpoints", "num_epoch_checkpoints"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise AverageError(f"--{name.replace('_', '-')}: expected a number >= 1, got {value}")
    num = args.num_update_checkpoints if args.num_update_checkpoints is not None else args.num_epoch_checkpoints
    if args.checkpoint_upper_bound is not None and num is None:
        raise AverageError(
            "--checkpoint-upper-bound requires --num-epoch-checkpoints or --num-update-checkpoints"
        )
    if num is not None:
        if len(args.inputs) != 1:
            raise AverageError(
                "with --num-epoch-checkpoints/--num-update-checkpoints, --inputs must be one "
                f"directory, got {len(args.inputs)} paths"
            )
        inputs = last_n_checkpoints(
            args.inputs[0], num, args.num_update_checkpoints is not None, args.checkpoint_upper_bound
        )
    else:
        inputs = list(args.inputs)
        for path in inputs:
            if os.path.isdir(path):
                raise AverageError(
                    f"--inputs: '{path}' is a directory; give checkpoint files, or the directory "
                    "with --num-epoch-checkpoints N or --num-update-checkpoints N"
                )
            if not os.path.isfile(path):
                raise AverageError(f"--inputs: checkpoint '{path}' does not exist")
    out_dir = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(out_dir):
        raise AverageError(f"--output: directory '{out_dir}' does not exist")
    if os.path.isdir(args.output):
        raise AverageError(f"--output: '{args.output}' is a directory; expected a file name")
    for path in inputs:
        if _same_file(path, args.output):
            raise AverageError(
                f"--output '{args.output}' is one of the inputs; refusing to overwrite it "
                "(write the average to a new file)"
            )
    return inputs


def get_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fairseq-localness-average",
        description="Average the parameters of fairseq checkpoints into a new checkpoint "
        "(fairseq's scripts/average_checkpoints.py, loading them without running code from them).",
    )
    p.add_argument("--inputs", required=True, nargs="+", metavar="PATH",
                   help="checkpoint files, or one directory with --num-*-checkpoints")
    p.add_argument("--output", required=True, metavar="FILE",
                   help="write the averaged checkpoint here (never one of the inputs)")
    num = p.add_mutually_exclusive_group()
    num.add_argument("--num-epoch-checkpoints", type=int, metavar="N",
                     help="average the last N checkpoint<epoch>.pt files of the --inputs directory")
    num.add_argument("--num-update-checkpoints", type=int, metavar="N",
                     help="average the last N checkpoint_<epoch>_<update>.pt files of the --inputs directory")
    p.add_argument("--force", action="store_true",
                   help="average checkpoints whose model configurations differ (architecture or model "
                   "options), as long as their parameters have the same names and shapes, or whose weights "
                   "hold more than 2**20 integer or boolean values")
    p.add_argument("--checkpoint-upper-bound", type=int, metavar="K",
                   help="with --num-*-checkpoints: only use checkpoints numbered <= K "
                   "(epochs or updates), e.g. N=10, K=50 averages epochs 41-50")
    add_trust_argument(p)
    return p


def setup_logging():
    """Progress to stdout (as fairseq's command lines log), warnings and errors to
    stderr, as plain messages."""
    out = logging.StreamHandler(sys.stdout)
    out.addFilter(lambda record: record.levelno < logging.WARNING)
    err = logging.StreamHandler(sys.stderr)
    err.setLevel(logging.WARNING)
    logger.handlers[:] = [out, err]
    for h in logger.handlers:
        h.setFormatter(logging.Formatter("%(message)s"))
    logger.setLevel(logging.INFO)
    logger.propagate = False


def cli_main(argv=None) -> int:
    args = get_parser().parse_args(argv)
    setup_logging()
    try:
        inputs = resolve_inputs(args)
        logger.info("averaging %d checkpoint(s): %s", len(inputs), " ".join(inputs))
        with trusting(args.trust_checkpoint):
            state = average_checkpoints(inputs, force=args.force)
        save_atomic(state, args.output)
    except AverageError as e:
        logger.error("fairseq-localness-average: error: %s", e)
        return 2
    logger.info("wrote the averaged checkpoint to %s", args.output)
    return 0


if __name__ == "__main__":
    sys.exit(cli_main())
