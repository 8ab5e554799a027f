"""Learned Gaussian localness bias (Yang et al., 2018, "Modeling Localness for
Self-Attention Networks"), as a branch of :class:`~.attention.AttentionCore`.

Shape notation as in :mod:`.attention`. Per head m and query i (eq. 4-11)::

    ATT(Q, K) = softmax(energy + G)                                   (4)
    G_ij      = -(j - P_i)^2 / (2 sigma_i^2),   sigma_i = D_i / 2      (5)
    [P_i; D_i] = I * sigmoid([p_i; z_i])                              (6, 10: per head)
    p_i       = U_p^T tanh(W_p Q_i)                                   (7)

and the window D comes from one of four strategies (section 3.3 and 5.1):

* ``fixed``: D = ``fixed_window`` (10, following Luong et al. 2015);
* ``layer``: z = U_d^T tanh(W_d mean(K)) over the real keys of the sentence (8);
* ``query``: z_i = U_d^T tanh(W_p Q_i), sharing W_p with eq. 7 (9), the default;
* ``head``: D^m = N * sigmoid(z^m), one learned scalar per head, N = 50 (11).

The centre is either predicted (eq. 6-7, ``centre="predicted"``) or the query's own
position (``centre="self"``: the NEIGHBOR baseline of Xu et al. 2019 after Sperber et
al. 2018, which the hybrid model reuses).

How the paper is read here (docs/localness_transformer.md):

* ``Q_i`` is the projected query before the ``1/sqrt(Dh)`` scaling, all heads
  concatenated (``C``-dimensional); ``W_p`` is C x C and ``U_p``, ``U_d`` have one
  column per head (eq. 10).
* ``I`` is the real length of the key sequence: the unpadded sentence length, or in
  causal decoder self-attention the number of keys query i can see (i + 1), which is
  what makes incremental decoding equal the full pass. Likewise the layer-specific
  mean of the keys is taken over the keys each query can see.
* ``j`` are real 0-based key positions, so ``P_i`` in (0, I) spans them.

Deviation, a differentiable floor on the window: with ``F = min_window`` (default 1.0,
the ``--localness-min-window`` / ``--hybrid-min-window`` options) the learned windows are

    D_i = F + (max(I, F) - F) * sigmoid(z_i)        (eq. 6/9, ``query`` and ``layer``)
    D^m = F + (N - F) * sigmoid(z^m)                (eq. 11, ``head``)

instead of ``I * sigmoid(z_i)`` and ``N * sigmoid(z^m)``. With ``F = 0`` these are Yang et
al.'s equations exactly. Why: without a floor, sigma = D/2 can reach 0 (``sigmoid``
underflows in float32 and half precision) and G divides by zero; a clamp
(``max(D, F)``) would give every window below the floor zero gradient, so it could
never grow back, and would cap how sharp a window can be. The affine floor keeps D in
(F, max(I, F)) with a gradient everywhere; F = 1 puts 0.787 of a window's mass on its
centre token at most, smaller floors allow sharper windows (0.9993 at D = 0.5). For
``F = 0`` only the division is guarded: sigma is kept above 1e-10 (G stays finite in
float32). The ``fixed`` strategy's D is used as given.
"""
import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_localness.modules import projections
from fairseq_localness.modules.context import AttentionBranch, AttentionContext
from fairseq_localness.modules.observe import CENTRE, QUERY_POSITION, VISIBLE_KEYS, WINDOW, weighted_means
from fairseq_localness.modules.scores import Description, GaussianScore, Prologue

WINDOW_STRATEGIES = ("fixed", "layer", "query", "head")
CENTRE_MODES = ("predicted", "self")


