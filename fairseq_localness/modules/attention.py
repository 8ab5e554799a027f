"""The attention core every model of this package is built on: the equation, and its
eager reference path.

Shape notation (as in fairseq's ``examples/adaptive_span``):
    B = batch size, H = attention heads, Tq = query length, Tk = key length,
    C = model dimension (``embed_dim``), Dh = C / H (head dimension),
    L = number of branches (distributions over the same energies).

Inputs and outputs follow fairseq's :class:`~fairseq.modules.MultiheadAttention`
(``Tq x B x C`` tensors, ``key_padding_mask`` of shape ``B x Tk`` with True at padding,
``incremental_state``, ``static_kv``, ``reorder_incremental_state``), so the core is a
drop-in replacement inside fairseq's transformer layers, and its parameters carry
fairseq's names (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``).

What it adds (the core and the branch/fusion tiers of the README's "Architecture"):

* The energies ``e = (Q W_q / sqrt(Dh)) (K W_k)^T`` are computed once and feed one or
  several *branches* (:class:`~.context.AttentionBranch`). A branch is one softmax
  over those energies with its own boolean mask and/or additive bias (Gaussian
  localness, a band, a direction, ...): ``P_b = softmax(e + bias_b, masked by
  mask_b)`` (Yang et al. 2018, eq. 4; Xu et al. 2019, eq. 1-3; Song et al. 2019,
  eq. 8-12). What a branch sees of the call is its :class:`~.context.AttentionContext`
  (real token positions, bottom-right aligned queries: see :mod:`.context`).
* A *fusion* (the :class:`~.fusion.Fusion` interface: sum, concatenation, and the
  papers' scalar and squeeze gates) combines the branch outputs ``P_b V`` before the
  output projection.
* Optional Shaw et al. (2018) relative position representations on keys and values,
  memory-linear in the sequence length (see :mod:`.relative_position`).

Numerics: masks are boolean and combined with ``|`` (no ``-inf`` planes are ever
summed); softmax runs in float32 whatever the input dtype; a query row that its masks
leave without any key (e.g. a padding query in a forward-only branch) gets an all-zero
distribution instead of NaN, in the forward and the backward pass (:mod:`.context`).

Two paths compute the same thing and are tested against each other: ``eager`` (here:
the readable reference, energies once, one float32 softmax per branch, returns
weights) and the fast path (one kernel call per branch, the fusion applied to the
outputs as in the eager path; :mod:`.kernels`). Which path a call takes, and which
kernel computes each branch, is decided in one place, :mod:`.kernels.choice`, whose
docstring tables the rules and the measurements behind them. ``attention_impl``
(:data:`~.kernels.choice.ATTENTION_IMPLS`) chooses: ``"auto"`` takes the fast path
where it applies except where the eager path was measured to be as fast, ``"sdpa"``
wherever it applies, ``"flex"`` and ``"dense"`` with every branch in one kind of kernel
(:mod:`.kernels.choice`), ``"eager"`` never; :func:`set_attention_impl` sets it for a
whole model, ``fairseq-localness-bench --attention-impl`` for the benchmark.

No host synchronisation on accelerators: the shortcuts that inspect a mask's values
(dropping an all-False padding mask, skipping the empty-row repair when no row is
empty) run on CPU tensors only.
"""
import math
from typing import Dict, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from fairseq_localness.modules.context import (
    AttentionBranch,
    AttentionContext,
    at_least_float32,
    base_mask,
    build_context,
    safe_masked_softmax,
)
from fairseq_localness.modules.fusion import (
    BranchOutputs, EagerOutputs, Fusion, FusedOutput, MergeHeads, SumFusion, split_heads,
)
from fairseq_localness.modules.incremental import (
    STEP_DTYPES, IncrementalBuffer, append_to_cache, grown_store, joined_padding, reordered_key_value_rows,
    search_constants, used_padding,
)
from fairseq_localness.modules.kernels.choice import (
    branch_attention, check_impl, fused_windows, relative_route, use_fast_path,
)
from fairseq_localness.modules.observe import Observable, probs_key
from fairseq_localness.modules.projections import stacked_linear, stacked_parameters, stacks_projections

