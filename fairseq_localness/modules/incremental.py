"""Incremental decoding: the state a module keeps between decoder steps.

fairseq's sequence generator hands every decoder module one ``incremental_state``
dict for the whole search; a module decorated with fairseq's
``with_incremental_state`` keeps its own dict of tensors in it (:class:`IncrementalBuffer`)
and reorders them along the batch when beam search reorders its hypotheses. The
attention core keeps its projected keys and values there (:func:`append_to_cache`), as
fairseq's ``MultiheadAttention`` does, so a step projects only its new tokens; the
Dual Contextual module's Local Context Unit keeps its last ``f - 1`` inputs.
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor


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
        Local Context Unit's window ``B x C x (f-1)``) for beam search."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            for key, value in buffer.items():
                if value is not None:
                    buffer[key] = value.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state


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
            if prev_kpm is not None or key_padding_mask is not None:
                prev_kpm = (
                    prev_kpm
                    if prev_kpm is not None
                    else prev_key.new_zeros(bsz, prev_key.size(2), dtype=torch.bool)
                )
                new_kpm = (
                    key_padding_mask.bool()
                    if key_padding_mask is not None
                    else prev_key.new_zeros(bsz, k.size(2), dtype=torch.bool)
                )
                key_padding_mask = torch.cat([prev_kpm.bool(), new_kpm], dim=1)
            k = torch.cat([prev_key, k], dim=2)
            v = torch.cat([prev_value, v], dim=2)
    saved["prev_key"], saved["prev_value"] = k, v
    saved["prev_key_padding_mask"] = key_padding_mask
    return k, v, key_padding_mask
