"""fairseq_localness: locality-aware self-attention as fairseq models.

Load it with ``--user-dir fairseq_localness`` (any fairseq CLI) or ``import
fairseq_localness``. Importing the package registers the models and their named
architectures and the ``adam_l2`` optimizer (:mod:`fairseq_localness.optim`), fixes
checkpoint loading on torch >= 2.6, stops fairseq from dropping the sentences of a
last, smaller batch, lets torchrun-launched training run on the CPU, makes ``--bf16``
train on CUDA GPUs and the CPU when no TPU is set up, and keeps
``fairseq-interactive`` going past an over-long line (see
:mod:`fairseq_localness.compat`).
"""
from fairseq_localness.compat import (
    patch_batch_by_size,
    patch_bf16_without_tpu,
    patch_checkpoint_loading,
    patch_cpu_distributed,
    patch_interactive_long_inputs,
)

patch_checkpoint_loading()
patch_batch_by_size()
patch_cpu_distributed()
patch_bf16_without_tpu()
patch_interactive_long_inputs()

from fairseq_localness import models  # noqa: E402,F401  (registers the models)
from fairseq_localness import optim  # noqa: E402,F401  (registers --optimizer adam_l2)

__version__ = "0.1.0"
