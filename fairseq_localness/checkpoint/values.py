"""The values a model is built and translates with: sizes fairseq can build, finite weights.

A checkpoint that passes every other check can still stop fairseq after it has
loaded: ``max_source_positions = 0`` builds a model that rejects every sentence in
generation ("Size of sample #2 is invalid"), an embedding dimension that the heads
do not divide fails an assertion inside the build, and the weights of a training run
that diverged are NaN or infinite, which ends beam search in an ``AssertionError``.
Each of these is refused when the checkpoint is loaded, in one line naming the file
and the setting or weight:

- :func:`check_sizes`: the sizes of :data:`SIZES` are whole numbers of at least 1 (2 for
  ``max_target_positions``, :data:`LEAST`),
  and each embedding dimension is a multiple of its number of attention heads;
- :func:`check_finite`: every floating-point weight (the model's, the criterion's,
  the EMA's) is finite.
"""
import re

import torch

from fairseq_localness.checkpoint.errors import MalformedCheckpointError, short_repr

SIZES = re.compile(r"^(max_(source_|target_)?positions|(encoder|decoder)_(embed_dim|ffn_embed_dim|attention_heads|"
                   r"output_dim|input_dim|out_embed_dim))$")
"""The settings that size a model (and a task's longest sentence): at least 1."""

LEAST = {"max_target_positions": 2}
"""Sizes whose least buildable value is more than 1: a decoder of one position leaves
beam search no room for a word before the end of the sentence (``max_len`` is one
less than the decoder's positions), and fairseq's generator stops on an assertion."""

HEADS = (("encoder_embed_dim", "encoder_attention_heads"), ("decoder_embed_dim", "decoder_attention_heads"))


def check_sizes(leaves, file: str):
    """``leaves``: every setting as ``(dotted path, value)``. Refuses a size of
    :data:`SIZES` that is not a whole number of at least 1, and an embedding dimension
    its attention heads do not divide."""
    groups = {}
    for path, value in leaves:
        parent, _, name = path.rpartition(".")
        if not SIZES.match(name) or value is None:
            continue
        least = LEAST.get(name, 1)
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise MalformedCheckpointError(
                file, f"its setting {path} = {short_repr(value, 40)} is not a size fairseq can build or translate "
                f"with (a whole number of at least {least})")
        groups.setdefault(parent, {})[name] = value
    for parent, sizes in groups.items():
        for dim, heads in HEADS:
            if dim in sizes and heads in sizes and sizes[dim] % sizes[heads]:
                raise MalformedCheckpointError(
                    file, f"its setting {parent}.{dim} = {sizes[dim]} is not a multiple of {parent}.{heads} = "
                    f"{sizes[heads]}, which fairseq's attention needs")


def _weights(state):
    if isinstance(state.get("model"), dict):
        yield "", state["model"]
    if isinstance(state.get("criterion"), dict):
        yield "criterion's ", state["criterion"]
    extra = state.get("extra_state")
    if isinstance(extra, dict):
        for key in ("ema", "ema_fp32_params"):
            if isinstance(extra.get(key), dict):
                yield "EMA's ", extra[key]


def check_finite(state, file: str):
    """Refuse a checkpoint whose weights hold NaN or infinite values, as the
    checkpoints of a training run that diverged do (one pass over the weights, each
    view of a storage once however many names it has)."""
    if not isinstance(state, dict):
        return
    seen = set()  # (a weight under many names is checked once: 130,000 names of one tensor took an hour)
    for what, weights in _weights(state):
        for name, tensor in weights.items():
            if not (isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel()):
                continue
            view = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tensor.stride(), tensor.dtype)
            if view in seen:
                continue
            seen.add(view)
            finite = torch.isfinite(tensor)
            if not bool(finite.all()):
                bad = int(finite.numel() - finite.sum())
                raise MalformedCheckpointError(
                    file, f"its {what}weight {name} holds {bad:,} NaN or infinite values (of {tensor.numel():,}): the "
                    "training run that wrote it diverged (its loss became NaN or infinite) before it was saved, and "
                    "no translation can come of it; use a checkpoint saved before the divergence (an earlier "
                    "checkpoint_N.pt, or checkpoint_best.pt), and resume from it with a lower learning rate or "
                    "more warm-up")
