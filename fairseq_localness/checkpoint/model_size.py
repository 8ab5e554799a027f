"""A model built from a checkpoint's settings is no larger than what it stores.

fairseq builds the model a checkpoint's settings describe, allocating and
initialising every weight, before it compares the stored weights with it: a
checkpoint of a few kilobytes whose settings claim ``max_source_positions =
5000000`` or ``encoder_ffn_embed_dim = 5000000`` makes fairseq allocate gigabytes
(the sinusoidal positions are not stored at all, so such a file would even load).

:func:`guarded_build_model` wraps ``fairseq.models.build_model``: when a model is
built for a checkpoint (``from_checkpoint=True``, as ``load_model_ensemble_and_task``
builds it, for generation, the hub and the analyses), it is first built on torch's
``meta`` device, which allocates nothing, and its weights and buffers are counted;
more than the checkpoint stores plus a quarter plus :data:`SLACK` (buffers that are
not stored, such as the positions' table) is refused in one line naming the file.
:func:`remember_weights` notes what the last checkpoint loaded stores.
"""
import copy
import functools
import threading

import torch

from fairseq_localness.checkpoint.errors import UntrustedCheckpointError

SLACK = 1 << 24
"""Elements a model may have beyond what its checkpoint stores: 64 MiB in float32."""

_last = threading.local()


def remember_weights(state, file: str):
    """Note the elements of the weights ``state["model"]`` stores (from ``file``)."""
    model = state.get("model") if isinstance(state, dict) else None
    if isinstance(model, dict):
        _last.file = file
        _last.numel = sum(v.numel() for v in model.values() if isinstance(v, torch.Tensor))


def _count(model) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() for t in tensors.values())


def guarded_build_model(build_model):
    """``fairseq.models.build_model`` that refuses a checkpoint's model larger than
    the checkpoint (see the module docstring)."""
    if getattr(build_model, "_fairseq_localness_guarded", False):
        return build_model

    @functools.wraps(build_model)
    def guarded(cfg, task, from_checkpoint=False):
        stored = getattr(_last, "numel", None)
        if from_checkpoint and stored is not None:
            try:  # (on a copy: building may change the settings, e.g. --encoder-layers-to-keep)
                with torch.device("meta"):
                    described = _count(build_model(copy.deepcopy(cfg), task, from_checkpoint))
            except Exception:  # a model that cannot be built without memory: fairseq's own build decides
                described = None
            if described is not None and described > stored + stored // 4 + SLACK:
                raise UntrustedCheckpointError(
                    _last.file, f"its settings describe a model of {described:,} weights and buffers, far more than "
                    f"the {stored:,} it stores; fairseq would allocate them all before comparing", trust_helps=False)
        return build_model(cfg, task, from_checkpoint)

    guarded._fairseq_localness_guarded = True
    return guarded
