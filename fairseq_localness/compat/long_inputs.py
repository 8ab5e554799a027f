"""Over-long sentences in ``fairseq-interactive``, ``fairseq-generate`` and the hub.

What fairseq does wrong: a sentence longer than the model's
``--max-source-positions`` makes ``fairseq-interactive`` stop with ``Size of sample
#N is invalid``, losing every line after it; with
``--skip-invalid-size-inputs-valid-test`` the line is dropped without a trace and the
outputs no longer match the inputs. ``fairseq-generate`` stops the same way on such a
test sentence (before its first batch), and the hub interface (``translate``,
``sample``, ``generate``) on such an input.

What the fix changes: :func:`patch_interactive_long_inputs` translates the first
``max_source_positions - 1`` tokens of such a line (and its end of sentence) instead,
with a warning naming the line, and goes on; :func:`patch_generate_long_inputs` and
:func:`patch_hub_long_inputs` do the same there, each warning naming the sentence.
Where the user asked to skip such sentences (``--skip-invalid-size-inputs-valid-test``
for ``fairseq-generate``, ``skip_invalid_size_inputs=True`` for the hub), they are
skipped, as fairseq does.

The tests that fail without it: ``tests/test_faults.py``,
``test_interactive_keeps_going_past_a_line_too_long_for_the_model``;
``tests/test_checkpoint_loading.py``,
``test_fairseq_generate_translates_the_beginning_of_an_over_long_test_sentence`` and
``test_hub_interface_loads_checkpoint_and_translates_an_over_long_sentence``.
"""
import logging

import numpy as np
import torch

from fairseq_localness.compat._patching import replaces

_MARK = "_fairseq_localness_truncates_long_inputs"
_interactive_lines_seen = [0]
_generating = [None]  # inside fairseq-generate's _main: what it reads of a sample


def _truncate(tokens: torch.Tensor, limit: int) -> torch.Tensor:
    """The first ``limit - 1`` tokens of a sentence and its last (the end of sentence)."""
    return torch.cat([tokens[: limit - 1], tokens[-1:]])


def _source_limit(max_positions):
    return max_positions[0] if isinstance(max_positions, (tuple, list)) else max_positions


def _truncate_long(tokens: list, limit: int, logger: logging.Logger, what: str, first: int = 1) -> list:
    """Cut every sentence of ``tokens`` longer than ``limit`` (in place, see
    :func:`_truncate`), each with a warning naming it (``what`` and its number,
    counted from ``first``); returns the indices of those cut."""
    cut = []
    for i, t in enumerate(tokens):
        if t.numel() > limit:
            logger.warning(
                "%s %d has %d tokens (with the end of sentence), more than the model accepts "
                "(max_positions=%s); translating its first %d and the end of sentence",
                what, first + i, t.numel(), limit, limit - 1)
            tokens[i] = _truncate(t, limit)
            cut.append(i)
    return cut


def patch_interactive_long_inputs():
    """Make ``fairseq_cli.interactive`` truncate input lines longer than the model
    accepts, with a warning naming the (1-based) line, instead of stopping or
    dropping them. Idempotent."""
    try:
        from fairseq_cli import interactive
    except ImportError:
        return
    original = interactive.make_batches
    if getattr(original, _MARK, False):
        return
    logger = logging.getLogger("fairseq_localness.interactive")

    def make_batches(lines, cfg, task, max_positions, encode_fn):
        first = _interactive_lines_seen[0]  # lines of earlier buffers
        _interactive_lines_seen[0] += len(lines)
        limit = _source_limit(max_positions)
        if not limit:
            yield from original(lines, cfg, task, max_positions, encode_fn)
            return
        tokenize = task.get_interactive_tokens_and_lengths

        def truncating(lines_, encode_fn_):
            tokens, lengths = tokenize(lines_, encode_fn_)
            for i in _truncate_long(tokens, limit, logger, "input line", first + 1):
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

    interactive.make_batches = replaces(make_batches, original, _MARK)
    interactive.main = replaces(main, original_main, _MARK)


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
    if getattr(original_main, _MARK, False):
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

    generate._main = replaces(_main, original_main, _MARK)
    FairseqTask.filter_indices_by_size = replaces(filter_indices_by_size, original_filter, _MARK)


def patch_hub_long_inputs():
    """Make the hub interface (``from_pretrained(...).translate``/``sample``/
    ``generate``) translate the first ``max_source_positions - 1`` tokens (and the end
    of sentence) of an input longer than the model accepts, with a warning naming the
    (1-based) input, instead of stopping. With ``skip_invalid_size_inputs=True`` such
    inputs are skipped, as fairseq does. Idempotent."""
    from fairseq.hub_utils import GeneratorHubInterface

    original = GeneratorHubInterface._build_batches
    if getattr(original, _MARK, False):
        return
    logger = logging.getLogger("fairseq_localness.hub")

    def _build_batches(self, tokens, skip_invalid_size_inputs):
        limit = _source_limit(self.max_positions)
        if limit and not skip_invalid_size_inputs:
            tokens = list(tokens)
            _truncate_long(tokens, limit, logger, "input sentence")
        return original(self, tokens, skip_invalid_size_inputs)

    GeneratorHubInterface._build_batches = replaces(_build_batches, original, _MARK)
