"""Compatibility fixes for running fairseq 0.12.x on current torch.

Checkpoint loading on torch >= 2.6, without running the checkpoint's code
--------------------------------------------------------------------------
torch 2.6 changed the default of ``torch.load`` to ``weights_only=True``. fairseq
checkpoints pickle an ``argparse.Namespace`` (the model's options) next to the
weights, so every fairseq entry point that reads a checkpoint (``fairseq-generate``,
``fairseq-interactive``, resuming ``fairseq-train``, the hub interface
``from_pretrained``) fails with ``Unsupported global: argparse.Namespace``.

All of those entry points read checkpoints through ``fairseq.checkpoint_utils``, and
all of them import the ``--user-dir`` before the first read. :func:`patch_checkpoint_loading`
gives that one module a ``torch`` whose ``load`` is
:func:`fairseq_localness.checkpoint.torch_load_checkpoint`: ``weights_only=True`` with
``argparse.Namespace`` allowed, which is everything a fairseq 0.12 checkpoint holds; a
checkpoint that needs anything else (a pickle that would call ``os.system``, say) is
refused in one line naming what it needs, before it is unpickled, unless
``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1`` says to trust it (docs/security.md).
Nothing else in the process changes: ``torch.load`` called anywhere else keeps
torch's own default.

Distributed training that resumes reads the checkpoint on rank 0 (through the load
above) and sends the state it built to the other ranks, which unpickle it with
``torch.load`` in ``fairseq.distributed.utils``. That message holds OmegaConf
objects and fairseq's own placeholders, which ``weights_only`` refuses; it is no
file but what rank 0 of the same job pickled from objects it built (from a
checkpoint that passed the safe load), so that module's ``torch.load`` keeps full
unpickling for it (:func:`process_group_torch_load`).

Sentences dropped from the last batch
-------------------------------------
``fairseq.data.data_utils.batch_by_size`` (0.12.2 and later) drops the last batch
when its size is not a multiple of ``--required-batch-size-multiple`` (default 8):
``fairseq-generate`` then silently translates, and scores, fewer sentences than the
test set has (fairseq issues #5036, #5351), validation skips a few sentences, and
``fairseq-interactive`` loses inputs. :func:`patch_batch_by_size` keeps that last,
smaller batch, as fairseq did before.

Distributed training on CPU (gloo)
----------------------------------
Started by ``torchrun`` (``python -m torch.distributed.run``), fairseq 0.12 reads
``RANK``/``WORLD_SIZE`` from the environment and sets each process's device to
``RANK % torch.cuda.device_count()``: a ``ZeroDivisionError`` on a machine without
GPUs, even with ``--cpu``. Its ``pytorch_ddp``/``c10d`` wrapper then passes
``device_ids=[device_id]`` to ``DistributedDataParallel``, which torch refuses for
a model on the CPU. :func:`patch_cpu_distributed` makes both work without a GPU
(device 0, no ``device_ids``); with GPUs nothing changes. fairseq also leaves its
process groups to the interpreter's exit, where gloo's destructor can abort a
finished process ("terminate called without an active exception", exit status
-6, after the last checkpoint was written); :func:`patch_cpu_distributed` destroys
them once training has returned, on every device.

bfloat16 training on GPUs and CPUs (``--bf16``)
-----------------------------------------------
fairseq 0.12 treats ``--bf16`` as TPU-only: ``options.parse_args_and_arch`` sets
``--tpu`` whenever ``--bf16`` (or ``--memory-efficient-bf16``) is given, and the
``Trainer`` then asks ``torch_xla`` for its device, so ``fairseq-train --bf16`` on a
CUDA GPU (or the CPU) fails with ``AttributeError: 'NoneType' object has no attribute
'xla_device'`` before training. :func:`patch_bf16_without_tpu` wraps
``fairseq.distributed.utils.call_main``, through which ``fairseq-train`` (and
``fairseq-hydra-train``) start training: when ``--bf16`` implied ``--tpu`` and
``torch_xla`` is not installed (so no TPU can be used) or ``--cpu`` is given,
``common.tpu`` is reset before anything reads it. Training then runs where fairseq
would run it without ``--bf16`` (the CUDA GPU, or the CPU with ``--cpu`` or without
a GPU), with what fairseq's ``--bf16`` already does: the model and the float tensors of each batch in
bfloat16, fp32 master weights in ``FP16Optimizer`` (``MemoryEfficientFP16Optimizer``
with ``--memory-efficient-bf16``), no loss scaling. With ``torch_xla`` installed,
``--bf16`` without ``--cpu`` keeps fairseq's meaning (TPU). See :func:`bf16_device`.
Over-long sentences in ``fairseq-interactive``, ``fairseq-generate`` and the hub
----------------------------------------------------------------------------------
A sentence longer than the model's ``--max-source-positions`` makes
``fairseq-interactive`` stop with ``Size of sample #N is invalid``, losing every line
after it; with ``--skip-invalid-size-inputs-valid-test`` the line is dropped without
a trace and the outputs no longer match the inputs. :func:`patch_interactive_long_inputs`
translates the first ``max_source_positions - 1`` tokens of such a line (and its end
of sentence) instead, with a warning naming the line, and goes on.
``fairseq-generate`` stops the same way on such a test sentence (before its first
batch) and the hub interface (``translate``, ``sample``, ``generate``) on such an
input: :func:`patch_generate_long_inputs` and :func:`patch_hub_long_inputs` do the
same there, each warning naming the sentence. Where the user asked to skip such
sentences (``--skip-invalid-size-inputs-valid-test`` for ``fairseq-generate``,
``skip_invalid_size_inputs=True`` for the hub), they are skipped, as fairseq does.

Hydra's deprecation warnings
----------------------------
Every fairseq command builds its configuration through ``hydra.experimental``, and
hydra 1.3 prints about a dozen lines of deprecation warnings about it (no
``version_base``, ``# @package _group_``, schema matching, ``strict=``, ...), which a
user cannot act on. :func:`filter_hydra_deprecation_warnings` hides those, by
message (:data:`HYDRA_DEPRECATIONS`), and nothing else. fairseq imports the
``--user-dir`` while parsing the command line, before it builds the configuration,
so none of them is printed.
"""
import argparse
import functools
import importlib.util
import logging
import os
import sys
import types

