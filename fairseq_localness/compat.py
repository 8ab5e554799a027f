"""Compatibility fixes for running fairseq 0.12.x on current torch.

Checkpoint loading on torch >= 2.6
----------------------------------
torch 2.6 changed the default of ``torch.load`` to ``weights_only=True``. fairseq
checkpoints pickle an ``argparse.Namespace`` and an OmegaConf tree next to the
weights, so every fairseq entry point that reads a checkpoint
(``fairseq-generate``, ``fairseq-interactive``, resuming ``fairseq-train``, the hub
interface ``from_pretrained``) fails with ``Unsupported global: argparse.Namespace``.
``torch.serialization.add_safe_globals`` does not cover everything fairseq pickles.

All of those entry points read checkpoints through ``fairseq.checkpoint_utils``, and
all of them import the ``--user-dir`` before the first read. We therefore give that
one module a ``torch`` whose ``load`` defaults to ``weights_only=False`` (an explicit
``weights_only=`` from a caller still wins). Distributed training that resumes reads
the checkpoint on rank 0 and sends its state to the other ranks, which unpickle it
with ``torch.load`` in ``fairseq.distributed.utils``; that module gets the same
``torch``. Nothing else in the process changes: ``torch.load`` called anywhere else
keeps torch's safe default.

This restores the behaviour fairseq was written for: a checkpoint is trusted code,
exactly as with torch < 2.6. Load only checkpoints you trust.

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
(device 0, no ``device_ids``); with GPUs nothing changes.

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
Over-long lines in ``fairseq-interactive``
------------------------------------------
A line longer than the model's ``--max-source-positions`` makes
``fairseq-interactive`` stop with ``Size of sample #N is invalid``, losing every line
after it; with ``--skip-invalid-size-inputs-valid-test`` the line is dropped without
a trace and the outputs no longer match the inputs. :func:`patch_interactive_long_inputs`
translates the first ``max_source_positions - 1`` tokens of such a line (and its end
of sentence) instead, with a warning naming the line, and goes on.
"""
import argparse
import importlib.util
import logging
import os
import types

import numpy as np

import torch
from omegaconf import DictConfig

_MARK = "_fairseq_localness_trusted_load"


def trusted_torch_load(f, *args, **kwargs):
    """``torch.load`` for fairseq checkpoints: full unpickling unless told otherwise."""
    kwargs.setdefault("weights_only", False)
    return torch.load(f, *args, **kwargs)


class _TorchWithTrustedLoad(types.ModuleType):
    """A stand-in for the ``torch`` module inside ``fairseq.checkpoint_utils``.

    Every attribute is torch's own, except ``load``.
    """

    def __init__(self):
        super().__init__("torch")
        setattr(self, _MARK, True)
        self.load = trusted_torch_load

    def __getattr__(self, name):
        return getattr(torch, name)


def patch_checkpoint_loading():
    """Make ``fairseq.checkpoint_utils`` load fairseq checkpoints on torch >= 2.6
    (and ``fairseq.distributed.utils`` receive them from rank 0).

    Idempotent; a no-op on torch versions whose ``torch.load`` has no
    ``weights_only`` argument.
    """
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    for module in (checkpoint_utils, distributed_utils):
        if not getattr(module.torch, _MARK, False):
            module.torch = _TorchWithTrustedLoad()


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
      requires ``None`` there).
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
