"""Incremental decoding: the state a module keeps between decoder steps.

fairseq's sequence generator hands every decoder module one ``incremental_state``
dict for the whole search; a module decorated with fairseq's
``with_incremental_state`` keeps its own dict of tensors in it (:class:`IncrementalBuffer`)
and reorders them along the batch when beam search reorders its hypotheses. The
attention core keeps its projected keys and values there (:func:`append_to_cache`), as
fairseq's ``MultiheadAttention`` does, so a step projects only its new tokens; the
Dual Contextual module's Local Context Unit keeps its last ``f - 1`` inputs.

Self-attention keys and values grow by one step per decoder step. fairseq's
``MultiheadAttention`` appends them with ``torch.cat``, which copies the whole cache at
every step, and beam search's reorder copies it again. Here they are written into
spare room of a store that has the steps as its first dimension (``cap x B x H x Dh``,
:func:`append_steps`), and the cache is a ``B x H x T x Dh`` view of its first T steps,
so a step writes only its own keys; the reorder copies the T cached steps once, into
a store of the same room (:meth:`IncrementalBuffer.reorder_incremental_state`). A
Dual Contextual decoder layer keeps two such caches (its two FI units), where the
copies of ``torch.cat`` and the reorder took 58% of its self-attention sublayer's
time at 256 steps (docs/benchmark_appendix.md, "Dec-DC's beam search at long
sentences").
"""
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_localness.modules.fusion import merge_heads, split_heads
from fairseq_localness.modules.kernels.step import last_keys_attention