import numpy as np

import torch
from omegaconf import DictConfig

_MARK = "_fairseq_localness_checkpoint_load"


def process_group_torch_load(f, *args, **kwargs):
    """``torch.load`` for what rank 0 of this job sends the other ranks
    (``fairseq.distributed.utils``): full unpickling unless told otherwise. No file is
    read through it."""
    kwargs.setdefault("weights_only", False)
    return torch.load(f, *args, **kwargs)


class _TorchWithLoad(types.ModuleType):
    """A stand-in for the ``torch`` module inside one fairseq module.

    Every attribute is torch's own, except ``load``.
    """

    def __init__(self, load):
        super().__init__("torch")
        setattr(self, _MARK, True)
        self.load = load

    def __getattr__(self, name):
        return getattr(torch, name)


def _first_line(error: BaseException) -> str:
    """The error's type and message on one line, at most about 240 characters."""
    line = " ".join(str(error).split())
    line = line if len(line) <= 240 else line[:237] + "..."
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def _one_line_failures(function, files_of):
    """``function`` (which builds a model from a checkpoint) with every failure that
    is not about the environment (a missing file is) raised as one
    :class:`~fairseq_localness.checkpoint.CheckpointError` naming the checkpoint."""
    from fairseq_localness.checkpoint import CheckpointError, MalformedCheckpointError

    if getattr(function, _MARK, False):
        return function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (CheckpointError, OSError):
            raise
        except Exception as e:
            cause = e.__context__ if str(e).startswith("Cannot load model parameters from checkpoint") else e
            raise MalformedCheckpointError(
                files_of(*args, **kwargs),
                f"fairseq cannot build the model it describes ({_first_line(cause or e)})") from e

    setattr(wrapper, _MARK, True)
    return wrapper


