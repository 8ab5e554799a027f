"""Hybrid Self-Attention Network (HySAN; Song et al. 2019): the branches and the
fusions, on top of :class:`~fairseq_localness.modules.attention.AttentionCore`.

Shape notation as in :mod:`.attention`: B = batch size, H = heads, Tq / Tk = query /
key length, C = model dimension (d in the paper), Dh = C / H, L = number of branches
(l in the paper), R = C / r (the squeeze gate's bottleneck).

One attention sublayer computes the energies ``e = q k^T / sqrt(Dh)`` once (eq. 6) and
feeds L masked softmaxes over them (eq. 8-12)::

    out(q, k, v) = f([softmax(e + M_b) v]_{b=1..L})                    (12)

with the masks of eq. 9 and 11 (``j`` key position, ``i`` query position, real
token positions, see :mod:`.branches`):

=============  ================  ========================  ============================
branch name    paper             encoder keeps             decoder keeps
=============  ================  ========================  ============================
``global``     global SAN        every j                   (not allowed, see below)
``forward``    M_fw (eq. 9)      ``j <= i``                ``j <= i``
``backward``   M_bw (eq. 9)      ``j >= i``                (not allowed)
``local<k>``   M_e / M_d (11)    ``|i - j| <= k``          ``i - k <= j <= i``
=============  ================  ========================  ============================

and one of three fusions ``f`` (eq. 13), applied to each branch's output with its
heads merged (``Tq x B x C``), before the layer's output projection ``W_o`` (eq. 6):

* ``sum``: ``sum_b x_b`` (:class:`~.fusion.SumFusion`), no parameters;
* ``concat``: ``H([x_1; ...; x_L])``: the concatenation (``Tq x B x L*C``) goes into
  the output projection, which becomes ``L*C -> C`` (:class:`~.fusion.ConcatFusion`);
* ``gated``: ``sum_b x_b * SG(x_b)`` with the squeeze gate of eq. 14,
  ``SG(x) = sigmoid(f2(ReLU(f1(x))))``, ``f1: C -> C/r``, ``f2: C/r -> C``, one gate per
  sublayer shared by its branches (:class:`SqueezeGate`, :class:`GatedSumFusion`).

Reading of the paper (docs/hysan_transformer.md), with the reasons:

* The fusion sits *before* ``W_o``, which all branches share: Table 2 gives ``sum``
  no extra parameters, so the branches cannot have an output projection each.
* ``concat``'s ``H`` replaces ``W_o`` instead of being stacked on it: two linear maps
  in a row are one linear map, and Table 2's counts (+524K, +6.29M, +25.1M) are
  exactly ``(L - 1) C^2`` per sublayer summed over the "e1" plan (encoder L = 4,
  decoder L = 2): ``8 C^2`` at IWSLT small, ``24 C^2`` at base and big.
* The squeeze gate acts on the C channels of a branch output (Fig. 3: "V means the
  dimension of the Value"), not per head: ``2 C^2 / r`` per sublayer summed over
  every encoder and decoder layer gives 32,768 / 393,216 / 1,572,864 parameters at
  IWSLT small / base / big against the paper's +32K / +383K / +1.57M (+2.4%, +2.7%,
  +0.2%).
* The gate's linear maps have **no biases** by default. With biases (``C/r + C``
  more per sublayer) IWSLT small would come to 33,856 (+5.8%), outside the paper's
  count, while base (+4.4%) and big (+1.0%) would still fit; so the counts say the
  gate is bias-free. ``gate_bias=True`` (``--hysan-gate-bias``) adds them.
* The squeeze gate's "squeeze" is the bottleneck ``C -> C/r -> C`` of Fig. 3, applied
  per token; there is no pooling over positions (that would look at future target
  tokens in the decoder and at padding in a batch).
* Decoder: "DiSAN can only be applied for encoder structure" and the decoder is
  "restricted to view only forward direction", so the decoder's branches are
  ``forward`` (the vanilla decoder self-attention) and causal ``local<k>``. ``M_d``
  of eq. 11 reads ``i - j <= k``; together with the causal mask this is
  ``i - k <= j <= i`` (the decoder branches here carry the causal bound themselves,
  and the core applies its causal mask too). ``global`` in the decoder would be the
  same distribution as ``forward`` and ``backward`` would look into the future; both
  are refused (by the model's option validation).
* Every branch has its own float32 softmax (its own row maximum), a row left empty by
  its mask gives zeros instead of NaN, and attention dropout is drawn independently
  for every branch's distribution (the paper does not say; this is what a
  per-branch ``tf.nn.dropout`` in tensor2tensor would do).
* Equation 8 writes ``softmax(q k^T + M)``; the ``1/sqrt(Dh)`` scaling of eq. 6 is kept
  (the branches share the energies of the ordinary multi-head attention).
"""
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from fairseq_localness.modules.branches import (
    WindowBranch,
    backward_branch,
    forward_branch,
    global_branch,
)
from fairseq_localness.modules.context import AttentionContext
from fairseq_localness.modules.fusion import (
    ConcatFusion, EagerOutputs, Fusion, FusedOutput, SumFusion, merge_branches, merge_heads, split_branches,
    split_heads,
)
from fairseq_localness.modules.observe import gate_key, weighted_means