@dataclass(frozen=True)
class GaussianWindows:
    """The window settings a model's Gaussian branches share (see the module
    docstring): D of the ``fixed`` strategy, N of the ``head`` strategy (eq. 11) and
    the floor F on learned windows. One object per model, read once from its options
    and validated here for the branch and the command line alike."""

    fixed_window: float = 10.0
    head_window_max: float = 50.0
    min_window: float = 1.0

    def problem(self, window: str, name: Callable[[str], str] = str) -> Optional[str]:
        """What is wrong with these settings for window strategy ``window``, or None.

        ``name`` turns a setting's name into what the message calls it (the
        branch's argument names by default; the models pass their option flags)."""
        for setting in ("fixed_window", "head_window_max"):
            value = getattr(self, setting)
            if not (math.isfinite(value) and value > 0):
                return f"{name(setting)} must be a finite number > 0 (got {value})"
        floor = self.min_window
        if not (math.isfinite(floor) and floor >= 0):
            return f"{name('min_window')} must be a finite number >= 0 (got {floor})"
        if window == "head" and floor >= self.head_window_max:
            return (
                f"{name('min_window')} {floor} must be below {name('head_window_max')} "
                f"{self.head_window_max}: the head strategy's window lies between the two (eq. 11), "
                f"so it could not move"
            )
        return None

    def branch(self, embed_dim: int, num_heads: int, window: str, centre: str = "predicted") -> "GaussianLocalness":
        """A :class:`GaussianLocalness` branch with these settings."""
        return GaussianLocalness(
            embed_dim,
            num_heads,
            window=window,
            centre=centre,
            fixed_window=self.fixed_window,
            head_window_max=self.head_window_max,
            min_window=self.min_window,
        )


def compute_dtype(ctx: AttentionContext) -> torch.dtype:
    """The bias is computed in float32 (float64 for float64 models), never in half."""
    return _compute_dtype(ctx.q)