def patch_checkpoint_loading():
    """Make ``fairseq.checkpoint_utils`` load fairseq checkpoints on torch >= 2.6
    through :func:`~fairseq_localness.checkpoint.torch_load_checkpoint`, and
    ``fairseq.distributed.utils`` receive the state rank 0 sends; make fairseq's
    ``eval()`` of its settings parse literals only
    (:mod:`fairseq_localness.checkpoint.literals`); refuse a checkpoint whose
    settings describe a model larger than it stores before fairseq allocates it
    (:mod:`fairseq_localness.checkpoint.model_size`); turn a failure to build a model
    from a loaded checkpoint (weights that do not fit the model its settings
    describe, a damaged setting) into one line naming the file, in
    ``load_checkpoint_to_cpu`` (fairseq's upgrade of older settings),
    ``load_model_ensemble_and_task`` (generation, the hub, the analyses) and
    ``Trainer.load_checkpoint`` (resuming, ``--restore-file``,
    ``--finetune-from-model``). Installs the hook that prints a refused checkpoint
    as one line. Idempotent.
    """
    from fairseq import checkpoint_utils, models, trainer
    from fairseq.distributed import utils as distributed_utils

    from fairseq_localness.checkpoint import install_excepthook, literals, torch_load_checkpoint
    from fairseq_localness.checkpoint.model_size import guarded_build_model

    literals.install()
    models.build_model = guarded_build_model(models.build_model)
    for module, load in ((checkpoint_utils, torch_load_checkpoint), (distributed_utils, process_group_torch_load)):
        if not getattr(module.torch, _MARK, False):
            module.torch = _TorchWithLoad(load)
    checkpoint_utils.load_checkpoint_to_cpu = _one_line_failures(
        checkpoint_utils.load_checkpoint_to_cpu, lambda path, *a, **k: str(path))
    checkpoint_utils.load_model_ensemble_and_task = _one_line_failures(
        checkpoint_utils.load_model_ensemble_and_task, lambda filenames, *a, **k: ", ".join(map(str, filenames)))
    trainer.Trainer.load_checkpoint = _one_line_failures(
        trainer.Trainer.load_checkpoint, lambda self, filename, *a, **k: str(filename))
    install_excepthook()


_BATCH_MARK = "_fairseq_localness_keeps_last_batch"


def patch_batch_by_size():
    """Make ``fairseq.data.data_utils.batch_by_size`` keep every index. Idempotent.

    The batches it builds are consecutive slices of ``indices``; whatever the
    original function dropped at the end becomes one more (smaller) batch.
    """
    from fairseq.data import data_utils

    original = data_utils.batch_by_size
    if getattr(original, _BATCH_MARK, False):
        return

    def batch_by_size(indices, *args, **kwargs):
        batches = original(indices, *args, **kwargs)
        covered = sum(len(b) for b in batches)
        if covered < len(indices):
            rest = np.asarray(indices[covered:], dtype=np.int64)
            if not np.array_equal(np.concatenate([np.asarray(b, dtype=np.int64) for b in batches] + [rest]),
                                  np.asarray(indices, dtype=np.int64)):
                return batches  # not the consecutive-slices layout we know how to complete
            batches = list(batches) + [rest]
        return batches

    batch_by_size.__doc__ = original.__doc__
    batch_by_size.__wrapped__ = original
    setattr(batch_by_size, _BATCH_MARK, True)
    data_utils.batch_by_size = batch_by_size


_DIST_MARK = "_fairseq_localness_cpu_distributed"


