"""One query row: an incremental decoding step, the query at the last key position,
or a one-token pass.

Shape notation as in :mod:`~fairseq_localness.modules.attention`. Over the keys
``j >= Tk - 1 - left`` (all for ``left`` None): the energies of the last ``left + 1``
keys, a float32 softmax and one product, as fairseq's own attention computes a step.
(The fused kernels' per-call cost exceeds the arithmetic of one row.) A row without
keys gives 0. Shaw et al.'s terms have their own step,
:meth:`~fairseq_localness.modules.relative_position.RelativePositions.step_attention`.

Several windows of one row (HySAN's decoder branches, Song et al. 2019, eq. 11; the
hybrid's global and local branches, Xu et al. 2019, eq. 1-3) share the row's energies:
:func:`~.windows.windows_attention` computes them once for all windows.

On CUDA (:data:`FUSED_STEP_DEVICES`) each of these steps states its mask or bias as
data and makes one call of SDPA's fused kernel (:func:`row_attention`): the keys'
padding as a float mask of 0 and ``-inf``, the windows' rows of 0 and ``-inf`` (one
query row per window), Shaw et al.'s key term as a float bias with the value term
added to the values. A beam-search step's attention there is one call instead of the
products, scaling, casts and softmax of the CPU's kernels (one decoder self-attention
sublayer's step in bfloat16, counted on the CPU on CUDA's paths, :mod:`.choice`'s
footnote [8]: the Dual Contextual module's 17 operators to 11, HySAN's 16 to 12, Shaw
et al.'s 16 to 9; fairseq's own attention makes 12). Not yet measured on a GPU. The
CPU keeps the kernels measured there.
"""
import logging
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_localness.modules.context import one_row_softmax
from fairseq_localness.modules.kernels.sdpa import padding_bias

# Devices where one query row goes to one call of SDPA's fused kernel with its mask or
# bias as data (:func:`row_attention`); the CPU joins them only within
# :func:`~.emulation.cuda_paths_on_cpu` (tests).
FUSED_STEP_DEVICES = ("cuda",)

logger = logging.getLogger(__name__)

# The device types where SDPA refused a fused step (:func:`row_attention`): their steps
# take the step kernels from then on.
_REFUSED = set()


def fused_step(q: Tensor) -> bool:
    """Whether a step of the query rows ``q`` takes :func:`row_attention`."""
    return q.device.type in FUSED_STEP_DEVICES and q.device.type not in _REFUSED


def row_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor],
                  bias: Optional[Tensor] = None, rows_keep_a_key: bool = True) -> Optional[Tensor]:
    """``softmax(q k^T * scale + bias) v`` without the padding keys, as one call of
    ``scaled_dot_product_attention``: ``q`` ``B x H x R x Dh`` (R query rows: one, or one
    per window), ``k``, ``v`` ``B x H x Tk x Dh``, ``bias`` broadcastable to ``B x H x R x
    Tk`` in ``q``'s dtype (0 and ``-inf`` for windows, Shaw et al.'s key term) or None,
    ``key_padding_mask`` ``B x Tk`` (True at padding) or None, which joins the bias as
    :func:`~.sdpa.padding_bias` (made once per padding mask, for all layers). A row left
    without keys gives 0 (``rows_keep_a_key`` False where a row may have none without
    padding). Returns ``B x H x R x Dh`` in ``q``'s dtype.

    SDPA's kernels on CUDA refuse a bias that does not start at a multiple of 16 bytes
    (the memory-efficient kernel) and copy one whose strides are not multiples of 8
    elements: the callers' biases are laid out so (``tests/test_fused_steps.py``;
    Shaw et al.'s step adds the padding to its key terms over their whole padded rows
    itself); the windows' rows with padding added are a new tensor, which SDPA may copy
    once more (a padded target in beam search).

    Where SDPA refuses the call (a ``RuntimeError`` other than the GPU's memory running
    out: a kernel that does not take these inputs on some GPU or torch), None, with a
    warning, and the device's steps take the step kernels from then on (the caller
    computes this step with them): a beam search does not stop for it."""
    mask = bias
    if key_padding_mask is not None:
        # a float mask, -inf at padding: SDPA converts a boolean one for cuDNN's kernel
        # with a finite minimum, and a row of padding alone would get a distribution
        padding = padding_bias(key_padding_mask, q.dtype)
        mask = padding if bias is None else bias + padding
    try:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    except torch.cuda.OutOfMemoryError:
        raise
    except RuntimeError as error:
        _REFUSED.add(q.device.type)
        logger.warning("one-row steps: scaled_dot_product_attention refused a step on %s (%s); the steps there "
                       "take the step kernels from now on", q.device.type, str(error).splitlines()[0][:200])
        return None
    return out if key_padding_mask is None and rows_keep_a_key else out.nan_to_num(0.0)


def heads_bmm(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` over the leading ``B x H`` dimensions (``B x H x M x K`` by ``B x H x K
    x N``) as one ``bmm`` of ``(B*H)``-batched views: what ``torch.matmul`` computes,
    in one operator call instead of its seven (an incremental step is a few dozen such
    calls, each costing more than its arithmetic). The caches' ``B x H x T x Dh`` views
    (:func:`~fairseq_localness.modules.incremental.append_steps`) and split heads merge
    their first two dimensions without a copy."""
    bsz, heads = a.shape[:2]
    out = torch.bmm(a.reshape(bsz * heads, a.size(2), a.size(3)), b.reshape(bsz * heads, b.size(2), b.size(3)))
    return out.view(bsz, heads, out.size(1), out.size(2))


def last_keys_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor], left: Optional[int]
) -> Tensor:
    """``q`` ``B x H x 1 x Dh`` (unscaled) over the last ``left + 1`` keys of ``k``, ``v``
    (``B x H x Tk x Dh``; all of them for ``left`` None), ``key_padding_mask``
    ``B x Tk`` (True at padding) or None; returns ``B x H x 1 x Dh`` in ``v``'s dtype."""
    if left is not None and left + 1 < k.size(2):
        k, v = k[:, :, -(left + 1) :], v[:, :, -(left + 1) :]
        key_padding_mask = None if key_padding_mask is None else key_padding_mask[:, -(left + 1) :]
    if fused_step(q):
        out = row_attention(q, k, v, scale, key_padding_mask)
        if out is not None:
            return out
    probs = one_row_softmax(heads_bmm(q, k.transpose(-1, -2)) * scale, key_padding_mask)  # B x H x 1 x W
    return heads_bmm(probs.to(v.dtype), v)
