"""Hybrid attention: local and global patterns of one set of energies, fused by a gate
(Xu, Wong, Yang, Zhang and Chao, 2019, "Leveraging Local and Global Patterns for
Self-Attention Networks"), and the locality baselines of the paper's Table 1.

Shape notation as in :mod:`.attention`: B = batch size, H = heads, Tq / Tk = query /
key length, C = model dimension, Dh = C / H, G = number of gates per token (1, or H
for the per-head gate).

The paper, per query i (``H`` is the layer input, ``Q, K, V`` its projections)::

    xi_i          = Q_i K^T / sqrt(d)                                     (1)
    global_i      = softmax(xi_i) V                                       (2)
    B(xi_i)_j     = xi_ij if i - m <= j <= i + m, else -inf               (3)
    local_i       = softmax(B(xi_i)) V
    out_i         = (1 - g_i) * global_i + g_i * local_i                  (4)
    g_i           = sigmoid(W H_i)                                        (5)

Both patterns are two branches of one :class:`~.attention.AttentionCore`: the energies
of eq. 1 are computed once (per head, scaled by ``sqrt(Dh)`` as in every multi-head
transformer; the paper writes the single-head ``sqrt(d)``), the global branch is
unmasked (eq. 2) and the local branch is the band ``|i - j| <= m`` in real token
positions (eq. 3, :func:`~.branches.local_branch`). In decoder self-attention the
core adds the causal mask, so the band there is ``i - m <= j <= i``.

Fusions (Table 1 of the paper):

* :class:`GateFusion`: eq. 4-5, one scalar per token (``HYBRID (Gate)``, the default),
  or one scalar per token and head (``per_head=True``, an option the paper does not
  evaluate). ``W`` is a ``Linear(C, G)`` with a bias: ``C + 1`` parameters per layer
  for the per-token gate (docs/hybrid_transformer.md; the paper's eq. 5 writes no bias).
* :class:`~.fusion.ConcatFusion` of the two branches: ``[global_i; local_i]``
  projected back to C (``HYBRID (Concate)``): the core's output projection becomes
  ``Linear(2C, C)``, so the fusion adds ``C^2`` parameters per layer.
* local only (``LOCAL_PATTERN``): the core with the local branch alone.

The gate is applied per head before the core's output projection ``W_o``; for the
per-token gate this is the same as gating after it, because the weights sum to one:
``(1 - g) (W_o a + b) + g (W_o c + b) = W_o ((1 - g) a + g c) + b``.

Baselines of Table 1 (re-implemented by Xu et al. upon the transformer), built from
:class:`~.gaussian.GaussianLocalness` (Yang et al. 2018's Gaussian bias machinery):

* ``neighbor`` (Sperber et al. 2018): Gaussian centred on the query itself, learned
  window (``centre="self"``; the window strategy is an option, by default predicted
  per query as in Yang's eq. 9);
* ``local_h`` (Luong et al. 2015, local-p): predicted centre, fixed window D = 10;
* ``local_s`` (Yang et al. 2018): predicted centre, query-specific window.

Reading of the paper for the baselines: they are used *alone* in the chosen layers,
i.e. the Gaussian bias is added to the energies of the layer's one attention
(``softmax(xi + G) V``), which replaces the plain attention; they are not fused with a
separate global branch. Reasons: the caption of Table 1 says they "apply Gaussian
biases to regularize the conventional attention distribution" (one distribution,
regularized), and the LOCAL_S row (+0.8M, 28.11 BLEU on a 88.0M, 27.67 BLEU baseline)
is exactly Yang et al.'s own "+ Localness" result, a single biased attention. The
Gaussian bias is soft, so these layers still see every key.

Deviations:

* Xu et al. (and Luong's local-p) do not say how the Gaussian baselines' windows are
  bounded away from 0; ``min_window`` floors D as in :mod:`.gaussian`.
* Luong et al.'s local-p also truncates the attention to ``[p - D, p + D]``; like
  Yang et al.'s "fixed" strategy (and Xu's description "Gaussian biases"), LOCAL_H
  here is the soft Gaussian only.
"""
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.branches import global_branch, local_branch
from fairseq_localness.modules.context import AttentionBranch, AttentionContext
from fairseq_localness.modules.fusion import ConcatFusion, Fusion, MergeHeads, merge_heads
from fairseq_localness.modules.gaussian import GaussianWindows
from fairseq_localness.modules.observe import GATE, REAL_TOKENS, TRAIN, VALID, weighted_means

GATE_TYPES = ("token", "head")
NEIGHBOR_WINDOWS = ("query", "layer", "head")