def patch_cpu_distributed():
    """Let fairseq's torchrun-launched training and its DDP wrapper run on the CPU.

    Two changes, each active only where fairseq would otherwise fail without CUDA;
    idempotent:

    - ``fairseq.distributed.utils._infer_torch_distributed_launch_init`` (it reads
      ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT`` through
      ``init_method="env://"``): with no CUDA device, ``device_id`` is 0 instead of
      ``RANK % 0``; with GPUs it is fairseq's own function;
    - the ``DistributedDataParallel`` used by
      ``fairseq.models.distributed_fairseq_model`` drops ``device_ids`` and
      ``output_device`` for a module whose parameters are on the CPU (torch
      requires ``None`` there);
    - ``fairseq.distributed.utils.distributed_main`` (each process's training,
      ending with fairseq's barrier) then destroys the process groups, so no
      communicator is torn down by the interpreter's exit; a process of a group of
      several on the CPU (gloo) then ends at once (``os._exit(0)``, its output
      flushed), as gloo could still abort it in the interpreter's teardown. Only
      after training returned: a failing process keeps its error and exit status.
    """
    from fairseq.distributed import utils as dist_utils
    from fairseq.models import distributed_fairseq_model as dfm

    original_infer = dist_utils._infer_torch_distributed_launch_init
    if not getattr(original_infer, _DIST_MARK, False):

        def _infer_torch_distributed_launch_init(cfg):
            if torch.cuda.device_count() > 0:
                return original_infer(cfg)
            cfg.distributed_init_method = "env://"
            cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
            cfg.distributed_rank = int(os.environ["RANK"])
            cfg.device_id = 0  # the CPU; never passed to torch.cuda
            cfg.distributed_no_spawn = True  # processes are created by torchrun

        _infer_torch_distributed_launch_init.__wrapped__ = original_infer
        setattr(_infer_torch_distributed_launch_init, _DIST_MARK, True)
        dist_utils._infer_torch_distributed_launch_init = _infer_torch_distributed_launch_init

    original_ddp = dfm.DistributedDataParallel
    if not getattr(original_ddp, _DIST_MARK, False):

        class DistributedDataParallel(original_ddp):
            def __init__(self, module, *args, **kwargs):
                if all(p.device.type == "cpu" for p in module.parameters()):
                    kwargs["device_ids"] = None
                    kwargs["output_device"] = None
                super().__init__(module, *args, **kwargs)

        DistributedDataParallel.__doc__ = original_ddp.__doc__
        setattr(DistributedDataParallel, _DIST_MARK, True)
        dfm.DistributedDataParallel = DistributedDataParallel

    original_main = dist_utils.distributed_main
    if not getattr(original_main, _DIST_MARK, False):

        def distributed_main(i, main, cfg, kwargs):
            original_main(i, main, cfg, kwargs)
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                world = torch.distributed.get_world_size()
                torch.distributed.destroy_process_group()
                if world > 1 and torch.cuda.device_count() == 0:
                    # gloo can still abort a finished process in the interpreter's teardown
                    # ("terminate called without an active exception", exit status -6) after
                    # the group is destroyed: training has returned and written everything,
                    # so the process ends here, its output flushed
                    logging.shutdown()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)

        distributed_main.__wrapped__ = original_main
        setattr(distributed_main, _DIST_MARK, True)
        dist_utils.distributed_main = distributed_main


_BF16_MARK = "_fairseq_localness_bf16_without_tpu"
logger = logging.getLogger(__name__)


def torch_xla_available() -> bool:
    """Whether ``torch_xla`` (fairseq's route to TPUs) is installed."""
    return importlib.util.find_spec("torch_xla") is not None