def set_attention_impl(model: nn.Module, impl: str) -> int:
    """Set ``attention_impl`` of every :class:`AttentionCore` in ``model``; returns how
    many cores were set. ``impl`` is one of :data:`~.kernels.choice.ATTENTION_IMPLS`."""
    check_impl(impl)
    cores = [m for m in model.modules() if isinstance(m, AttentionCore)]
    for core in cores:
        core.attention_impl = impl
    return len(cores)


# Devices where a beam-search step projects q, k and v as one product, with the weights
# stacked once per search, and copies the keys and values into the step store: CUDA (one
# launch for the three products). Elsewhere, the CPU, they are three products, the keys'
# and the values' written into the store by the products themselves (``out=``): no copy
# of the weights per search nor of the keys and values per step. HySAN e1, beam search of
# 8 sentences x 32 tokens, 16 steps, iwslt_de_en, one thread: one decoder self-attention
# step replayed, 2,094 us against 2,300 for the stacked product (medians of 30 alternating
# rounds of 40 calls); whole searches beside the transformer's, 40 alternating rounds, 956 against
# 998 ms (medians; per round 1.017 times as fast, quartiles 0.980-1.087). Under autocast
# the stacked product, whose output autocast casts (the products into the store would
# not be). A search's parameters are taken to stay as they are during it: the stacked
# route keeps the weights of its first step, the other reads them at every step.
STACKED_STEP_DEVICES = ("cuda",)


def _linear_into(x: Tensor, proj: nn.Linear, out: Tensor) -> Tensor:
    """``proj(x)`` for ``x`` ``N x C_in``, written into ``out`` (``N x C_out``)."""
    if proj.bias is None:
        return torch.mm(x, proj.weight.t(), out=out)
    return torch.addmm(proj.bias, x, proj.weight.t(), out=out)


