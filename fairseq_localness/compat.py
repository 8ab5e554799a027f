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
``weights_only=`` from a caller still wins). Nothing else in the process changes:
``torch.load`` called anywhere else keeps torch's safe default.

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
"""
import types

import numpy as np

import torch

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
    """Make ``fairseq.checkpoint_utils`` load fairseq checkpoints on torch >= 2.6.

    Idempotent; a no-op on torch versions whose ``torch.load`` has no
    ``weights_only`` argument.
    """
    from fairseq import checkpoint_utils

    if getattr(checkpoint_utils.torch, _MARK, False):
        return
    checkpoint_utils.torch = _TorchWithTrustedLoad()


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