def bf16_device(cfg, xla_available=None, cuda_available=None) -> str:
    """Where a fairseq config trains, after the ``--bf16`` fix: ``"cuda"``, ``"cpu"``
    or ``"tpu"``; resets ``tpu`` (in ``cfg.common`` and the groups that copy it) when
    ``--bf16`` implied it and no TPU can be used (``torch_xla`` is not installed) or
    ``--cpu`` asks for the CPU.

    ``xla_available`` and ``cuda_available`` default to this machine's (they are
    parameters so the choice can be checked for any machine). The dtype is
    fairseq's: the ``Trainer`` casts the model to bfloat16 for ``common.bf16``.
    """
    common = cfg.common
    if xla_available is None:
        xla_available = torch_xla_available()
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    if common.bf16 and common.tpu and (common.cpu or not xla_available):
        # --bf16 set --tpu (options.parse_args_and_arch); without torch_xla there is
        # no TPU (and --cpu asks for the CPU), so bf16 runs on the device fairseq
        # picks without --tpu. The groups that copy common.tpu (optimizer,
        # distributed_training, a model Namespace) hold the value itself after
        # convert_namespace_to_omegaconf.
        common.tpu = False
        for name in cfg:
            group = cfg[name]
            if isinstance(group, argparse.Namespace):
                if getattr(group, "tpu", False):
                    group.tpu = False
            elif isinstance(group, DictConfig) and group.get("tpu", False):
                group.tpu = False
    if common.tpu:
        return "tpu"
    return "cuda" if cuda_available and not common.cpu else "cpu"


def patch_bf16_without_tpu():
    """Make ``fairseq-train --bf16`` train in bfloat16 on a CUDA GPU or the CPU when
    ``torch_xla`` is not installed (fairseq's ``--bf16`` otherwise implies ``--tpu``).
    Idempotent; changes nothing for configs without ``--bf16``.
    """
    from fairseq.distributed import utils as dist_utils

    original = dist_utils.call_main
    if getattr(original, _BF16_MARK, False):
        return

    def call_main(cfg, main, **kwargs):
        device = bf16_device(cfg) if cfg.common.bf16 and cfg.common.tpu else None
        if device in ("cuda", "cpu"):  # --bf16 had implied --tpu; now it is off
            if device == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
                logger.warning(
                    "--bf16: %s has no native bfloat16 arithmetic (compute capability %s, "
                    "bfloat16 needs 8.0); it runs emulated and slowly: --fp16 is faster there",
                    torch.cuda.get_device_name(), ".".join(map(str, torch.cuda.get_device_capability())),
                )
            logger.info("--bf16: training in bfloat16 on the %s (no TPU: %s)", device.upper(),
                        "--cpu" if cfg.common.cpu else "torch_xla is not installed")
        return original(cfg, main, **kwargs)

    call_main.__doc__ = original.__doc__
    call_main.__wrapped__ = original
    setattr(call_main, _BF16_MARK, True)
    dist_utils.call_main = call_main
_LONG_MARK = "_fairseq_localness_truncates_long_inputs"
_interactive_lines_seen = [0]


