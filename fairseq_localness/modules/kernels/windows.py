"""Several windows of one call as one product: HySAN's branches (Song et al. 2019,
eq. 9-11) and the hybrid's global and local branches (Xu et al. 2019, eq. 1-3), where
every branch is a hard window over the same energies.

Shape notation as in :mod:`~fairseq_localness.modules.attention`, L = windows. The
energies ``q k^T`` (eq. 6) are computed once; each window gets its own copy of them
with the keys outside it at ``-inf`` (an ``L x Tq x Tk`` bias of 0 and ``-inf``, from
tables cached per window, added to the energies in the operation that also scales
them); one float32 softmax and one product serve all windows, and the outputs come
stacked (``B x H x L x Tq x Dh``) for a fusion that takes them whole
(:class:`~fairseq_localness.modules.fusion.BranchOutputs`).
:mod:`.choice` says where this pays: an incremental step (one query row), and on a CPU
a full pass without gradients over few keys (beam search's encoder pass, validation),
where a kernel call per branch costs more than its arithmetic.
"""
from typing import Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fairseq_localness.modules.context import distance_table, softmax_last
from fairseq_localness.modules.kernels.step import fused_step, heads_bmm, row_attention
from fairseq_localness.modules.scores import Window

_Bounds = Tuple[Tuple[Optional[int], Optional[int]], ...]

# (windows' bounds, device, dtype) -> 8 x L x (N + 8): plane s holds, at column c, 0
# where window b keeps a key at distance c - (N - 1 + s) from the query and -inf where
# it blocks it (see _last_row_bias)
_LAST_ROWS: Dict[Tuple[_Bounds, torch.device, torch.dtype], Tensor] = {}
_LAST_ROWS_MIN = 64
# the alignment, in elements, of the rows that _last_row_bias gives with aligned=True:
# the fused kernel's bias must start at a multiple of 16 bytes, its rows too (SDPA's
# memory-efficient kernel on CUDA refuses another bias)
_ALIGNMENT = 8


def _bounds(windows: Sequence[Window]) -> _Bounds:
    return tuple((window.left, window.right) for window in windows)


def _bias(window: Window, distance: Tensor) -> Tensor:
    """0 where ``window`` keeps a key at ``distance`` (``j - i``), ``-inf`` where it
    blocks it (float32, the shape of ``distance``)."""
    bias = torch.zeros(distance.shape, device=distance.device)
    blocked = window.blocked(distance)
    return bias if blocked is None else bias.masked_fill_(blocked, float("-inf"))