class GateFusion(Fusion):
    """Xu et al. (2019), eq. 4-5: ``(1 - g_i) * global_i + g_i * local_i``,
    ``g_i = sigmoid(W H_i + b)`` with ``H_i`` the layer input (``ctx.query_input``).

    Args:
        embed_dim: C.
        num_heads: H.
        per_head: one gate per head (``W`` is ``C x H``) instead of one per token.

    Expects the branch outputs ``[global, local]`` (each ``B x H x Tq x Dh``) and
    returns ``Tq x B x C``. Observability: the mean gate over the real tokens is
    logged as ``<prefix>_gate`` in training and in fairseq's validation (so the
    validation log shows the paper's Fig. 3 directly), not in inference; the recorder
    gets ``gate`` (``B x Tq``, or ``B x H x Tq`` per head) and ``real`` (``B x Tq``, 1
    at real tokens, 0 at padding).
    """

    metric_passes = (TRAIN, VALID)

    def __init__(self, embed_dim: int, num_heads: int, per_head: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.per_head = per_head
        self.gate = nn.Linear(embed_dim, num_heads if per_head else 1)
        nn.init.xavier_uniform_(self.gate.weight)
        nn.init.zeros_(self.gate.bias)

    def extra_repr(self) -> str:
        return f"per_head={self.per_head}"

    def gate_values(self, ctx: AttentionContext) -> Tensor:
        """g of eq. 5, ``B x G x Tq`` float32."""
        logits = self.gate(ctx.query_input)  # Tq x B x G
        return torch.sigmoid(logits.float()).permute(1, 2, 0)  # B x G x Tq

    def forward(self, outputs: List[Tensor], ctx: AttentionContext) -> Tensor:
        global_out, local_out = outputs  # each B x H x Tq x Dh
        g = self.gate_values(ctx)  # B x G x Tq
        # eq. 4; lerp(a, b, w) = a + w (b - a), exact at w = 0 (a) and w = 1 (b)
        mixed = torch.lerp(global_out, local_out, g.unsqueeze(-1).to(global_out.dtype))  # B x H x Tq x Dh
        self._observe(ctx, g)
        return merge_heads(mixed)  # Tq x B x C

    def _observe(self, ctx: AttentionContext, g: Tensor):
        if self.recording:
            keep = ctx.query_keep()  # B x Tq or None
            real = g.new_ones(ctx.bsz, ctx.tgt_len) if keep is None else keep.float()
            self.record(GATE, g if self.per_head else g[:, 0])
            self.record(REAL_TOKENS, real)
        if self.logging_metrics:
            weights = ctx.query_weights()
            weights = None if weights is None else weights[:, None]  # B x 1 x Tq
            self.log_metrics((GATE,), weighted_means(g.detach().unsqueeze(0), weights))


@dataclass
class HybridSettings:
    """Everything a variant may need besides the core's own arguments.

    Attributes:
        window_m: m of eq. 3 (one-side band width; window size 2m + 1).
        gate: "token" (eq. 5) or "head" (one gate per head).
        neighbor_window: window strategy of NEIGHBOR (see :mod:`.gaussian`).
        windows: the Gaussian baselines' window settings: D of LOCAL_H (Luong et al.
            2015: 10), N of the "head" window strategy, the floor F on learned windows.
    """

    window_m: int = 1
    gate: str = "token"
    neighbor_window: str = "query"
    windows: GaussianWindows = field(default_factory=GaussianWindows)


Parts = Tuple[List[AttentionBranch], Fusion]  # branches and fusion of one core


def _gate(c: int, h: int, s: HybridSettings) -> Parts:
    return [global_branch(), local_branch(s.window_m, "local")], GateFusion(c, h, per_head=s.gate == "head")


def _concat(c: int, h: int, s: HybridSettings) -> Parts:
    return [global_branch(), local_branch(s.window_m, "local")], ConcatFusion(2)


def _local_pattern(c: int, h: int, s: HybridSettings) -> Parts:
    return [local_branch(s.window_m, "local")], MergeHeads()


def _neighbor(c: int, h: int, s: HybridSettings) -> Parts:
    return [s.windows.branch(c, h, centre="self", window=s.neighbor_window)], MergeHeads()


def _local_h(c: int, h: int, s: HybridSettings) -> Parts:
    return [s.windows.branch(c, h, centre="predicted", window="fixed")], MergeHeads()


def _local_s(c: int, h: int, s: HybridSettings) -> Parts:
    return [s.windows.branch(c, h, centre="predicted", window="query")], MergeHeads()


# Table 1 row -> (C, H, settings) -> (branches, fusion)
VARIANTS: Dict[str, Callable[[int, int, HybridSettings], Parts]] = {
    "gate": _gate,  # HYBRID (Gate), eq. 1-5
    "concat": _concat,  # HYBRID (Concate)
    "local_pattern": _local_pattern,  # LOCAL_PATTERN, eq. 1 and 3 only
    "neighbor": _neighbor,  # NEIGHBOR (Sperber et al. 2018)
    "local_h": _local_h,  # LOCAL_H (Luong et al. 2015)
    "local_s": _local_s,  # LOCAL_S (Yang et al. 2018)
}


def hybrid_attention(
    variant: str, embed_dim: int, num_heads: int, settings: Optional[HybridSettings] = None, **core_kwargs
) -> AttentionCore:
    """An :class:`~.attention.AttentionCore` computing one row of Xu et al.'s Table 1.

    ``core_kwargs`` go to the core (``self_attention``, ``causal``, ``dropout``, ...).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown hybrid variant {variant!r}; allowed: {', '.join(VARIANTS)}")
    settings = settings or HybridSettings()
    if settings.gate not in GATE_TYPES:
        raise ValueError(f"unknown gate type {settings.gate!r}; allowed: {', '.join(GATE_TYPES)}")
    if settings.window_m < 0:
        raise ValueError(f"the local window m must be >= 0 (got {settings.window_m})")
    branches, fusion = VARIANTS[variant](embed_dim, num_heads, settings)
    return AttentionCore(embed_dim, num_heads, branches=branches, fusion=fusion, **core_kwargs)
