"""Fusions: how the outputs of an attention's branches become one sublayer output (the
fusion tier of the README's "Architecture").

Shape notation as in :mod:`.attention`: B = batch size, H = heads, Tq = query length,
C = model dimension, Dh = C / H, L = number of branches.

An :class:`~.attention.AttentionCore` computes one output ``P_b V`` per branch
(``B x H x Tq x Dh`` each) and hands the list to its fusion, which returns
``Tq x B x C'``; the core's output projection maps ``C'`` back to ``C``, so a fusion
declares ``C'`` with :meth:`Fusion.output_dim` (the projection is built from it).

The generic fusions live here; fusions that belong to one paper live with that
paper's module (:class:`~.hybrid.GateFusion`, Xu et al. 2019, eq. 4-5;
:class:`~.hysan.GatedSumFusion`, Song et al. 2019, eq. 13-14):

=======================  ========  =================================================
fusion                   ``C'``    output
=======================  ========  =================================================
:class:`MergeHeads`      C         the one branch's heads, concatenated (L = 1)
:class:`SumFusion`       C         ``sum_b x_b`` (Song et al. 2019, eq. 13, "sum")
:class:`ConcatFusion`    L*C       ``[x_1; ...; x_L]`` (Song et al. 2019, eq. 13,
                                   "Concat"; Xu et al. 2019, Table 1, "HYBRID
                                   (Concate)")
=======================  ========  =================================================

where ``x_b`` is branch b's output with its heads merged (``Tq x B x C``).
"""
from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq_localness.modules.context import AttentionContext
from fairseq_localness.modules.observe import Observable


def merge_heads(x: Tensor) -> Tensor:
    """``B x H x T x Dh`` -> ``T x B x (H*Dh)``."""
    bsz, heads, tlen, dh = x.shape
    return x.permute(2, 0, 1, 3).reshape(tlen, bsz, heads * dh)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``T x B x (H*Dh)`` -> ``B x H x T x Dh``, the inverse of :func:`merge_heads` (a
    view of ``x``)."""
    tlen, bsz, dim = x.shape
    return x.reshape(tlen, bsz, num_heads, dim // num_heads).permute(1, 2, 0, 3)


def merge_branches(x: Tensor) -> Tensor:
    """``B x H x L x T x Dh`` (L branches, :class:`BranchOutputs`) -> ``T x (L*B) x
    (H*Dh)``: each branch's heads merged, branch b's batch at rows ``b*B .. b*B+B-1``."""
    bsz, heads, count, tlen, dh = x.shape
    return x.permute(3, 2, 0, 1, 4).reshape(tlen, count * bsz, heads * dh)


def split_branches(x: Tensor, num_heads: int, count: int) -> Tensor:
    """The inverse of :func:`merge_branches`: ``T x (L*B) x C`` -> ``B x H x L x T x Dh``
    (a view of ``x``)."""
    tlen, rows, dim = x.shape
    return x.reshape(tlen, count, rows // count, num_heads, dim // num_heads).permute(2, 3, 1, 0, 4)


class BranchOutputs(list):
    """The outputs of L branches computed by one fused call: the list of their ``B x H x
    Tq x Dh`` views (what every fusion takes) and, as :attr:`stacked`, the ``B x H x L
    x Tq x Dh`` tensor they are views of, which a fusion may use whole (e.g. one
    squeeze gate over all branches, :class:`~.hysan.GatedSumFusion`)."""

    def __init__(self, stacked: Tensor):
        super().__init__(stacked.unbind(2))
        self.stacked = stacked


class FusedOutput:
    """What one fused call returns where the fusion ran inside it (its
    :meth:`Fusion.epilogue`): the fusion's output ``fused`` (``Tq x B x C'``) and its
    statistics ``stats`` (what it logs, computed in the same call), or None."""

    __slots__ = ("fused", "stats")

    def __init__(self, fused: Tensor, stats: Optional[Tensor]):
        self.fused, self.stats = fused, stats


class EagerOutputs(list):
    """The outputs of L branches computed one by one on the eager path (``B x H x Tq x
    Dh`` each), products that nothing keeps for the backward pass (a matmul keeps its
    inputs): a fusion that needs them there may keep a form of its own instead, at no
    cost in the memory kept for that pass (:class:`~.hysan.GatedSumFusion` keeps their
    merged heads). The fast path's outputs come as a plain list or as
    :class:`BranchOutputs`, and are kept as they are (SDPA's flash and
    memory-efficient kernels keep their outputs for their own backward pass)."""


class Fusion(nn.Module, Observable):
    """The interface of a fusion.

    Subclasses implement :meth:`forward` and, when their output is not ``C`` wide,
    :meth:`output_dim`. They are :class:`~.observe.Observable`: a fusion with
    statistics of its own (a gate) logs and records them like a branch does.
    """

    def output_dim(self, embed_dim: int) -> int:
        """``C'``, the width of :meth:`forward`'s output for a model dimension ``C``."""
        return embed_dim

    def forward(self, outputs: List[Tensor], ctx: AttentionContext) -> Tensor:
        """``outputs``: one ``B x H x Tq x Dh`` tensor per branch, in the core's branch
        order; returns ``Tq x B x C'``."""
        raise NotImplementedError

    def takes_stacked(self, device: torch.device) -> bool:
        """Whether :meth:`forward` computes its output from all branches' outputs stacked
        (:class:`BranchOutputs`' ``stacked``) on ``device``, so that a kernel that
        computes the branches one by one should hand them over stacked
        (:func:`~.kernels.dense.dense_windows`); False (the default): one tensor per
        branch is as good."""
        return False

    def epilogue(self, ctx: AttentionContext) -> Optional[Tuple[Callable, tuple, tuple]]:
        """The fusion as a pure function that a fused call of all branches may compute
        within itself, compiled with it (:func:`~.kernels.flex.flex_windows`):
        ``(function, tensors, flags)``, where ``function(stacked, *tensors, *flags)``
        takes the branches' stacked outputs (``B x H x L x Tq x Dh``) and returns
        ``(fused, stats)`` (:class:`FusedOutput`; ``flags`` are Python constants of the
        call); None (the default): the fusion runs on the call's outputs after it."""
        return None

    def project(self, outputs: List[Tensor], ctx: AttentionContext, out_proj: nn.Linear) -> Tensor:
        """The fusion followed by the core's output projection (``C' -> C``). A fusion
        may override it to compute the two together (:class:`ConcatFusion` does, to
        keep its L-times-wider input out of the backward pass's memory)."""
        return out_proj(self(outputs, ctx))


