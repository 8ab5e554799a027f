"""bfloat16 training on GPUs and CPUs (``--bf16``).

What fairseq does wrong: fairseq 0.12 treats ``--bf16`` as TPU-only (fairseq issue
#4696): ``options.parse_args_and_arch`` sets ``--tpu`` whenever ``--bf16`` (or
``--memory-efficient-bf16``) is given, and the ``Trainer`` then asks ``torch_xla`` for
its device, so ``fairseq-train --bf16`` on a CUDA GPU (or the CPU) fails with
``AttributeError: 'NoneType' object has no attribute 'xla_device'`` before training.

What the fix changes: :func:`patch_bf16_without_tpu` wraps
``fairseq.distributed.utils.call_main``, through which ``fairseq-train`` (and
``fairseq-hydra-train``) start training: when ``--bf16`` implied ``--tpu`` and
``torch_xla`` is not installed (so no TPU can be used) or ``--cpu`` is given,
``common.tpu`` is reset before anything reads it. Training then runs where fairseq
would run it without ``--bf16`` (the CUDA GPU, or the CPU with ``--cpu`` or without
a GPU), with what fairseq's ``--bf16`` already does: the model and the float tensors
of each batch in bfloat16, fp32 master weights in ``FP16Optimizer``
(``MemoryEfficientFP16Optimizer`` with ``--memory-efficient-bf16``), no loss
scaling. With ``torch_xla`` installed, ``--bf16`` without ``--cpu`` keeps fairseq's
meaning (TPU). See :func:`bf16_device`.

The test that fails without it: ``tests/test_bf16.py``,
``test_trainer_trains_in_bf16_on_the_cpu`` (and ``test_train_sh_precision_bf16_on_the_cpu``).
"""
import argparse
import importlib.util
import logging

import torch
from omegaconf import DictConfig

from fairseq_localness.compat._patching import replaces

_MARK = "_fairseq_localness_bf16_without_tpu"
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
    if getattr(original, _MARK, False):
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

    dist_utils.call_main = replaces(call_main, original, _MARK)