SIDES = ("encoder", "decoder")
FUSIONS = ("sum", "concat", "gated")
# Devices where the gated sum after a fused call loops over the branches of its stacked
# output instead of gating all of them as one product (:meth:`GatedSumFusion.forward`;
# within the call, :meth:`GatedSumFusion.epilogue`, where ``flex.EPILOGUE_DEVICES`` says).
BRANCH_LOOP_DEVICES = ("cpu",)

# Fixed branch names per side; ``local<k>`` (k >= 1) is allowed on both sides.
_FIXED_BRANCHES: Dict[str, Dict[str, Callable[[], WindowBranch]]] = {
    "encoder": {"global": global_branch, "forward": forward_branch, "backward": backward_branch},
    "decoder": {"forward": forward_branch},
}
_LOCAL = re.compile(r"local(-?\d+)")


def fixed_branches(side: str) -> Tuple[str, ...]:
    """The branch names of fixed shape ``side`` accepts (every other accepted name is
    ``local<k>``)."""
    return tuple(_FIXED_BRANCHES[side])


def branch_names(side: str) -> Tuple[str, ...]:
    """The branch names a side accepts (``local<k>`` stands for any width k >= 1)."""
    return fixed_branches(side) + ("local<k>",)


def local_width(name: str) -> Optional[int]:
    """k of a ``local<k>`` name (may be < 1: the caller validates), else None."""
    match = _LOCAL.fullmatch(name)
    return int(match.group(1)) if match else None


def make_branch(name: str, side: str) -> WindowBranch:
    """The branch called ``name`` in ``side``'s self-attention (eq. 9 and 11).

    Encoder ``local<k>`` keeps ``|i - j| <= k`` (``M_e``), decoder ``local<k>`` keeps
    ``i - k <= j <= i`` (``M_d`` with the causal bound).
    """
    if side not in SIDES:
        raise ValueError(f"unknown side {side!r}; allowed: {', '.join(SIDES)}")
    fixed = _FIXED_BRANCHES[side]
    if name in fixed:
        return fixed[name]()
    width = local_width(name)
    if width is None:
        raise ValueError(f"unknown {side} branch {name!r}; allowed: {', '.join(branch_names(side))}")
    if width < 1:
        raise ValueError(f"local width must be >= 1 (got {name!r})")
    return WindowBranch(width, width if side == "encoder" else 0, name)