@with_incremental_state
class AttentionCore(nn.Module, Observable, IncrementalBuffer):
    """Multi-head attention with branches, additive biases and relative positions.

    Args:
        embed_dim: C.
        num_heads: H.
        kdim, vdim: key/value input dimensions (encoder-decoder attention).
        dropout: attention dropout, applied to every branch's distribution.
        bias: biases on the projections, as in fairseq.
        self_attention, encoder_decoder_attention: as in fairseq.
        causal: decoder self-attention (the core applies the bottom-right causal mask
            itself, so several target steps fed at once stay causal).
        branches: the distributions over the shared energies (default: one, global).
        fusion: a :class:`~.fusion.Fusion` that combines the branch outputs
            (default: :class:`~.fusion.MergeHeads`, or :class:`~.fusion.SumFusion` for
            several branches).
        relative_positions: a :class:`~.relative_position.RelativePositions`, or None.
        output_projection: False for the Dual Contextual module's FI units, which have
            no output projection of their own.
        self_positions: keys and values come from their own input (``key``,
            ``value``: projected and cached like encoder-decoder attention's, but
            step by step) while standing at the queries' token positions, as in the
            Dual Contextual module's FI(r, lc) unit; the context then reports the
            positions of self-attention (bottom-right aligned real positions, the
            visible key count when causal) and ``self_attention=True``, so branches,
            masks and recorded distributions see true positions.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kdim: Optional[int] = None,
        vdim: Optional[int] = None,
        dropout: float = 0.0,
        bias: bool = True,
        self_attention: bool = False,
        encoder_decoder_attention: bool = False,
        causal: bool = False,
        branches: Optional[Sequence[AttentionBranch]] = None,
        fusion: Optional[Fusion] = None,
        relative_positions: Optional[nn.Module] = None,
        output_projection: bool = True,
        self_positions: bool = False,
    ):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by the number of attention heads ({num_heads})"
            )
        if self_attention and encoder_decoder_attention:
            raise ValueError("an attention is either self-attention or encoder-decoder attention")
        if relative_positions is not None and not self_attention:
            raise ValueError("relative position representations apply to self-attention only")
        if self_positions and (self_attention or encoder_decoder_attention):
            raise ValueError(
                "self_positions is for attention whose keys come from their own input at the query "
                "positions; it excludes self_attention and encoder_decoder_attention"
            )
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.qkv_same_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim**-0.5
        self.self_attention = self_attention
        self.encoder_decoder_attention = encoder_decoder_attention
        self.causal = causal
        self.self_positions = self_positions
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)

        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

        self.branches = nn.ModuleList(branches if branches else [AttentionBranch()])
        if fusion is None:
            fusion = MergeHeads() if len(self.branches) == 1 else SumFusion()
        self.fusion = fusion
        self.relative_positions = relative_positions
        self.out_proj = (
            nn.Linear(fusion.output_dim(embed_dim), embed_dim, bias=bias)
            if output_projection
            else None
        )
        # which path computes the attention: one of kernels.choice.ATTENTION_IMPLS
        self.attention_impl = "auto"
        self.reset_parameters()

    def reset_parameters(self):
        # fairseq's initialisation (MultiheadAttention.reset_parameters).
        gain = 1 / math.sqrt(2) if self.qkv_same_dim else 1.0
        for proj in (self.k_proj, self.v_proj, self.q_proj):
            nn.init.xavier_uniform_(proj.weight, gain=gain)
        if self.out_proj is not None:
            nn.init.xavier_uniform_(self.out_proj.weight)
            if self.out_proj.bias is not None:
                nn.init.constant_(self.out_proj.bias, 0.0)

    # ------------------------------------------------------------------ caching
    # keys, values and their padding mask under "attn_state" in incremental_state,
    # reordered for beam search by IncrementalBuffer.reorder_incremental_state
    buffer_name = "attn_state"

    # ------------------------------------------------------------------ forward
    def _project(self, query, key, value, key_padding_mask, incremental_state, static_kv, projections=None):
        """Project and cache: returns q (unscaled), k, v as ``B x H x T x Dh`` and the
        key padding mask for all keys (cached included). ``projections``: q, k and v
        projected by the caller (``T x B x C`` each), for a pass without incremental
        state. A self-attention pass without incremental state projects q, k and v as
        one product where :func:`~.projections.stacks_projections` says so (CUDA)."""
        tgt_len, bsz, _ = query.shape
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if saved is not None and static_kv and "prev_key" in saved:
            key = value = None  # encoder states are already projected and cached

        heads = self.num_heads
        if projections is None and self._beam_step_applies(query, saved, static_kv):
            q, k, v, key_padding_mask = self._beam_step_project(query, key_padding_mask, incremental_state, saved)
            self._set_input_buffer(incremental_state, saved)
            return q, k, v, used_padding(key_padding_mask)
        own = (self.q_proj, self.k_proj, self.v_proj)
        if projections is None and self.self_attention and incremental_state is None \
                and stacks_projections(query, own):
            projections = stacked_linear(query, own)  # one product (CUDA: fewer launches)
        elif projections is not None and incremental_state is not None:
            raise ValueError("projections given with incremental_state: the cache needs the core's own")
        if projections is not None:
            q, k, v = (split_heads(x, heads) for x in projections)
        else:
            q = split_heads(self.q_proj(query), heads)  # B x H x Tq x Dh
            if self.self_attention:
                k, v = split_heads(self.k_proj(query), heads), split_heads(self.v_proj(query), heads)
            elif key is None:
                k = v = None
            else:
                k, v = split_heads(self.k_proj(key), heads), split_heads(self.v_proj(value), heads)

        if saved is not None:
            k, v, key_padding_mask = append_to_cache(saved, k, v, key_padding_mask, static_kv, bsz)
            self._set_input_buffer(incremental_state, saved)
        return q, k, v, used_padding(key_padding_mask)

    # ------------------------------------------------------------ the beam-search step
    # A self-attention step without gradients (beam search) writes the step's keys and
    # values into one store, "prev_kv_steps" (cap x 2 x B x H x Dh: per step the keys of
    # the B rows, then their values), whose views of the T steps are "prev_key" and
    # "prev_value" (B x H x T x Dh each, as the other paths' caches); fairseq's
    # MultiheadAttention makes three products and two concatenations. On the CPU the
    # keys' and values' products write into the store themselves; on CUDA
    # (STACKED_STEP_DEVICES) q, k and v are one product, with the projections' weights
    # stacked once per search (kept in its incremental_state under "qkv_weights"), and
    # the keys and values one copy into the store. A pass
    # that takes the other path afterwards (several steps at once, a step with
    # gradients) finds its keys and values under the same names and appends to copies
    # of them; the next beam-search step takes them over into a store of its own.
    # (The store's name does not end in "_store": the other path's stores do, which the
    # generic reorder pairs with their views.)
    _QKV = "qkv_weights"
    _KV_STORE = "prev_kv_steps"

    def _beam_step_applies(self, query: Tensor, saved, static_kv: bool) -> bool:
        """A self-attention step of one query without gradients, in a dtype of the
        one-row kernels, whose projections are plain ``nn.Linear`` modules without
        hooks (a replaced or hooked projection is called as itself)."""
        return (saved is not None and self.self_attention and not static_kv and query.size(0) == 1
                and not torch.is_grad_enabled() and query.dtype in STEP_DTYPES
                and all(type(proj) is nn.Linear and not proj._forward_hooks and not proj._forward_pre_hooks
                        for proj in (self.q_proj, self.k_proj, self.v_proj)))

    def _stacked_qkv(self, incremental_state) -> Tuple[Tensor, Tensor]:
        """``[W_q; W_k; W_v]`` and its bias (zeros for a projection without one), built
        at the search's first step and kept in its ``incremental_state`` (a search's
        parameters do not change; the next search stacks them again, and so does a step
        after the model moved to another dtype or device). A projection with hooks, or
        replaced by another module, keeps the step on the other path
        (:meth:`_beam_step_applies`), where it is called as itself."""
        own = (self.q_proj, self.k_proj, self.v_proj)
        stacked = search_constants(self, incremental_state, self._QKV, self.q_proj.weight,
                                   lambda: dict(zip(("weight", "bias"), stacked_parameters(own))))
        return stacked["weight"], stacked["bias"]

    def _kv_store(self, saved, bsz: int, like: Tensor) -> Tuple[Tensor, int]:
        """The step store of ``saved`` and its number of steps, with room for one more:
        the store itself where ``prev_key`` is its view; else a new one holding the
        cached steps (written by the other path), if any."""
        store, prev_key, prev_value = saved.get(self._KV_STORE), saved.get("prev_key"), saved.get("prev_value")
        length = 0 if prev_key is None else prev_key.size(2)
        steps_shape = (2, bsz, self.num_heads, self.head_dim)
        ours = (store is not None and prev_key is not None and prev_key.data_ptr() == store.data_ptr()
                and store.shape[1:] == steps_shape and store.dtype == like.dtype)
        if not ours or store.size(0) <= length:
            steps = None
            if ours:
                steps = store[:length]
            elif prev_key is not None:  # the other path's cache, taken over
                steps = torch.stack([prev_key.permute(2, 0, 1, 3), prev_value.permute(2, 0, 1, 3)], dim=1)
                for name in ("prev_key_store", "prev_value_store"):
                    saved.pop(name, None)
            store = grown_store(store if ours else None, steps, length + 1, steps_shape, like)
        return store, length

    def _beam_step_project(self, query: Tensor, key_padding_mask: Optional[Tensor], incremental_state, saved):
        """q, k, v and the padding of all keys of a beam-search step (see above)."""
        bsz, dim = query.size(1), self.embed_dim
        device = query.device.type
        if device in STACKED_STEP_DEVICES or (torch.amp.is_autocast_available(device)
                                              and torch.is_autocast_enabled(device)):
            qkv = F.linear(query, *self._stacked_qkv(incremental_state))  # 1 x B x 3C
            store, length = self._kv_store(saved, bsz, qkv)
            store[length] = qkv[0, :, dim:].view(bsz, 2, self.num_heads, self.head_dim).transpose(0, 1)
            q = qkv[..., :dim]
        else:  # the keys and values written by their products into the store
            store, length = self._kv_store(saved, bsz, query)
            for proj, slot in zip((self.k_proj, self.v_proj), store[length].view(2, bsz, dim)):
                _linear_into(query[0], proj, slot)
            q = F.linear(query, self.q_proj.weight, self.q_proj.bias)
        steps = store[: length + 1]
        k, v = steps[:, 0].permute(1, 2, 0, 3), steps[:, 1].permute(1, 2, 0, 3)  # B x H x T x Dh
        padding = joined_padding(saved.get("prev_key_padding_mask"), key_padding_mask, bsz, length, 1, q)
        saved.update({self._KV_STORE: store, "prev_key": k, "prev_value": v, "prev_key_padding_mask": padding})
        return split_heads(q, self.num_heads), k, v, padding

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search's reorder (:meth:`IncrementalBuffer.reorder_incremental_state`), of
        the beam-search step's store too: its keys' rows and its values' rows, once."""
        saved = self._get_input_buffer(incremental_state)
        store, prev_key = saved.get(self._KV_STORE), saved.get("prev_key")
        if store is None:
            return super().reorder_incremental_state(incremental_state, new_order)
        if prev_key is None or prev_key.data_ptr() != store.data_ptr():  # the other path's cache since
            saved.pop(self._KV_STORE)
            return super().reorder_incremental_state(incremental_state, new_order)
        cap, _, bsz, heads, head_dim = store.shape
        reordered = reordered_key_value_rows(store.view(cap, 2 * bsz, heads, head_dim), prev_key.size(2), new_order)
        store = reordered.view(cap, 2, new_order.numel(), heads, head_dim)
        steps = store[: prev_key.size(2)]
        padding = saved.get("prev_key_padding_mask")
        saved.update({self._KV_STORE: store, "prev_key": steps[:, 0].permute(1, 2, 0, 3),
                      "prev_value": steps[:, 1].permute(1, 2, 0, 3),
                      "prev_key_padding_mask": None if padding is None else padding.index_select(0, new_order)})
        return self._set_input_buffer(incremental_state, saved)

    def _context(self, query, q, k, key_padding_mask) -> AttentionContext:
        """The context of this call (:func:`~.context.build_context`); queries stand at
        the keys' positions in self-attention and with ``self_positions``."""
        same_positions = self.self_attention or self.self_positions
        return build_context(query, q, k, key_padding_mask, self.causal, same_positions)

    def _base_mask(self, ctx: AttentionContext, attn_mask: Optional[Tensor]):
        """Padding and causality as one boolean ``B' x 1 x Tq x Tk`` mask, plus the soft
        (finite) part of a float ``attn_mask`` as a bias (:func:`~.context.base_mask`)."""
        return base_mask(ctx, attn_mask)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor],
        value: Optional[Tensor],
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
        projections: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Same contract as fairseq's ``MultiheadAttention.forward``; ``projections``
        (not fairseq's): q, k and v already projected by the caller with this core's
        ``q_proj``, ``k_proj`` and ``v_proj`` (``T x B x C`` each), in a pass without
        incremental state (the Dual Contextual module computes its two FI units'
        projections of the same input as one product).

        Returns ``(output Tq x B x C, weights)``; weights are averaged over heads
        (``B x Tq x Tk``) or per head (``H x B x Tq x Tk``) with ``need_head_weights``,
        and only for a one-branch attention (several branches have no single
        distribution; their weights are available through the recorder).
        """
        if before_softmax:
            raise NotImplementedError("before_softmax is not supported by AttentionCore")
        if need_head_weights:
            need_weights = True
        tgt_len, bsz, embed_dim = query.shape
        assert embed_dim == self.embed_dim, f"query dim {embed_dim} != {self.embed_dim}"

        q, k, v, key_padding_mask = self._project(
            query, key, value, key_padding_mask, incremental_state, static_kv, projections
        )
        ctx = self._context(query, q, k, key_padding_mask)
        base_blocked, soft_bias = self._base_mask(ctx, attn_mask)

        weights = None
        if self._use_sdpa(query, need_weights, ctx):
            rel = self.relative_positions
            if rel is not None and relative_route(self.attention_impl, q.device, ctx.tgt_len, self._dropout_active(),
                                                  rel.value_embeddings is not None) == "bias":
                # Shaw et al.'s key term only (no values): a float mask for SDPA (with the
                # value term, dense.dense_relative computes both)
                key_term = self.relative_positions.key_scores(q * self.scaling, ctx)
                soft_bias = key_term if soft_bias is None else soft_bias + key_term
            stacked = fused_windows(ctx, v, self.branches, soft_bias, self.scaling,
                                    self.dropout_module if self._dropout_active() else None,
                                    self.relative_positions, self.attention_impl, self.fusion.epilogue,
                                    base_blocked, self.fusion.takes_stacked(q.device))
            if isinstance(stacked, FusedOutput):  # one fused call for all branches and the fusion
                outputs = stacked
            elif stacked is not None:  # one fused call for all branches (B x H x L x Tq x Dh)
                outputs = BranchOutputs(stacked)
            else:  # one kernel call per branch, each with its own mask, bias and dropout
                outputs = [self._sdpa(ctx, v, branch, base_blocked, soft_bias) for branch in self.branches]
        else:
            q_scaled = q * self.scaling
            energies = torch.matmul(q_scaled, k.transpose(-1, -2))  # B x H x Tq x Tk
            if self.relative_positions is not None:  # computed once, shared by the branches
                energies = energies + self.relative_positions.key_scores(q_scaled, ctx)
            energies = at_least_float32(energies)
            if soft_bias is not None:
                energies = energies + soft_bias
            outputs = EagerOutputs()
            for branch in self.branches:
                out, probs = self._eager_branch(ctx, energies, v, branch, base_blocked)
                outputs.append(out)
                if need_weights and len(self.branches) == 1:
                    weights = probs
                self.record(probs_key(branch.name), probs)

        if self.out_proj is not None:
            x = self.fusion.project(outputs, ctx, self.out_proj)  # Tq x B x C
        else:
            x = self.fusion(outputs, ctx)  # Tq x B x C'
        if weights is not None:
            weights = weights.to(query.dtype).transpose(0, 1)  # H x B x Tq x Tk
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return x, weights

    def _use_sdpa(self, query: Tensor, need_weights: bool, ctx: AttentionContext) -> bool:
        """Whether this call takes the fast path (:func:`~.kernels.choice.use_fast_path`:
        ``attention_impl``, the weights and distributions asked for, dtype, device,
        training, length, and whether every branch is a window alone)."""
        rel = self.relative_positions
        value_term = rel is not None and rel.value_embeddings is not None
        # windows alone, and nothing of the call's own (Shaw et al.'s terms, an attn_mask)
        windows = (ctx.self_attention and rel is None and not ctx.cache.get("extra_mask")
                   and all(branch.window_alone for branch in self.branches))
        return use_fast_path(self.attention_impl, query, ctx.src_len, branches=len(self.branches),
                             need_weights=need_weights, recording=self.recording, value_term=value_term,
                             dropout=self._dropout_active(), trainable=self.q_proj.weight.requires_grad,
                             windows=windows)

    def _sdpa(self, ctx, v, branch, base_blocked, soft_bias) -> Tensor:
        """One branch on the fast path, ``B x H x Tq x Dh`` in the input dtype, by the
        kernel :func:`~.kernels.choice.branch_attention` picks for it."""
        dropout = self.dropout_module if self._dropout_active() else None
        return branch_attention(ctx, v, branch, base_blocked, soft_bias, self.scaling, dropout,
                                self.relative_positions, self.attention_impl)

    def _eager_branch(self, ctx, energies, v, branch, base_blocked):
        """Reference path: returns the branch output ``B x H x Tq x Dh`` and its
        distribution ``B x H x Tq x Tk`` (float32)."""
        blocked, bias = branch.mask_and_bias(ctx, base_blocked)
        scores = energies if bias is None else energies + bias
        probs, row_empty = safe_masked_softmax(scores, blocked)
        if row_empty is not None and probs.size(-1) <= v.size(-1):
            # rows without keys zeroed in the smaller of the distribution (Tk wide) and
            # the output (Dh wide): zero weights give a zero output, Shaw et al.'s value
            # term included, and the fill's backward pass is as small
            probs, row_empty = probs.masked_fill(row_empty, 0.0), None
        dropped = self.dropout_module(probs)
        out = torch.matmul(dropped.to(v.dtype), v)
        if self.relative_positions is not None:
            out = out + self.relative_positions.value_output(dropped, ctx).to(v.dtype)
        if row_empty is not None:
            out = out.masked_fill(row_empty, 0.0)
            probs = probs.masked_fill(row_empty, 0.0)
        return out, probs

    def _dropout_active(self) -> bool:
        return self.dropout_module.p > 0 and (self.training or self.dropout_module.apply_during_inference)