def patch_interactive_long_inputs():
    """Make ``fairseq_cli.interactive`` truncate input lines longer than the model
    accepts, with a warning naming the (1-based) line, instead of stopping or
    dropping them. Idempotent."""
    import logging

    try:
        from fairseq_cli import interactive
    except ImportError:
        return
    original = interactive.make_batches
    if getattr(original, _LONG_MARK, False):
        return
    logger = logging.getLogger("fairseq_localness.interactive")

    def make_batches(lines, cfg, task, max_positions, encode_fn):
        first = _interactive_lines_seen[0]  # lines of earlier buffers
        _interactive_lines_seen[0] += len(lines)
        limit = max_positions[0] if isinstance(max_positions, (tuple, list)) else max_positions
        if not limit:
            yield from original(lines, cfg, task, max_positions, encode_fn)
            return
        tokenize = task.get_interactive_tokens_and_lengths

        def truncating(lines_, encode_fn_):
            tokens, lengths = tokenize(lines_, encode_fn_)
            for i, t in enumerate(tokens):
                if t.numel() > limit:
                    logger.warning(
                        "input line %d has %d tokens (with the end of sentence), more than the model accepts "
                        "(max_positions=%s); translating its first %d and the end of sentence",
                        first + i + 1, t.numel(), limit, limit - 1)
                    tokens[i] = torch.cat([t[: limit - 1], t[-1:]])
                    lengths[i] = limit
            return tokens, lengths

        task.get_interactive_tokens_and_lengths = truncating
        try:
            yield from original(lines, cfg, task, max_positions, encode_fn)
        finally:
            del task.get_interactive_tokens_and_lengths

    original_main = interactive.main

    def main(cfg):
        _interactive_lines_seen[0] = 0  # line numbers count from the start of this session
        return original_main(cfg)

    for new, old in ((make_batches, original), (main, original_main)):
        new.__doc__ = old.__doc__
        new.__wrapped__ = old
        setattr(new, _LONG_MARK, True)
    interactive.make_batches = make_batches
    interactive.main = main


HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.initialize\(\) is no longer experimental",
    r"hydra\.experimental\.compose\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'",
    r"\s*'[^']*' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
)
"""The starts of the deprecation warnings hydra prints each time fairseq 0.12 builds
its configuration (``convert_namespace_to_omegaconf``: ``hydra.experimental``'s
``initialize``/``compose``, no ``version_base``, ``# @package _group_`` headers,
automatic schema matching, ``strict=``)."""


def filter_hydra_deprecation_warnings():
    """Hide the deprecation warnings of :data:`HYDRA_DEPRECATIONS`, by message, and
    only those: about a dozen lines on every fairseq command, about fairseq's use of
    hydra, which a user cannot act on. Idempotent (``warnings`` keeps one copy of a
    filter)."""
    import warnings

    for message in HYDRA_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


def _truncate(tokens: torch.Tensor, limit: int) -> torch.Tensor:
    """The first ``limit - 1`` tokens of a sentence and its last (the end of sentence)."""
    return torch.cat([tokens[: limit - 1], tokens[-1:]])


def _source_limit(max_positions):
    return max_positions[0] if isinstance(max_positions, (tuple, list)) else max_positions


_generating = [None]  # inside fairseq-generate's _main: what it reads of a sample


