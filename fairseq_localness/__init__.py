"""fairseq_localness: locality-aware self-attention as fairseq models.

Load it with ``--user-dir fairseq_localness`` (any fairseq CLI) or ``import
fairseq_localness``. Importing the package registers the models and their named
architectures and the ``adam_l2`` optimizer (:mod:`fairseq_localness.optim`), makes
fairseq load checkpoints on torch >= 2.6 without running code from them
(:mod:`fairseq_localness.checkpoint`), stops fairseq from dropping the sentences of a
last, smaller batch, lets torchrun-launched training run on the CPU, makes ``--bf16``
train on CUDA GPUs and the CPU when no TPU is set up, translates the beginning of a
sentence too long for the model in ``fairseq-interactive``, ``fairseq-generate`` and
the hub interface instead of stopping, and hides hydra's deprecation warnings about
fairseq's configuration (see :mod:`fairseq_localness.compat`).
"""
from fairseq_localness.compat import (
    filter_hydra_deprecation_warnings,
    patch_batch_by_size,
    patch_bf16_without_tpu,
    patch_checkpoint_loading,
    patch_cpu_distributed,
    patch_generate_long_inputs,
    patch_hub_long_inputs,
    patch_interactive_long_inputs,
)

filter_hydra_deprecation_warnings()

patch_checkpoint_loading()
patch_batch_by_size()
patch_cpu_distributed()
patch_bf16_without_tpu()
patch_interactive_long_inputs()
patch_generate_long_inputs()
patch_hub_long_inputs()

from fairseq_localness import models  # noqa: E402,F401  (registers the models)
from fairseq_localness import optim  # noqa: E402,F401  (registers --optimizer adam_l2)

__version__ = "0.1.0"
