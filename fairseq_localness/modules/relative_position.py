"""Relative position representations (Shaw, Uszkoreit and Vaswani, 2018).

Shape notation as in :mod:`.attention`; K = clipping distance, R = 2K + 1.

Shaw et al. (2018), eq. 3-4 (with their eq. 2 for the values)::

    e_ij = q_i (k_j + a^K_ij)^T / sqrt(Dh)          a^K_ij = w^K_clip(j - i, K)
    z_i  = sum_j alpha_ij (v_j + a^V_ij)            a^V_ij = w^V_clip(j - i, K)

with ``clip(x, K) = max(-K, min(K, x))`` and 2K + 1 learned vectors per layer for keys
and for values, shared across heads (Shaw et al., section 3.3).

Memory stays linear in the sequence length times the number of distances: nothing of
shape ``Tq x Tk x Dh`` is built. The key term is ``q W^K^T`` (``B x H x Tq x R``)
gathered at each pair's distance; the value term scatters the attention weights into
their R distance buckets (``B x H x Tq x R``) and multiplies by ``W^V``.

Distances are index distances, which equal the real-position distances for every
row that is used (see :func:`~.context.distance_table`), so left padding and
incremental decoding see the same distances as an unpadded full pass; the bucket
indices come from a table cached per clipping distance and device. Shaw et al.'s key
term is computed once per attention call and shared by its branches; an incremental
step computes it for its one query row (``B x H x 1 x R``, then gathered over the
keys), with no tensor over the prefix but the row itself.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_localness.modules.context import AttentionContext, aligned_width, distance_table, one_row_softmax
from fairseq_localness.modules.kernels.sdpa import padding_bias
from fairseq_localness.modules.kernels.step import fused_step, row_attention
from fairseq_localness.modules.scores import BucketScore, Prologue, ValueTerm


class RelativePositions(nn.Module):
    def __init__(self, head_dim: int, max_distance: int = 16, values: bool = True):
        super().__init__()
        if max_distance < 1:
            raise ValueError(f"relative position clipping distance must be >= 1 (got {max_distance})")
        self.max_distance = max_distance
        self.key_embeddings = nn.Parameter(torch.empty(2 * max_distance + 1, head_dim))
        self.value_embeddings = (
            nn.Parameter(torch.empty(2 * max_distance + 1, head_dim)) if values else None
        )
        self.reset_parameters()

    def reset_parameters(self):
        nn.init.xavier_uniform_(self.key_embeddings)
        if self.value_embeddings is not None:
            nn.init.xavier_uniform_(self.value_embeddings)

    def extra_repr(self) -> str:
        return f"max_distance={self.max_distance}, values={self.value_embeddings is not None}"

    def _clipped(self, distance: Tensor) -> Tensor:
        k = self.max_distance
        return distance.clamp(-k, k) + k

    def _buckets(self, tgt_len: int, src_len: int, device) -> Tensor:
        """``clip(j - i, K) + K``, ``Tq x Tk`` long, queries bottom-right aligned: a view
        of a table cached per ``(K, device)`` (index distances, which equal
        real-position distances for every row that is used:
        :func:`~.context.distance_table`)."""
        return distance_table(("shaw_bucket", self.max_distance), self._clipped, tgt_len, src_len, device)

    def bucket(self, ctx: AttentionContext) -> Tensor:
        """The call's buckets (:meth:`_buckets`), ``1 x 1 x Tq x Tk``."""
        return self._buckets(ctx.tgt_len, ctx.src_len, ctx.q.device)[None, None]

    def key_per_distance(self, q_scaled: Tensor) -> Tensor:
        """``q_i w^K_r / sqrt(Dh)`` for every query and bucket r: ``B x H x Tq x R``."""
        return _key_per_distance(q_scaled, self.key_embeddings)

    def describe(self, q: Tensor, scale: float) -> Tuple[BucketScore, Optional[ValueTerm]]:
        """The key term as a score term (``table[b, h, q, clip(d, -K, K) + K]``, its
        table given by a prologue of the unscaled queries ``q``, :func:`key_term`, which
        a fused call may compute within itself) and the value term, as data for the
        fused kernels (:mod:`.scores`)."""
        key = BucketScore(None, self.max_distance, Prologue(key_term, q, (self.key_embeddings,), (scale,)))
        value = None if self.value_embeddings is None else ValueTerm(self.value_embeddings, self.max_distance)
        return key, value

    def key_scores(self, q_scaled: Tensor, ctx: AttentionContext) -> Tensor:
        """``q_i a^K_ij / sqrt(Dh)`` for every pair: ``B x H x Tq x Tk``."""
        per_distance = self.key_per_distance(q_scaled)  # B x H x Tq x R
        index = self.bucket(ctx).expand(ctx.bsz, ctx.num_heads, -1, -1)
        return torch.gather(per_distance, -1, index)

    def value_output(self, probs: Tensor, ctx: AttentionContext) -> Tensor:
        """``sum_j alpha_ij a^V_ij``: ``B x H x Tq x Dh``."""
        if self.value_embeddings is None:
            return probs.new_zeros(())  # broadcasts as 0
        index = self.bucket(ctx).expand(probs.shape)
        per_distance = probs.new_zeros(probs.shape[:-1] + (self.value_embeddings.size(0),))
        per_distance.scatter_add_(-1, index, probs)  # B x H x Tq x R
        return torch.matmul(per_distance, self.value_embeddings.to(probs.dtype))

    def step_attention(self, q: Tensor, k: Tensor, v: Tensor, scale: float,
                       key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """One incremental step of self-attention with these key and value terms (eq.
        3-4): the query is the last position (``i' = Tk - 1``), ``q`` ``B x H x 1 x Dh``
        (unscaled), ``k``, ``v`` ``B x H x Tk x Dh``. Returns ``B x H x 1 x Dh``; a row
        without keys gives 0.

        Per row, as Shaw et al.'s section 3.3 computes the terms: the key term of each
        of the R buckets, ``q w^K_r / sqrt(Dh)`` (one product, ``B*H x R``), picked for
        each key by its bucket ``clip(j - i', K) + K`` (one ``index_select``, the row
        of the cached bucket table) and added to ``q k^T / sqrt(Dh)`` in the same
        product (``baddbmm``); the value term sums each bucket's probabilities
        (``index_add_``) and multiplies the R sums by ``W^V`` (``B*H x R`` by ``R x
        Dh``), added to ``alpha v`` in its product. The heads' ``B*H`` rows are views
        of the caches (:func:`~.kernels.step.heads_bmm`): no tensor over the prefix
        but the row's own, and no call whose count grows with Tk.

        On a device of :data:`~.kernels.step.FUSED_STEP_DEVICES` (CUDA) the step is one
        fused call instead (:meth:`_fused_step`)."""
        if fused_step(q):
            out = self._fused_step(q, k, v, scale, key_padding_mask)
            if out is not None:  # (None: SDPA refused it, the step below computes it)
                return out
        bsz, heads, _, head_dim = q.shape
        src_len = k.size(2)
        rows = bsz * heads
        buckets = self._buckets(1, src_len, q.device)[0]
        q_rows = (q * scale).reshape(rows, 1, head_dim)
        per_bucket = torch.mm(q_rows.view(rows, head_dim), self.key_embeddings.to(q.dtype).t())  # B*H x R
        key_terms = per_bucket.index_select(1, buckets).unsqueeze(1)  # B*H x 1 x Tk
        scores = torch.baddbmm(key_terms, q_rows, k.reshape(rows, src_len, head_dim).transpose(1, 2))
        probs = one_row_softmax(scores.view(bsz, heads, 1, src_len), key_padding_mask).reshape(rows, 1, src_len)
        values = v.reshape(rows, src_len, head_dim)
        if self.value_embeddings is None:
            return torch.bmm(probs.to(v.dtype), values).view(bsz, heads, 1, head_dim)
        summed = probs.new_zeros(rows, self.value_embeddings.size(0)).index_add_(1, buckets, probs.view(rows, src_len))
        value_term = torch.mm(summed, self.value_embeddings.to(probs.dtype)).to(v.dtype)  # B*H x Dh
        out = torch.baddbmm(value_term.unsqueeze(1), probs.to(v.dtype), values)
        return out.view(bsz, heads, 1, head_dim)

    def _fused_step(self, q: Tensor, k: Tensor, v: Tensor, scale: float,
                    key_padding_mask: Optional[Tensor]) -> Optional[Tensor]:
        """:meth:`step_attention` as one call of SDPA's fused kernel
        (:func:`~.kernels.step.row_attention`): the key term of each key, ``q w^K_r /
        sqrt(Dh)`` picked by its bucket (one product, one ``index_select``), is the
        call's float bias; the value term enters through the values, ``alpha_ij (v_j +
        a^V_ij)`` (eq. 3: each key's ``a^V`` picked by its bucket, one ``index_select``,
        and added to the cached values, one ``add``). The sum ``v_j + a^V_ij`` is
        rounded to the values' dtype, where the CPU's step adds ``alpha a^V`` and
        ``alpha v`` in float32: the same within half precision's rounding."""
        bsz, heads, _, head_dim = q.shape
        src_len = k.size(2)
        # the row i' = Tk - 1 of the bucket table, over Tk keys and on to a multiple of 8
        # columns: rows of the key terms that far apart (SDPA's memory-efficient kernel
        # wants a bias whose rows start at multiples of 16 bytes; it would copy another)
        width = aligned_width(src_len)
        buckets = self._buckets(width - src_len + 1, width, q.device)[0]
        q = q * scale
        per_bucket = torch.mm(q.reshape(bsz * heads, head_dim), self.key_embeddings.to(q.dtype).t())  # B*H x R
        key_terms = per_bucket.index_select(1, buckets).view(bsz, heads, 1, width)
        if key_padding_mask is not None:  # added over the whole rows, so that the sum's rows stay aligned
            key_terms = key_terms + padding_bias(key_padding_mask, q.dtype, padded=True)
        if self.value_embeddings is not None:
            v = v + self.value_embeddings.to(v.dtype).index_select(0, buckets[:src_len])  # B x H x Tk x Dh
        return row_attention(q, k, v, 1.0, None, key_terms[..., :src_len], key_padding_mask is None)


def _key_per_distance(q_scaled: Tensor, key_embeddings: Tensor) -> Tensor:
    """``q_i w^K_r / sqrt(Dh)`` for every query and bucket r: ``B x H x Tq x R``."""
    return torch.matmul(q_scaled, key_embeddings.to(q_scaled.dtype).t())


def key_term(q: Tensor, key_embeddings: Tensor, scale: float):
    """The prologue of Shaw et al.'s key term (:class:`~.scores.Prologue`): ``((table,),
    None)``, the table ``q_i w^K_r * scale`` (eq. 4, ``scale = 1 / sqrt(Dh)``) of the
    unscaled queries ``q``."""
    return (_key_per_distance(q * scale, key_embeddings),), None