def patch_generate_long_inputs():
    """Make ``fairseq-generate`` translate the first ``max_source_positions - 1``
    tokens (and the end of sentence) of a test sentence longer than the model
    accepts, with a warning naming the sentence, instead of stopping before the first
    batch with ``Size of sample #N is invalid``. Idempotent.

    Only without ``--skip-invalid-size-inputs-valid-test`` (with it, fairseq skips
    such sentences, as asked; ``scripts/evaluate.sh`` relies on that and accounts for
    them). The reference is not truncated: decoding does not read it, so an over-long
    reference is kept whole for the score, unless ``--score-reference`` or
    ``--prefix-size`` feeds it to the model, where fairseq's error stands.
    """
    try:
        from fairseq_cli import generate
    except ImportError:
        return
    from fairseq.data import BaseWrapperDataset, LanguagePairDataset
    from fairseq.tasks import FairseqTask

    original_main = generate._main
    if getattr(original_main, _LONG_MARK, False):
        return
    original_filter = FairseqTask.filter_indices_by_size
    logger = logging.getLogger("fairseq_localness.generate")

    class TruncatedSentences(BaseWrapperDataset):
        """``dataset`` with the sentences ``ids`` cut to ``limit`` tokens (see :func:`_truncate`)."""

        def __init__(self, dataset, ids, limit):
            super().__init__(dataset)
            self.ids, self.limit = frozenset(int(i) for i in ids), limit

        def __getitem__(self, index):
            item = self.dataset[index]
            return _truncate(item, self.limit) if index in self.ids and item.numel() > self.limit else item

        @property
        def sizes(self):
            return np.minimum(self.dataset.sizes, self.limit)

    def filter_indices_by_size(self, indices, dataset, max_positions=None, ignore_invalid_inputs=False):
        state = _generating[0]
        limit = _source_limit(max_positions)
        if (state is None or ignore_invalid_inputs or not limit or not isinstance(dataset, LanguagePairDataset)
                or getattr(dataset, "buckets", None) is not None):
            return original_filter(self, indices, dataset, max_positions, ignore_invalid_inputs)
        indices = np.asarray(indices)
        if state["reads_target"] and dataset.tgt_sizes is not None:
            # the model reads the reference: an over-long one stays fairseq's error (before any batch)
            target_limit = max_positions[1] if isinstance(max_positions, (tuple, list)) else max_positions
            if target_limit and (dataset.tgt_sizes[indices] > target_limit).any():
                return original_filter(self, indices, dataset, max_positions, ignore_invalid_inputs)
        long_ids = indices[dataset.src_sizes[indices] > limit]
        for i in sorted(long_ids.tolist()):
            logger.warning(
                "sentence %d of '%s' (S-%d/H-%d in the output, line %d of its text) has %d tokens (with the end of "
                "sentence), more than the model accepts (max_positions=%s); translating its first %d and the end "
                "of sentence", i, state["subset"], i, i, i + 1, int(dataset.src_sizes[i]), limit, limit - 1)
        if len(long_ids):
            dataset.src = TruncatedSentences(dataset.src, long_ids, limit)
            dataset.src_sizes = np.minimum(dataset.src_sizes, limit)
            if dataset.tgt_sizes is not None:
                dataset.sizes = np.vstack((dataset.src_sizes, dataset.tgt_sizes)).T
            else:
                dataset.sizes = dataset.src_sizes
        return indices

    def _main(cfg, output_file):
        _generating[0] = {
            "subset": cfg.dataset.gen_subset,
            "reads_target": bool(cfg.generation.score_reference or (cfg.generation.prefix_size or 0) > 0),
        }
        try:
            return original_main(cfg, output_file)
        finally:
            _generating[0] = None

    for new, old in ((_main, original_main), (filter_indices_by_size, original_filter)):
        new.__doc__ = old.__doc__
        new.__wrapped__ = old
        setattr(new, _LONG_MARK, True)
    generate._main = _main
    FairseqTask.filter_indices_by_size = filter_indices_by_size


def patch_hub_long_inputs():
    """Make the hub interface (``from_pretrained(...).translate``/``sample``/
    ``generate``) translate the first ``max_source_positions - 1`` tokens (and the end
    of sentence) of an input longer than the model accepts, with a warning naming the
    (1-based) input, instead of stopping. With ``skip_invalid_size_inputs=True`` such
    inputs are skipped, as fairseq does. Idempotent."""
    from fairseq.hub_utils import GeneratorHubInterface

    original = GeneratorHubInterface._build_batches
    if getattr(original, _LONG_MARK, False):
        return
    logger = logging.getLogger("fairseq_localness.hub")

    def _build_batches(self, tokens, skip_invalid_size_inputs):
        limit = _source_limit(self.max_positions)
        if limit and not skip_invalid_size_inputs:
            tokens = list(tokens)
            for i, t in enumerate(tokens):
                if t.numel() > limit:
                    logger.warning(
                        "input sentence %d has %d tokens (with the end of sentence), more than the model accepts "
                        "(max_positions=%s); translating its first %d and the end of sentence",
                        i + 1, t.numel(), limit, limit - 1)
                    tokens[i] = _truncate(t, limit)
        return original(self, tokens, skip_invalid_size_inputs)

    _build_batches.__doc__ = original.__doc__
    _build_batches.__wrapped__ = original
    setattr(_build_batches, _LONG_MARK, True)
    GeneratorHubInterface._build_batches = _build_batches