class SqueezeGate(nn.Module):
    """``SG(x) = sigmoid(f2(ReLU(f1(x))))`` (eq. 14, Fig. 3), per token.

    ``f1: C -> C/r`` squeezes, ``f2: C/r -> C`` expands; ``x`` is ``... x C``.
    """

    def __init__(self, embed_dim: int, reduction: int = 16, bias: bool = False):
        super().__init__()
        if reduction < 1 or embed_dim % reduction != 0:
            raise ValueError(
                f"the squeeze gate's reduction r must divide the model dimension "
                f"(C = {embed_dim}, r = {reduction})"
            )
        self.embed_dim, self.reduction = embed_dim, reduction
        self.f1 = nn.Linear(embed_dim, embed_dim // reduction, bias=bias)
        self.f2 = nn.Linear(embed_dim // reduction, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self):
        # Glorot uniform, tensor2tensor's default for dense layers; zero biases.
        for lin in (self.f1, self.f2):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(self.f2(torch.relu(self.f1(x))))


class GatedSumFusion(Fusion):
    """``sum_b x_b * SG(x_b)`` (eq. 13, "Gated Sum") with one :class:`SqueezeGate`
    shared by the L branches of the sublayer.

    Observability: in training, the mean gate value of each branch over the real
    (non-padding) query tokens and the C channels is logged as
    ``<prefix>_gate_<branch>`` (e.g. ``enc1_gate_backward``, ``dec2_self_gate_local1``);
    under an :class:`~.observe.AttentionRecorder` the per-token channel mean is kept as
    ``gate_<branch>`` (``B x Tq``).
    """

    def __init__(self, embed_dim: int, names: Sequence[str], reduction: int = 16, bias: bool = False):
        super().__init__()
        self.names = list(names)
        self.gate = SqueezeGate(embed_dim, reduction, bias)

    def extra_repr(self) -> str:
        return f"branches={','.join(self.names)}"

    def takes_stacked(self, device: torch.device) -> bool:
        """One gate over the L*B rows of all branches (where the branches' full passes
        are not looped over: :data:`BRANCH_LOOP_DEVICES`)."""
        return device.type not in BRANCH_LOOP_DEVICES

    def epilogue(self, ctx: AttentionContext):
        """The gated sum within the fused call of all branches (:func:`_gated_sum_epilogue`;
        the call asks for it on the devices of ``flex.EPILOGUE_DEVICES``: CUDA), where
        nothing records the gates: its products and element-wise steps, forward and
        backward, then run inside the call that Inductor compiles (fused with each
        other) instead of as some twenty operators of their own per sublayer, and the
        logged means of the gates come from the same call. Not yet measured on a GPU."""
        if self.recording:
            return None
        means = self.logging_metrics
        weights = ctx.query_weights(transposed=True) if means else None
        f1, f2 = self.gate.f1, self.gate.f2
        return _gated_sum_epilogue, (f1.weight, f1.bias, f2.weight, f2.bias, weights), (means,)

    def forward(self, outputs: List[Tensor], ctx: AttentionContext) -> Tensor:
        if isinstance(outputs, FusedOutput):  # computed within the fused call (:meth:`epilogue`)
            if outputs.stats is not None and self.logging_metrics:
                self.log_metrics([gate_key(name) for name in self.names], outputs.stats)
            return outputs.fused
        assert len(outputs) == len(self.names)
        want_gates = self.logging_metrics or self.recording
        stacked = getattr(outputs, "stacked", None)
        if stacked is not None and stacked.device.type in BRANCH_LOOP_DEVICES and stacked.size(3) > 1:
            # a full pass on a CPU: the loop over branches, whose temporaries stay in the
            # caches (one HySAN e1 encoder pass, 8 x 32 tokens: 88.9 ms against 90.6 ms
            # for one gate over the rows of all four branches)
            stacked = None
        f1, f2 = self.gate.f1, self.gate.f2
        if stacked is not None:
            # one fused call computed the branches: one gate over the L*B rows of all
            # (on CUDA: a few kernels instead of L times as many)
            params = (f1.weight, f1.bias, f2.weight, f2.bias)
            if torch.is_grad_enabled():
                fused, gates = _StackedGatedSum.apply(stacked, *params)
            else:  # beam search: the same forward without the autograd function's bookkeeping
                fused, _, gates = _stacked_gated_sum(stacked, *params)
            if want_gates:  # (Tq*L*B) x C -> L x Tq x B x C (a view)
                gates = gates.view(stacked.size(3), len(self.names), -1, gates.size(-1)).transpose(0, 1)
        else:
            keep_merged = isinstance(outputs, EagerOutputs)
            fused, *gates = _GatedSum.apply(want_gates, keep_merged, f1.weight, f1.bias, f2.weight, f2.bias,
                                            *outputs)
        if want_gates:
            self._observe(gates, ctx)
        return fused

    def _observe(self, gates, ctx: AttentionContext):
        """Log and record each branch's gate values (``Tq x B x C`` each; ``gates``: one
        per branch, or all of them as one ``L x Tq x B x C``): the L means over the real
        tokens and the channels as one :meth:`log_metrics` call."""
        if self.logging_metrics:
            weights = ctx.query_weights(transposed=True)
            weights = None if weights is None else weights.unsqueeze(-1)  # Tq x B x 1
            values = gates
            if not isinstance(gates, Tensor):  # (the channels averaged first: no copy of the gates)
                values = torch.stack([gate.mean(-1, keepdim=True, dtype=torch.float32) for gate in gates])
            self.log_metrics([gate_key(name) for name in self.names], weighted_means(values, weights))
        if self.recording:
            for name, gate in zip(self.names, gates):
                self.record(gate_key(name), gate.float().mean(-1).t())  # B x Tq


def _gate_of(x: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor]):
    """The squeeze gate's bottleneck ``h = ReLU(f1(x))`` and ``SG(x) = sigmoid(f2(h))``
    (eq. 14), each computed in place on its product."""
    h = F.linear(x, w1, b1).relu_()
    return h, F.linear(h, w2, b2).sigmoid_()


def _gate_backward(grad_y: Tensor, x: Tensor, h: Tensor, w1: Tensor, w2: Tensor, b2: Optional[Tensor]):
    """The backward pass of ``y = x * SG(x)`` (eq. 13-14) for ``x`` (``... x C``) with
    its bottleneck ``h``, in ``h``'s dtype: ``SG(x)`` recomputed from ``h`` by ``f2``
    (C^2/r multiply-adds per token, half the gate's forward arithmetic); returns
    ``grad_x`` and the products that give the weights' gradients, ``grad_z`` (through
    SG's sigmoid) and ``grad_h`` (through f2 and the ReLU)."""
    g = F.linear(h, w2, b2).sigmoid_()
    grad_z = grad_y * x
    torch.ops.aten.sigmoid_backward.grad_input(grad_z, g, grad_input=grad_z)
    grad_h = torch.ops.aten.threshold_backward(grad_z.matmul(w2), h, 0)
    grad_x = grad_h.matmul(w1).addcmul_(grad_y, g)  # f1's path + the product's
    return grad_x, grad_z, grad_h


def _flat(t: Tensor) -> Tensor:
    return t.reshape(-1, t.size(-1))


def _weight_grads(grad_z: Tensor, h: Tensor, grad_h: Tensor, x: Tensor, sums: list, params: Tuple,
                  biases: Tuple[bool, bool]):
    """Add one input's share to the gate's gradients ``sums`` = ``[w1, b1, w2, b2]``
    (None until the first share; a bias's only where ``biases`` says it has one), each
    share in its parameter's dtype (``params`` = ``(w1, w2)``), so that the sum over
    branches runs in float32 under autocast as autograd's would. The products are
    ``mm`` calls, which the benchmark's FLOP counter counts (it does not count
    ``addmm_``)."""
    shares = [(0, _flat(grad_h), _flat(x), params[0]), (2, _flat(grad_z), _flat(h), params[1])]
    for index, grad, inputs, param in shares:
        terms = [(index, grad.t().mm(inputs))]
        if biases[index // 2]:
            terms.append((index + 1, grad.sum(0)))
        for slot, share in terms:
            share = share.to(param.dtype)
            sums[slot] = share if sums[slot] is None else sums[slot].add_(share)


class _GatedSum(torch.autograd.Function):
    """``sum_b x_b * SG(x_b)`` (Song et al. 2019, eq. 13-14) with ``x_b =
    merge_heads(out_b)`` for the L branch outputs ``out_b`` (``B x H x Tq x Dh``), one
    branch after the other: returns the sum (``Tq x B x C``) and, where ``want_gates``,
    each branch's gate ``SG(x_b)`` (``Tq x B x C``, not differentiable: for logging
    and recording).

    What the backward pass keeps: the bottlenecks ``h_b`` (C/r values per token and
    branch), and either the outputs ``out_b`` (which the attention's fused kernels keep
    for their own backward pass anyway; ``x_b`` is then merged again from them) or,
    where ``keep_merged`` says that nothing else keeps them (the eager path's
    :class:`~.fusion.EagerOutputs`), the merged ``x_b`` in their place: as much
    memory kept for the backward pass, one copy less per branch (a HySAN e1 training
    step at 16 x 32 tokens merges heads 36 times instead of 72; the 72 took 15 ms of
    its 1.6 s on one CPU thread; within the forward pass the L merged copies are held
    together, (L-1) Tq B C values more than one at a time). ``SG(x_b)`` is recomputed
    from ``h_b`` (:func:`_gate_backward`). Autograd on the plain expression
    would keep ``x_b``, ``h_b`` and ``SG(x_b)`` (2 C + C/r per branch). Under autocast
    the saved tensors are in the autocast dtype and the backward pass computes in it;
    gradients come back in each input's dtype.

    The temporaries are one branch's at a time, written in place where the result is
    a fresh tensor (the ReLU, the sigmoid, the running sum), and the gates are
    returned (and no zero gradients made for them) only where they are logged. One
    HySAN encoder sublayer's gate (4 branches, 16 x 32 tokens, C = 512, r = 16; one
    thread, process CPU time, forward and backward, median of 21 alternating rounds
    of 10): 18.0 ms, against 20.8 ms for an autograd function per branch and 21.7 ms
    for one product over the rows of all branches (:class:`_StackedGatedSum`, whose
    four times larger temporaries leave the caches); the stacked form is kept for
    outputs that one fused call gives stacked.
    """

    @staticmethod
    def forward(ctx, want_gates, keep_merged, w1, b1, w2, b2, *outs):
        fused, merged, bottlenecks, gates = None, [], [], []
        for out in outs:
            x = merge_heads(out)
            h, g = _gate_of(x, w1, b1, w2, b2)
            fused = x * g if fused is None else fused.addcmul_(x, g)
            if keep_merged:
                merged.append(x)
            bottlenecks.append(h)
            if want_gates:
                gates.append(g)
        ctx.save_for_backward(w1, w2, b2, *(merged if keep_merged else outs), *bottlenecks)
        ctx.count, ctx.biases = len(outs), (b1 is not None, b2 is not None)
        ctx.keep_merged, ctx.heads = keep_merged, outs[0].size(1)
        ctx.mark_non_differentiable(*gates)
        ctx.set_materialize_grads(False)  # no zero gradients made for the gates
        return (fused, *gates)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_fused, *_grad_gates):
        if grad_fused is None:
            return (None,) * (6 + ctx.count)
        w1, w2, b2, *rest = ctx.saved_tensors
        kept, bottlenecks = rest[: ctx.count], rest[ctx.count :]
        dtype = bottlenecks[0].dtype
        w1c, w2c, b2c = w1.to(dtype), w2.to(dtype), None if b2 is None else b2.to(dtype)
        grad_y = grad_fused.to(dtype)
        sums, grads = [None] * 4, []
        weights_trained = any(ctx.needs_input_grad[2:6])
        for x, h in zip(kept, bottlenecks):
            out_dtype = x.dtype
            x = (x if ctx.keep_merged else merge_heads(x)).to(dtype)
            grad_x, grad_z, grad_h = _gate_backward(grad_y, x, h, w1c, w2c, b2c)
            if weights_trained:
                _weight_grads(grad_z, h, grad_h, x, sums, (w1, w2), ctx.biases)
            grads.append(split_heads(grad_x, ctx.heads).to(out_dtype))
        return (None, None, *sums, *grads)


class _StackedGatedSum(torch.autograd.Function):
    """:class:`_GatedSum` over the stacked outputs of L branches (``B x H x L x Tq x
    Dh``, :class:`~.fusion.BranchOutputs`): ``x = merge_branches(out)`` (``Tq x L*B x
    C``), each product and element-wise step once over the ``L*B`` rows of all
    branches, and the sum over branches one reduction. Returns the sum (``Tq x B x
    C``) and the gates (``(Tq*L*B) x C``, not differentiable). Keeps ``out`` and
    the bottleneck ``h`` for the backward pass, as :class:`_GatedSum` does."""

    @staticmethod
    def forward(ctx, out, w1, b1, w2, b2):
        fused, h, g = _stacked_gated_sum(out, w1, b1, w2, b2)
        ctx.save_for_backward(out, h, w1, w2, b2)
        ctx.biases = (b1 is not None, b2 is not None)
        ctx.mark_non_differentiable(g)
        ctx.set_materialize_grads(False)  # no zero gradients made for the gates
        return fused, g

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_fused, _grad_gates):
        if grad_fused is None:
            return (None,) * 5
        out, h, w1, w2, b2 = ctx.saved_tensors
        dtype = h.dtype
        w1c, w2c, b2c = w1.to(dtype), w2.to(dtype), None if b2 is None else b2.to(dtype)
        x = merge_branches(out).to(dtype)
        tgt_len, rows, dim = x.shape
        count = out.size(2)
        grad_y = grad_fused.to(dtype).unsqueeze(1).expand(tgt_len, count, rows // count, dim)
        x, grad_y = x.reshape(-1, dim), grad_y.reshape(-1, dim)  # the rows of h
        grad_x, grad_z, grad_h = _gate_backward(grad_y, x, h, w1c, w2c, b2c)
        sums = [None] * 4
        if any(ctx.needs_input_grad[1:5]):
            _weight_grads(grad_z, h, grad_h, x, sums, (w1, w2), ctx.biases)
        grad_out = split_branches(grad_x.view(tgt_len, rows, dim), out.size(1), count).to(out.dtype)
        return (grad_out, *sums)


def _stacked_gated_sum(out: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor]):
    """The forward pass of :class:`_StackedGatedSum`: the sum (``Tq x B x C``), the
    bottleneck ``h`` (``(Tq*L*B) x C/r``) and the gates (``(Tq*L*B) x C``), the
    products on two-dimensional rows (one operator call each)."""
    x = merge_branches(out)
    tgt_len, rows, dim = x.shape
    x = x.reshape(-1, dim)
    h, g = _gate_of(x, w1, b1, w2, b2)
    count = out.size(2)
    return (x * g).view(tgt_len, count, rows // count, dim).sum(1), h, g


def _gated_sum_epilogue(out: Tensor, w1: Tensor, b1: Optional[Tensor], w2: Tensor, b2: Optional[Tensor],
                        weights: Optional[Tensor], means: bool):
    """``sum_b x_b * SG(x_b)`` (eq. 13-14) over the stacked outputs ``out`` of the L
    branches (``B x H x L x Tq x Dh``), as plain operations for a fused call to compute
    within itself (:meth:`GatedSumFusion.epilogue`; autograd, or the compiler, derives
    the backward pass): returns the sum (``Tq x B x C``) and, where ``means``, each
    branch's mean gate value over the real queries (``weights``: ``Tq x B``, summing to
    1, or None where every query is real) and the C channels, float32, not
    differentiable: what :meth:`GatedSumFusion._observe` logs. Within a call with
    gradients it runs under activation checkpointing (:func:`~.kernels.flex._attend_windows`):
    the backward pass recomputes it from ``out``."""
    x = merge_branches(out)  # Tq x L*B x C
    tgt_len, rows, dim = x.shape
    count = out.size(2)
    gates = torch.sigmoid(F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2))
    fused = (x * gates).view(tgt_len, count, rows // count, dim).sum(1)
    stats = None
    if means:
        per_token = gates.detach().view(tgt_len, count, rows // count, dim).mean(-1, dtype=torch.float32)
        if weights is None:
            stats = per_token.mean((0, 2))
        else:
            stats = (per_token * weights.view(tgt_len, 1, rows // count)).sum((0, 2))
    return fused, stats


def build_fusion(kind: str, embed_dim: int, names: Sequence[str], reduction: int = 16, gate_bias: bool = False):
    """The fusion module ``f`` of eq. 13 for the branches ``names``."""
    builders = {
        "sum": lambda: SumFusion(),
        "concat": lambda: ConcatFusion(len(names)),
        "gated": lambda: GatedSumFusion(embed_dim, names, reduction, gate_bias),
    }
    if kind not in builders:
        raise ValueError(f"unknown fusion {kind!r}; allowed: {', '.join(FUSIONS)}")
    return builders[kind]()


def fusion_extra_parameters(
    kind: str, embed_dim: int, num_branches: int, reduction: int = 16, gate_bias: bool = False
) -> int:
    """Parameters one HySAN sublayer adds to a vanilla attention sublayer (closed form,
    for documentation and tests): 0, ``(L-1) C^2`` or ``2 C^2/r`` (+ ``C/r + C`` with
    gate biases)."""
    if kind == "sum":
        return 0
    if kind == "concat":
        return (num_branches - 1) * embed_dim * embed_dim
    squeezed = embed_dim // reduction
    return 2 * embed_dim * squeezed + ((squeezed + embed_dim) if gate_bias else 0)
