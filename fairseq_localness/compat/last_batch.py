"""The sentences of the last, smaller batch, kept.

What fairseq does wrong: ``fairseq.data.data_utils.batch_by_size`` (0.12.2 and later)
drops the last batch when its size is not a multiple of
``--required-batch-size-multiple`` (default 8): ``fairseq-generate`` then silently
translates, and scores, fewer sentences than the test set has (fairseq issues #5036,
#5351), validation skips a few sentences, and ``fairseq-interactive`` loses inputs.

What the fix changes: :func:`patch_batch_by_size` keeps that last, smaller batch, as
fairseq did before.

The test that fails without it: ``tests/test_checkpoint_loading.py``,
``test_fairseq_generate_loads_checkpoint`` (12 test sentences in batches of 8: the
last 4 are lost).
"""
import numpy as np

from fairseq_localness.compat._patching import replaces

_MARK = "_fairseq_localness_keeps_last_batch"


def patch_batch_by_size():
    """Make ``fairseq.data.data_utils.batch_by_size`` keep every index. Idempotent.

    The batches it builds are consecutive slices of ``indices``; whatever the
    original function dropped at the end becomes one more (smaller) batch.
    """
    from fairseq.data import data_utils

    original = data_utils.batch_by_size
    if getattr(original, _MARK, False):
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

    data_utils.batch_by_size = replaces(batch_by_size, original, _MARK)