def _last_row_bias(windows: Sequence[Window], src_len: int, device, dtype=torch.float32,
                   aligned: bool = False) -> Tensor:
    """``L x 1 x Tk``: each window's row for the query at the last key; a view of a
    table cached per windows, device and dtype and grown by doubling (one row per
    window, whatever the length: what an incremental step needs). ``aligned``: a
    view that starts at a multiple of :data:`_ALIGNMENT` elements, with rows as far
    apart (the table holds the rows once per shift of their start, at distances
    shifted by 0 to 7)."""
    key = (_bounds(windows), torch.device(device), dtype)
    table = _LAST_ROWS.get(key)
    if table is None or table.size(2) - _ALIGNMENT < src_len:
        size = max(src_len, _LAST_ROWS_MIN, 2 * (table.size(2) - _ALIGNMENT) if table is not None else 0)
        size = -(-size // _ALIGNMENT) * _ALIGNMENT
        # built outside inference mode, so that a table made during generation can be
        # used by a later pass with gradients
        with torch.inference_mode(False), torch.no_grad():
            shifts = torch.arange(_ALIGNMENT, device=device)[:, None]
            distance = torch.arange(size + _ALIGNMENT, device=device) - (size - 1 + shifts)  # 8 x (N + 8)
            table = torch.stack([_bias(window, distance) for window in windows], dim=1).to(dtype)
        _LAST_ROWS[key] = table
    size = table.size(2) - _ALIGNMENT
    shift = (src_len - size) % _ALIGNMENT if aligned else 0  # the plane whose row starts aligned
    start = size + shift - src_len  # distance 1 - Tk, the first key's
    return table[shift, :, None, start : start + src_len]


def window_bias(windows: Sequence[Window], tgt_len: int, src_len: int, device) -> Tensor:
    """``L x Tq x Tk``: 0 where window b keeps key j for query i, ``-inf`` where it
    blocks it, queries bottom-right aligned (query i at key ``Tk - Tq + i``, index
    distances as :func:`~fairseq_localness.modules.context.distance_table` explains).
    One query row is a view of a cached table; several are stacked from each window's
    cached ``Tq x Tk`` table."""
    if tgt_len == 1:
        return _last_row_bias(windows, src_len, device)
    planes = [
        distance_table(("window-bias", window.left, window.right), lambda d, w=window: _bias(w, d),
                       tgt_len, src_len, device)
        for window in windows
    ]
    return torch.stack(planes)


def windows_attention(
    q: Tensor, k: Tensor, v: Tensor, scale: float, key_padding_mask: Optional[Tensor], windows: Sequence[Window]
) -> Tensor:
    """The attention of ``q`` (``B x H x Tq x Dh``, unscaled) over ``k``, ``v`` (``B x H x
    Tk x Dh``) for each window (``-left <= j - i <= right``), without the padding keys
    (``key_padding_mask`` ``B x Tk``, True at padding, or None): the energies once,
    one float32 softmax over the ``B x H x L x Tq x Tk`` rows and one product. Returns
    ``B x H x L x Tq x Dh`` in ``v``'s dtype; a row that its window and the padding
    leave without keys gives 0 in the forward pass (its gradients would be NaN: the
    callers take it without gradients, or for one query row, which always has its own
    key unless it is padding). One query row on a device of
    :data:`~.step.FUSED_STEP_DEVICES` (CUDA) is one fused call instead
    (:func:`~.step.row_attention`): a query row per window, the windows' cached rows
    its bias."""
    bsz, heads, tgt_len, _ = q.shape
    src_len = k.size(2)
    if tgt_len == 1 and fused_step(q):
        # one row per window, the windows' rows as the bias of one fused call
        # 1 x 1 x L x Tk, every stride a multiple of the table's rows (an index's new
        # dimensions get the strides of what follows them; a view's may not, at L = 1)
        bias = _last_row_bias(windows, src_len, q.device, q.dtype, aligned=True)[:, 0][None, None]
        # the row copied once per window (no stride-0 dimension: not every kernel takes one)
        rows = q.expand(bsz, heads, len(windows), q.size(3)).contiguous()
        out = row_attention(rows, k, v, scale, key_padding_mask, bias, all(_keeps_own_key(w) for w in windows))
        if out is not None:  # (None: SDPA refused it, the product below computes it)
            return out.unsqueeze(3)  # B x H x L x 1 x Dh
    energies = heads_bmm(q, k.transpose(-1, -2)).unsqueeze(2)  # B x H x 1 x Tq x Tk, unscaled
    # the windows and the scaling in one operation: bias + scale * energies (at least float32)
    rows = torch.add(window_bias(windows, tgt_len, src_len, q.device), energies, alpha=scale)
    if key_padding_mask is not None:
        rows.masked_fill_(key_padding_mask[:, None, None, None, :], float("-inf"))
    probs = softmax_last(rows)
    if key_padding_mask is not None or not all(_keeps_own_key(window) for window in windows):
        probs = probs.nan_to_num(0.0)
    out = heads_bmm(probs.view(bsz, heads, -1, src_len).to(v.dtype), v)
    return out.view(bsz, heads, len(windows), tgt_len, v.size(3))


def _keeps_own_key(window: Window) -> bool:
    """Whether the window keeps the key at distance 0 (so no row of it is empty
    without padding)."""
    return (window.left is None or window.left >= 0) and (window.right is None or window.right >= 0)