def _compute_dtype(q: Tensor) -> torch.dtype:
    """:func:`compute_dtype` of the queries ``q``."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


class GaussianLocalness(AttentionBranch):
    """The Gaussian bias G of eq. 5 as an attention branch.

    Args:
        embed_dim: C.
        num_heads: H (one centre and window per head, eq. 10).
        window: one of :data:`WINDOW_STRATEGIES`.
        centre: one of :data:`CENTRE_MODES`.
        fixed_window: D of the ``fixed`` strategy.
        head_window_max: N of the ``head`` strategy (eq. 11).
        min_window: F, the differentiable floor on a learned D (see the module
            docstring); 0 gives Yang et al.'s eq. 6 and 11 exactly.
    """

    name = "gaussian"

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        window: str = "query",
        centre: str = "predicted",
        fixed_window: float = 10.0,
        head_window_max: float = 50.0,
        min_window: float = 1.0,
    ):
        super().__init__()
        if window not in WINDOW_STRATEGIES:
            raise ValueError(f"unknown window strategy {window!r}; allowed: {', '.join(WINDOW_STRATEGIES)}")
        if centre not in CENTRE_MODES:
            raise ValueError(f"unknown centre mode {centre!r}; allowed: {', '.join(CENTRE_MODES)}")
        problem = GaussianWindows(fixed_window, head_window_max, min_window).problem(window)
        if problem is not None:
            raise ValueError(problem)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.window, self.centre = window, centre
        self.fixed_window, self.head_window_max, self.min_window = fixed_window, head_window_max, min_window

        needs_w_p = centre == "predicted" or window == "query"
        self.w_p = nn.Linear(embed_dim, embed_dim, bias=False) if needs_w_p else None
        self.u_p = nn.Linear(embed_dim, num_heads, bias=False) if centre == "predicted" else None
        self.w_d = nn.Linear(embed_dim, embed_dim, bias=False) if window == "layer" else None
        self.u_d = nn.Linear(embed_dim, num_heads, bias=False) if window in ("layer", "query") else None
        self.z_head = nn.Parameter(torch.zeros(num_heads)) if window == "head" else None
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.w_p, self.u_p, self.w_d, self.u_d):
            if lin is not None:
                nn.init.xavier_uniform_(lin.weight)

    def extra_repr(self) -> str:
        return f"window={self.window}, centre={self.centre}, min_window={self.min_window}"

    # -------------------------------------------------------------- eq. 6-11
    def centre_and_window(self, ctx: AttentionContext):
        """P and D of eq. 6/10/11, each ``B x H x Tq`` (float32, or float64)."""
        if self._at_once(ctx.q.device):
            return _centre_and_window(ctx.q, *self._at_once_inputs(ctx))
        dt = compute_dtype(ctx)
        bsz, heads, tgt_len, head_dim = ctx.q.shape
        q_full = ctx.q.permute(0, 2, 1, 3).reshape(bsz, tgt_len, heads * head_dim)  # B x Tq x C
        lengths = ctx.lengths.unsqueeze(1).to(dt)  # B' x 1 x Tq
        hidden = torch.tanh(self.w_p(q_full)) if self.w_p is not None else None  # B x Tq x C

        if self.centre == "predicted":
            p = self.u_p(hidden).transpose(1, 2).to(dt)  # B x H x Tq
            centre = lengths * torch.sigmoid(p)
        else:
            centre = ctx.q_pos.unsqueeze(1).to(dt).expand(bsz, heads, tgt_len)

        floor = self.min_window
        if self.window == "fixed":
            window = torch.full_like(centre, self.fixed_window)
        elif self.window == "head":  # eq. 11 with the floor
            span = self.head_window_max - floor
            window = (floor + span * torch.sigmoid(self.z_head.to(dt)))[None, :, None]
            window = window.expand(bsz, heads, tgt_len)
        else:
            if self.window == "query":  # eq. 9
                z = self.u_d(hidden).transpose(1, 2).to(dt)  # B x H x Tq
            else:  # layer, eq. 8
                key_mean = self._key_mean(ctx)  # B x Tq x C
                z = self.u_d(torch.tanh(self.w_d(key_mean))).transpose(1, 2).to(dt)  # B x H x Tq
            # eq. 6 with the floor: D in (F, max(I, F))
            window = floor + (lengths.clamp(min=floor) - floor) * torch.sigmoid(z)
        return centre, window

    def _at_once(self, device: torch.device) -> bool:
        """Whether P and D are computed together (:func:`_centre_and_window`):
        both predicted from ``tanh(W_p Q)`` (eq. 6 and 9), on a device of
        :data:`~.projections.STACKED_PROJECTION_DEVICES`."""
        return self.centre == "predicted" and self.window == "query" and \
            device.type in projections.STACKED_PROJECTION_DEVICES

    def _at_once_inputs(self, ctx: AttentionContext) -> tuple:
        """The tensors of :func:`_centre_and_window` besides the queries: ``W_p``,
        ``U_p``, ``U_d``, the scales ``[I; max(I, F) - F]`` (``B' x 2 x 1 x Tq``, shared
        by the layers of a pass, :meth:`AttentionContext.shared`) and the offsets
        ``[0; F]``."""
        dt, floor = compute_dtype(ctx), self.min_window

        def scales():
            lengths = ctx.lengths.unsqueeze(1).to(dt)  # B' x 1 x Tq
            return torch.stack([lengths, lengths.clamp(min=floor) - floor], dim=1)

        scale = scales() if ctx.causal else ctx.shared(("gaussian_scales", floor, dt, ctx.tgt_len), scales)
        return self.w_p.weight, self.u_p.weight, self.u_d.weight, scale, _offsets(float(floor), dt, ctx.q.device)

    def _prologue(self, ctx: AttentionContext) -> Prologue:
        """P and sigma of eq. 5-9, and the means the branch logs, as a
        :class:`~.scores.Prologue` of the queries (:func:`predicted_gaussian`)."""
        logging = self.logging_metrics
        tensors = self._at_once_inputs(ctx) + (_metric_inputs(ctx) if logging else (None, None))
        return Prologue(predicted_gaussian, ctx.q, tensors, (self.min_window == 0, logging),
                        functools.partial(self.log_metrics, self._metric_names(ctx)))

    def _key_mean(self, ctx: AttentionContext) -> Tensor:
        """Mean of the keys each query sees (eq. 8's mean(K)), ``B x Tq x C``."""
        dt = compute_dtype(ctx)
        bsz, heads, src_len, head_dim = ctx.k.shape
        keys = ctx.k.permute(0, 2, 1, 3).reshape(bsz, src_len, heads * head_dim).to(dt)
        if ctx.key_padding_mask is not None:
            keys = keys.masked_fill(ctx.key_padding_mask.unsqueeze(-1), 0.0)
        if ctx.causal:
            # query i sees keys 0..(Tk - Tq + i): a running mean
            running = keys.cumsum(1)[:, src_len - ctx.tgt_len :]
            counts = ctx.lengths.unsqueeze(-1).to(dt).clamp(min=1.0)
            return (running / counts).to(ctx.k.dtype)
        counts = ctx.lengths[:, :1].unsqueeze(-1).to(dt).clamp(min=1.0)  # B' x 1 x 1
        mean = keys.sum(1, keepdim=True) / counts
        return mean.expand(bsz, ctx.tgt_len, heads * head_dim).to(ctx.k.dtype)

    def describe(self, ctx: AttentionContext) -> Description:
        """G of eq. 5 as a score term (:class:`~.scores.GaussianScore`): the centres P
        and widths sigma = D / 2 (each ``B x H x Tq``) and the real key positions,
        observed once per call. The kernels evaluate it per block of queries
        (:mod:`.kernels.recompute`) or inside a fused kernel (:mod:`.kernels.flex`), so
        no ``B x H x Tq x Tk`` bias is kept for the backward pass."""
        k_pos = ctx.k_pos_as(compute_dtype(ctx))
        if self._at_once(ctx.q.device) and not self.recording:
            # P and D from the queries where they are needed: within a fused call that
            # takes the prologue (:data:`.kernels.flex.PROLOGUE_DEVICES`), else when read
            return Description(scores=(GaussianScore.predicted(self._prologue(ctx), k_pos),))
        centre, window = self.centre_and_window(ctx)
        self._observe(ctx, centre, window)
        return Description(scores=(GaussianScore(centre, _sigma(window, self.min_window == 0), k_pos),))

    def bias(self, ctx: AttentionContext) -> Tensor:
        """G of eq. 5, ``B x H x Tq x Tk`` (float32, or float64)."""
        return self.describe(ctx).dense_bias(ctx.src_len)

    def _observe(self, ctx: AttentionContext, centre: Tensor, window: Tensor):
        if self.recording:
            self.record(CENTRE, centre)
            self.record(WINDOW, window)
            self.record(QUERY_POSITION, ctx.q_pos.expand(ctx.bsz, -1))
            self.record(VISIBLE_KEYS, ctx.lengths.expand(ctx.bsz, -1))
        if self.logging_metrics:
            self.log_metrics(self._metric_names(ctx), _metric_means(centre, window, *_metric_inputs(ctx)))

    @staticmethod
    def _metric_names(ctx: AttentionContext) -> tuple:
        """The names of the means the branch logs: in self-attention the centre's
        offset from its query (the mean query position taken off), else the centre; and
        the window."""
        return ("centre_offset" if ctx.self_attention else "centre", "window")


def _centre_and_window(q: Tensor, w_p: Tensor, u_p: Tensor, u_d: Tensor, scale: Tensor, offsets: Tensor):
    """P and D of eq. 6, 7 and 9 (with the floor, module docstring), each ``B x H x
    Tq`` in float32 (float64 for float64 queries), from the same ``hidden = tanh(W_p
    Q)``: one product by ``[U_p; U_d]``, one sigmoid over both, and ``P = I *
    sigmoid(p)``, ``D = F + (max(I, F) - F) * sigmoid(z)`` as one ``addcmul`` with the
    scales ``[I; max(I, F) - F]`` and offsets ``[0; F]``
    (:meth:`GaussianLocalness._at_once_inputs`): five operators forward where the
    separate computation takes eleven, and fewer backward; the same values up to the
    products' rounding. ``q``: ``B x H x Tq x Dh``, before the ``1/sqrt(Dh)`` scaling.
    The products are of the weights (``F.linear``), not of the ``nn.Linear`` modules: a
    function of tensors, which a fused call computes within itself; hooks on
    ``w_p``, ``u_p`` and ``u_d`` do not run on this path."""
    dt = _compute_dtype(q)
    bsz, heads, tgt_len, head_dim = q.shape
    q_full = q.permute(0, 2, 1, 3).reshape(bsz, tgt_len, heads * head_dim)  # B x Tq x C
    hidden = torch.tanh(nn.functional.linear(q_full, w_p))  # B x Tq x C
    logits = nn.functional.linear(hidden, torch.cat([u_p, u_d]))  # B x Tq x 2H
    gates = torch.sigmoid(logits.view(bsz, tgt_len, 2, u_p.size(0)).permute(0, 2, 3, 1).to(dt))  # B x 2 x H x Tq
    centre, window = torch.addcmul(offsets, scale, gates).unbind(1)
    return centre, window


def predicted_gaussian(q: Tensor, w_p: Tensor, u_p: Tensor, u_d: Tensor, scale: Tensor, offsets: Tensor,
                       weights: Optional[Tensor], position: Optional[Tensor], unfloored: bool, metrics: bool):
    """The prologue of a predicted Gaussian (:class:`~.scores.Prologue`): ``((P, sigma),
    stats)``, P and sigma = D / 2 of eq. 5-9 from the queries ``q``
    (:func:`_centre_and_window`), and as ``stats`` where
    ``metrics`` the means the branch logs (:meth:`GaussianLocalness._observe`'s, from
    the query weights ``weights`` and the mean query position ``position``, either
    None), else None. ``unfloored``: F = 0, where only the division is guarded. One
    function of its inputs, for a fused call to compute within itself
    (:mod:`.kernels.flex`)."""
    centre, window = _centre_and_window(q, w_p, u_p, u_d, scale, offsets)
    stats = _metric_means(centre.detach(), window.detach(), weights, position) if metrics else None
    return (centre, _sigma(window, unfloored)), stats


def _sigma(window: Tensor, unfloored: bool) -> Tensor:
    """sigma = D / 2 (eq. 5); with F = 0 kept above 1e-10: only the division is guarded
    (module docstring)."""
    sigma = window / 2.0
    return sigma.clamp(min=1e-10) if unfloored else sigma


def _metric_inputs(ctx: AttentionContext) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """What :func:`_metric_means` takes besides P and D: the real queries' weights
    (:meth:`~AttentionContext.query_weights` as ``B x 1 x Tq``, or None) and, in
    self-attention, the mean query position (:func:`_mean_query_position`), else None."""
    weights = ctx.query_weights()
    weights = None if weights is None else weights[:, None]  # B x 1 x Tq
    return weights, (_mean_query_position(ctx, weights) if ctx.self_attention else None)


def _metric_means(centre: Tensor, window: Tensor, weights: Optional[Tensor], position: Optional[Tensor]) -> Tensor:
    """The means of P and D over the real queries (``weights``, ``B x 1 x Tq``, or None:
    all real), the mean query position ``[mean q_pos, 0]`` taken off where given."""
    means = weighted_means((centre, window), weights)
    return means if position is None else means - position


@torch.no_grad()
def _mean_query_position(ctx: AttentionContext, weights) -> Tensor:
    """``[mean q_pos, 0]`` over the real queries (``weights``: :meth:`~AttentionContext.query_weights`
    as ``B x 1 x Tq``, or None), float32: subtracted from the means of the centres and
    the windows, it makes the first the mean offset ``P_i - i``. Shared by the layers
    of a pass (:meth:`~AttentionContext.shared`)."""
    def make():
        positions = ctx.q_pos.to(torch.float32).expand(ctx.bsz, ctx.tgt_len)
        mean = positions.mean() if weights is None else (positions * weights[:, 0]).sum()
        return torch.stack([mean, torch.zeros_like(mean)])

    return ctx.shared(("mean_query_position", ctx.tgt_len), make)


@functools.lru_cache(maxsize=64)
def _offsets(floor: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[0; F]``, ``2 x 1 x 1``: the offsets of :func:`_centre_and_window`."""
    with torch.inference_mode(False):  # cached: usable by a later pass with gradients
        return torch.tensor([0.0, floor], dtype=dtype, device=device).view(2, 1, 1)