class MergeHeads(Fusion):
    """The fusion of a one-branch attention: merges the heads, nothing else."""

    def forward(self, outputs: List[Tensor], ctx: AttentionContext) -> Tensor:
        assert len(outputs) == 1, f"MergeHeads fuses one branch (got {len(outputs)})"
        return merge_heads(outputs[0])


class SumFusion(Fusion):
    """Sum of the branch outputs (Song et al. 2019, eq. 13, "sum")."""

    def forward(self, outputs: List[Tensor], ctx: AttentionContext) -> Tensor:
        # a running sum: nothing of shape L x B x H x Tq x Dh is materialised
        total = outputs[0]
        for out in outputs[1:]:
            total = total + out
        return merge_heads(total)


class ConcatFusion(Fusion):
    """``[x_1; ...; x_L]`` (``Tq x B x L*C``), for any number L of branches.

    The core's output projection, built as ``Linear(L*C, C)`` from :meth:`output_dim`,
    projects it back to C: it is the ``H`` of Song et al. (2019), eq. 13 ("Concat"),
    and for L = 2 (``[global; local]``) the projection of Xu et al. (2019), Table 1,
    "HYBRID (Concate)". The fusion itself has no parameters.
    """

    def __init__(self, num_branches: int):
        super().__init__()
        if num_branches < 1:
            raise ValueError(f"a concatenation needs at least one branch (got {num_branches})")
        self.num_branches = num_branches

    def output_dim(self, embed_dim: int) -> int:
        return self.num_branches * embed_dim

    def extra_repr(self) -> str:
        return f"num_branches={self.num_branches}"

    def forward(self, outputs: List[Tensor], ctx: AttentionContext) -> Tensor:
        assert len(outputs) == self.num_branches
        return torch.cat([merge_heads(x) for x in outputs], dim=-1)  # Tq x B x L*C

    def project(self, outputs: List[Tensor], ctx: AttentionContext, out_proj: nn.Linear) -> Tensor:
        assert len(outputs) == self.num_branches
        if not torch.is_grad_enabled():  # nothing to keep (validation, beam search)
            return super().project(outputs, ctx, out_proj)
        return _ConcatProjection.apply(out_proj.weight, out_proj.bias, *outputs)


class _ConcatProjection(torch.autograd.Function):
    """``[x_1; ...; x_L] W^T + b`` with ``x_b = merge_heads(out_b)``: what
    :class:`ConcatFusion` followed by the output projection computes, keeping the
    branch outputs ``out_b`` for the backward pass (the attention's fused kernel keeps
    them anyway) instead of their ``Tq x B x L*C`` concatenation, which the backward
    pass rebuilds for ``W``'s gradient. Under autocast the backward pass computes in
    the dtype of the branch outputs; gradients come back in each input's dtype."""

    @staticmethod
    def forward(ctx, weight, bias, *outputs):
        concat = torch.cat([merge_heads(x) for x in outputs], dim=-1)
        ctx.save_for_backward(weight, *outputs)
        ctx.has_bias = bias is not None
        return F.linear(concat, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        weight, *outputs = ctx.saved_tensors
        dtype = outputs[0].dtype
        grad = grad.to(dtype)
        flat = grad.reshape(-1, grad.size(-1))  # (Tq * B) x C
        concat = torch.cat([merge_heads(x) for x in outputs], dim=-1)
        grad_weight = flat.t().matmul(concat.reshape(-1, concat.size(-1))).to(weight.dtype)
        grad_bias = flat.sum(0).to(weight.dtype) if ctx.has_bias else None
        grad_concat = grad.matmul(weight.to(dtype))  # Tq x B x L*C
        heads, width = outputs[0].size(1), outputs[0].size(1) * outputs[0].size(3)
        grads = [split_heads(g, heads) for g in grad_concat.split(width, dim=-1)]
        return (grad_weight, grad_bias, *grads)
