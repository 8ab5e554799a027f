"""fairseq_localness: locality-aware self-attention as fairseq models.

Load it with ``--user-dir fairseq_localness`` (any fairseq CLI) or ``import
fairseq_localness``. Importing the package registers the models and their named
architectures and the ``adam_l2`` optimizer (:mod:`fairseq_localness.optim`), and
applies this package's fixes to fairseq (:func:`fairseq_localness.compat.apply_all`,
one module each): it makes fairseq load checkpoints on torch >= 2.6 without running
code from them (:mod:`fairseq_localness.checkpoint`), stops fairseq from dropping the
sentences of a last, smaller batch, lets torchrun-launched training run on the CPU,
makes ``--bf16`` train on CUDA GPUs and the CPU when no TPU is set up, translates the
beginning of a sentence too long for the model in ``fairseq-interactive``,
``fairseq-generate`` and the hub interface instead of stopping, and hides the
warnings and debug lines about fairseq's own calls into hydra and torch that a user
cannot act on.
"""
from fairseq_localness import compat

compat.apply_all()

from fairseq_localness import models  # noqa: E402,F401  (registers the models)
from fairseq_localness import optim  # noqa: E402,F401  (registers --optimizer adam_l2)

__version__ = "0.1.0"
