"""Attention restricted to a hard window of keys, in ``O(Tq x W)`` time and memory.

Shape notation as in :mod:`~fairseq_localness.modules.attention`; W = ``left + right + 1``,
the window size.

A branch that keeps only the keys with ``-left <= j - i <= right`` (Xu et al. 2019,
eq. 3, the local pattern ``|i - j| <= m``; Song et al. 2019, eq. 11, ``M_e`` and
``M_d``) needs the energies of W keys per query, not of all Tk. The reference path
computes every ``q_i k_j`` and masks all but W of them (``B x H x Tq x Tk`` energies,
distributions and masks, saved for the backward pass); :func:`banded_attention` takes
the W keys of each query as W shifted slices of the key and value tensors (views:
the backward pass keeps no copy of them) and computes

    e_io = q_i k_{i' - left + o} / sqrt(Dh),  o = 0 .. W - 1
    P_i  = softmax(e_i masked)          (over the W slots; float32)
    z_i  = sum_o P_io v_{i' - left + o}

with ``i' = Tk - Tq + i`` (bottom-right aligned queries, as in the core). Slots outside
``0 .. Tk - 1`` and padding keys are masked; a row whose slots are all masked gets an
all-zero distribution and output, as in the reference path. The backward pass keeps
the ``B x H x Tq x W`` distribution besides ``q``, ``k`` and ``v``, nothing of size
``Tq x Tk``.

Index distances are real-position distances for every row that is used (see
:func:`~fairseq_localness.modules.context.distance_table`), so the band is taken
over indices.
"""
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor


def band_slots_blocked(
    key_padding_mask: Optional[Tensor], tgt_len: int, src_len: int, left: int, right: int, device
) -> Tensor:
    """``B' x 1 x Tq x W`` boolean, True at the window slots that are blocked: outside
    the keys, or padding. Slot o of query i is key ``Tk - Tq + i - left + o``."""
    width = left + right + 1
    first = src_len - tgt_len - left  # key index of slot 0 of query 0
    idx = torch.arange(tgt_len, device=device).unsqueeze(1) + torch.arange(width, device=device) + first
    blocked = (idx < 0) | (idx >= src_len)  # Tq x W
    if key_padding_mask is None:
        return blocked[None, None]
    padded = F.pad(key_padding_mask, (max(0, -first), max(0, first + tgt_len + width - 1 - src_len)), value=True)
    start = max(0, first)
    padded = padded[:, start : start + tgt_len + width - 1]
    return (blocked[None] | padded.unfold(1, width, 1))[:, None]  # B x 1 x Tq x W


def _rows_read(tgt_len: int, src_len: int, left: int, offset: int) -> Tuple[int, int, int]:
    """For window slot ``offset``: the query rows ``a .. b - 1`` whose slot is a key
    (index ``Tk - Tq - left + i + offset`` in ``0 .. Tk - 1``) and the key index of row a."""
    first = src_len - tgt_len - left + offset  # key index of query 0's slot
    a, b = max(0, -first), min(tgt_len, src_len - first)
    return a, max(a, b), first + a


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    left: int,
    right: int,
    key_padding_mask: Optional[Tensor] = None,
    dropout: Optional[Callable[[Tensor], Tensor]] = None,
    bias: Optional[Tensor] = None,
) -> Tensor:
    """Attention over the keys ``-left <= j - i' <= right`` of each query (see the
    module docstring): ``q`` ``B x H x Tq x Dh`` (unscaled), ``k``, ``v`` ``B x H x Tk x
    Dh``, ``key_padding_mask`` ``B x Tk`` (True at padding) or None, ``dropout`` applied
    to the distribution, ``bias`` an optional additive ``B' x H' x Tq x W`` term on the
    energies (float32). Returns ``B x H x Tq x Dh`` in ``v``'s dtype."""
    if left < 0 or right < 0:
        raise ValueError(f"band extents must be >= 0 (got left={left}, right={right})")
    tgt_len, src_len, width = q.size(2), k.size(2), left + right + 1
    # slot o of query i is key i' - left + o: the rows whose slot is a key read a
    # slice of k and v (views: the backward pass keeps no copy of them); the other
    # rows get a zero energy, masked below
    spans = [_rows_read(tgt_len, src_len, left, o) for o in range(width)]
    scores = torch.stack(
        [F.pad((q[:, :, a:b] * k[:, :, j : j + b - a]).sum(-1), (a, tgt_len - b)) for a, b, j in spans], dim=-1
    )  # B x H x Tq x W
    scores = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    scores = scores * scale
    if bias is not None:
        scores = scores + bias
    blocked = band_slots_blocked(key_padding_mask, tgt_len, src_len, left, right, q.device)
    row_empty = blocked.all(dim=-1, keepdim=True)
    if row_empty.device.type != "cpu" or bool(row_empty.any()):
        blocked = blocked & ~row_empty
    else:
        row_empty = None
    probs = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    if dropout is not None:
        probs = dropout(probs)
    probs = probs.to(v.dtype)
    out = None  # slot ``left`` (the query's own key) is a key in every row: out is set
    for o, (a, b, j) in enumerate(spans):
        if b > a:
            term = F.pad(probs[:, :, a:b, o : o + 1] * v[:, :, j : j + b - a], (0, 0, a, tgt_len - b))
            out = term if out is None else out + term
    if row_empty is not None:
        out = out.masked_fill(row_empty, 0.0)
    return out