class IncrementalBuffer:
    """One dict of tensors in fairseq's ``incremental_state``, under ``buffer_name``,
    for a module decorated with ``with_incremental_state`` (which provides
    ``get_incremental_state`` and ``set_incremental_state``)."""

    buffer_name: str

    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, self.buffer_name)
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, self.buffer_name, buffer)

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Reorder every cached tensor (the attention's keys, values and padding, the
        Local Context Unit's window ``B x C x (f-1)``) for beam search: along the batch,
        the first dimension, except for the stores of :func:`append_steps` (batch second),
        whose views are rebuilt from the reordered store."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            for key, value in buffer.items():
                if value is None or key.endswith(_STORE) or key + _STORE in buffer:
                    continue
                buffer[key] = value.index_select(0, new_order)
            for key in [key for key in buffer if key.endswith(_STORE)]:
                name = key[: -len(_STORE)]
                buffer[key], buffer[name] = _reordered(buffer[key], buffer[name].size(2), new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state


# the dtypes whose decoder steps take the one-row kernels and the beam-search step's
# cache (float64 takes the cores' eager reference path)
STEP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# the suffix of a store's key in the buffer: "prev_key" is a view of "prev_key_store"
_STORE = "_store"
# the fewest steps a new store has room for; it doubles when full
MIN_STEPS = 16


def _steps_view(store: Tensor, length: int) -> Tensor:
    """The first ``length`` steps of a ``cap x B x H x Dh`` store as ``B x H x T x Dh``."""
    return store[:length].permute(1, 2, 0, 3)


def _reordered(store: Tensor, length: int, new_order: Tensor) -> Tuple[Tensor, Tensor]:
    """A store with the same room holding the first ``length`` steps of ``store``
    reordered along the batch (``new_order``), and its view of them."""
    reordered = store.new_empty(store.size(0), new_order.numel(), *store.shape[2:])
    torch.index_select(store[:length], 1, new_order, out=reordered[:length])
    return reordered, _steps_view(reordered, length)


def reordered_key_value_rows(store: Tensor, length: int, new_order: Tensor) -> Tensor:
    """A store of keys and values (``cap x 2B x ...``: per step the keys of the B rows,
    then their values) with the same room, holding its first ``length`` steps with
    both halves reordered along the batch (``new_order``, of B' rows: ``cap x 2B' x
    ...``)."""
    rows = torch.cat([new_order, new_order + store.size(1) // 2])  # the keys' rows, then the values'
    return _reordered(store, length, rows)[0]


def search_constants(module: nn.Module, incremental_state, key: str, parameter: Tensor,
                     build: Callable[[], Dict[str, Tensor]]) -> Dict[str, Tensor]:
    """Tensors that ``build`` makes from ``module``'s parameters (stacked weights of a
    step's products), made at a search's first step and kept in its
    ``incremental_state`` under ``key``: a search's parameters do not change, and the
    next search makes them again; so does a step after ``parameter`` moved to another
    dtype or device. ``build`` runs without gradients."""
    made = module.get_incremental_state(incremental_state, key)
    if not made or any(t.dtype != parameter.dtype or t.device != parameter.device for t in made.values()):
        with torch.no_grad():
            made = build()
        module.set_incremental_state(incremental_state, key, made)
    return made


def grown_store(store: Optional[Tensor], steps: Optional[Tensor], total: int, steps_shape, like: Tensor) -> Tensor:
    """A store of ``steps_shape`` per step with room for ``total`` steps (at least
    :data:`MIN_STEPS`, and twice the room of ``store``, the one it replaces), holding
    ``steps`` (``T x steps_shape``, the steps first) as its first steps; ``like``'s dtype
    and device."""
    room = max(total, MIN_STEPS, 2 * store.size(0) if store is not None else 0)
    grown = like.new_empty(room, *steps_shape)
    if steps is not None:
        grown[: steps.size(0)] = steps
    return grown


def joined_padding(prev: Optional[Tensor], new: Optional[Tensor], bsz: int, prev_len: int, new_len: int,
                   like: Tensor) -> Optional[Tensor]:
    """The key padding mask (``B x (T + T')``, bool) of ``prev_len`` cached steps and
    ``new_len`` new ones from their masks ``prev`` and ``new`` (a missing one counts as
    no padding), or None where both are missing; ``like``'s device."""
    if prev is None and new is None:
        return None
    prev = prev.bool() if prev is not None else like.new_zeros(bsz, prev_len, dtype=torch.bool)
    new = new.bool() if new is not None else like.new_zeros(bsz, new_len, dtype=torch.bool)
    return torch.cat([prev, new], dim=1)


def used_padding(key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
    """``key_padding_mask`` as bool, or None where it is None or, on a CPU, blocks no
    key (on an accelerator the test would wait for the device; a mask of zeros blocks
    nothing anyway)."""
    if key_padding_mask is None:
        return None
    key_padding_mask = key_padding_mask.bool()
    return None if key_padding_mask.device.type == "cpu" and not key_padding_mask.any() else key_padding_mask


def append_steps(saved: Dict[str, Optional[Tensor]], name: str, new: Tensor) -> Tensor:
    """The cached steps under ``name`` (``B x H x T x Dh``) followed by ``new``
    (``B x H x T' x Dh``), stored back under ``name``.

    Without gradients the steps are written into the spare room of a store under
    ``name + "_store"`` (``cap x B x H x Dh``, the steps first; room for
    :data:`MIN_STEPS` steps at first, doubled when full), and the result is a view of
    its first ``T + T'`` steps: no step is copied again until the store is full. With
    gradients (an incremental pass being trained through) the result is
    ``torch.cat``'s, so that no tensor saved for the backward pass is written into.
    """
    prev = saved.get(name)
    store = saved.get(name + _STORE)
    if new.requires_grad:
        saved.pop(name + _STORE, None)
        saved[name] = new if prev is None else torch.cat([prev, new], dim=2)
        return saved[name]
    length = 0 if prev is None else prev.size(2)
    total = length + new.size(2)
    steps_shape = (new.size(0), new.size(1), new.size(3))
    in_store = (
        store is not None and store.size(0) >= total and store.shape[1:] == steps_shape
        and store.dtype == new.dtype and (prev is None or prev.data_ptr() == store.data_ptr())
    )
    if not in_store:
        store = grown_store(store, None if prev is None else prev.permute(2, 0, 1, 3), total, steps_shape, new)
    store[length:total] = new.permute(2, 0, 1, 3)
    saved[name + _STORE] = store
    saved[name] = _steps_view(store, total)
    return saved[name]


def append_to_cache(
    saved: Dict[str, Optional[Tensor]],
    k: Optional[Tensor],
    v: Optional[Tensor],
    key_padding_mask: Optional[Tensor],
    static_kv: bool,
    bsz: int,
) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """The keys and values of this step with the cached ones (``B x H x Tk x Dh``) and
    the key padding mask of them all (``B x Tk``, or None), written back into
    ``saved``. ``static_kv`` (encoder-decoder attention): the cached keys are the
    encoder's, projected at the first step, and are used as they are; otherwise the
    new keys are appended to the cached ones, their padding masks too (a missing one
    counts as no padding)."""
    prev_key, prev_value = saved.get("prev_key"), saved.get("prev_value")
    prev_kpm = saved.get("prev_key_padding_mask")
    if prev_key is not None:
        if static_kv:
            k, v = prev_key, prev_value
            key_padding_mask = prev_kpm if key_padding_mask is None else key_padding_mask
        else:
            key_padding_mask = joined_padding(prev_kpm, key_padding_mask, bsz, prev_key.size(2), k.size(2), prev_key)
            k, v = append_steps(saved, "prev_key", k), append_steps(saved, "prev_value", v)
    elif not static_kv:  # the first step of a growing cache
        k, v = append_steps(saved, "prev_key", k), append_steps(saved, "prev_value", v)
    saved["prev_key"], saved["prev_value"] = k, v
    saved["prev_key_padding_mask"] = key_padding_mask
    return k, v, key_padding_mask


def attention_step(core: nn.Module, query: Tensor, key_input: Tensor, key_padding_mask: Optional[Tensor],
                   incremental_state) -> Tensor:
    """One decoder step (``query`` ``1 x B x C``) of a one-branch attention core
    (:class:`~fairseq_localness.modules.attention.AttentionCore`) whose keys and values
    come from ``key_input`` (``1 x B x C``) at the query's position, with its keys and
    values cached in ``incremental_state``; returns ``1 x B x C`` with the heads merged,
    before any output projection.

    The same operations as the core's own forward pass for such a step (its
    projections, :func:`append_to_cache`, the one-row kernel
    :func:`~fairseq_localness.modules.kernels.step.last_keys_attention`), without the
    context, masks and kernel choice that a step of a plain branch does not use; so it
    applies where the core would take that kernel: one global branch, no relative
    positions, no attention dropout drawn, nothing recorded, no ``attn_mask``. The
    Dual Contextual module's decoder steps run its two FI units this way.
    """
    saved = core._get_input_buffer(incremental_state)
    heads = core.num_heads
    q = split_heads(core.q_proj(query), heads)
    k, v = split_heads(core.k_proj(key_input), heads), split_heads(core.v_proj(key_input), heads)
    k, v, key_padding_mask = append_to_cache(saved, k, v, key_padding_mask, False, query.size(1))
    core._set_input_buffer(incremental_state, saved)
    return merge_heads(last_keys_attention(q, k, v, core.scaling, used_padding(key_padding_mask), None))
