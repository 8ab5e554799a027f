"""The Dual Contextual (DC) module (Ampomah, McClean and Hawe 2021, "Dual contextual
module for neural machine translation", Sect. 4, eq. 6-9, Fig. 1-2)
and the Jensen-Shannon divergence between its two attention units (Sect. 7.2, eq. 10-13).

Shape notation (as in :mod:`.attention`):
    B = batch size, H = attention heads, T = sequence length (Tq queries, Tk keys),
    C = model dimension d, Dh = C / H, f = convolution kernel size.
    Sequence tensors are ``T x B x C`` like everywhere in fairseq; the convolution
    works on ``B x C x T``.

What it computes, for the input ``r`` of one encoder or decoder layer (the output of
the layer below):

* **Local Context Unit** (eq. 6)::

      r_hat_t = GLU([r_{t-a}, ..., r_{t+b}] W_r + b_r)      W_r: f*C x 2C, a + b = f - 1
      lc      = LayerNorm(r_hat + r)

  a 1-D convolution of kernel f over the C-dimensional tokens with a gated linear
  unit (Dauphin et al. 2017).
* **Context Interaction Unit** (eq. 7-9)::

      h_l   = FI(r, lc)       queries from r, keys and values from lc
      h_g   = FI(r, r)        plain self-attention
      z_hat = [h_l; h_g] W_z + b_z                           W_z: 2C x C
      z_f   = LayerNorm(z_hat + r)

  where ``FI(A, B) = concat(M_1, ..., M_H)``, ``M_i = ATT(A W^q_i, B W^k_i, B W^v_i)``:
  multi-head attention *without* an output projection (:class:`AttentionCore` with
  ``output_projection=False``); W_z is the only output projection. Per layer this
  adds ``(2f + 4) C^2 + 7C`` parameters to the self-attention sublayer it replaces
  (8 C^2 at f = 2: the paper's +12.66M for Enc-DC at base size, Table 1).

How it sits in a fairseq layer. :class:`DualContextModule` has the call signature of
fairseq's ``MultiheadAttention`` and returns ``z_hat``; it is built as the layer's
``self_attn``. fairseq's layer then applies exactly eq. 9 around it: dropout on the
sublayer output, the residual ``+ r`` and the layer norm (``self_attn_layer_norm`` is
the LayerNorm of eq. 9). With the default post-norm layers (the paper's reading, eq. 6
and 9 are ``LayerNorm(x + r)``) the layer computes ``z_f`` of eq. 9 verbatim; with
``--encoder-normalize-before``/``--decoder-normalize-before`` fairseq normalizes the
input first and leaves the residual stream un-normalized, giving the usual pre-norm
variant ``z_f = r + z_hat(LayerNorm(r))`` (the paper does not cover pre-norm). So the DC
module replaces the whole self-attention sublayer including its residual and norm,
without a copy of fairseq's layer ``forward``.

Padding, positions and causality:

* Padding positions are zeroed before every convolution, so a token next to padding
  sees zeros exactly as at the edge of an unpadded sentence: a left-padded sentence in
  a batch gives the same ``lc`` as alone.
* Even kernels need an explicit split of the f - 1 neighbours. Eq. 6 writes the window
  as ``[r_{t-f/2}, ..., r_{t+f/2}]``, which has f + 1 entries for even f; we keep its
  start ``t - floor(f/2)`` and take f tokens, i.e. ``a = floor(f/2)`` tokens to the
  left and ``b = f - 1 - a`` to the right: f = 2 -> ``[r_{t-1}, r_t]``, f = 3 ->
  ``[r_{t-1}, r_t, r_{t+1}]``, f = 4 -> ``[r_{t-2}, ..., r_{t+1}]``. (PyTorch's
  ``padding="same"`` would put the extra token on the right instead.)
* In the decoder the convolution is causal, ``a = f - 1, b = 0``: ``[r_{t-f+1}, ...,
  r_t]``; the causal mask of the core applies to both FI units, also to FI(r, lc),
  whose keys are the same positions as its queries. For incremental decoding the
  Local Context Unit caches its last f - 1 (padding-zeroed) inputs in
  ``incremental_state`` (reordered for beam search by
  :meth:`LocalContextUnit.reorder_incremental_state`), so feeding one or several
  target steps at a time gives exactly the full teacher-forced result.
* FI(r, lc) is not self-attention in the core's sense (keys come from another tensor)
  but its queries and keys are the same token positions: it is the core built with
  ``self_positions=True`` (separate key/value inputs, cached step by step in
  incremental decoding, whose context reports the positions of self-attention:
  bottom-right aligned real positions), so every branch, mask and recorded
  distribution sees true positions.

Deviations from the paper (not specified there; our choices):

* Dropout (``--dropout``) is applied to ``r_hat`` before the residual of eq. 6, as on
  every residual branch of the Transformer; the attention dropout of the FI units is
  ``--attention-dropout``; fairseq's residual dropout acts on ``z_hat`` (eq. 9).
* Initialisation: the convolution ``W_r`` (seen as f*C x 2C) and ``W_z`` are Xavier
  uniform with zero biases; the FI projections use fairseq's attention initialisation.

Observability: every FI unit records its distribution as ``probs_global`` under the
:class:`~.observe.AttentionRecorder`; the module records ``query_padding_mask``.
:func:`fairseq_localness.analysis.divergence.dc_divergence` turns these into the
per-layer Jensen-Shannon divergence of Sect. 7.2 (eq. 10-13) over a set of batches
(with :func:`reduced_js` below); with ``log_divergence=True`` the module also logs it
as the metric ``<prefix>_js`` (e.g. ``enc1_js``) on every forward pass of fairseq's
validation (not in training, not in inference).
"""
import math
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules import LayerNorm
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.context import causal_mask, query_part
from fairseq_localness.modules.fusion import merge_heads, split_heads
from fairseq_localness.modules.incremental import (
    STEP_DTYPES, IncrementalBuffer, _steps_view, attention_step, grown_store, joined_padding, reordered_key_value_rows,
    search_constants, used_padding,
)
from fairseq_localness.modules.kernels.sdpa import masked_attention, padding_attention
from fairseq_localness.modules.kernels.step import last_keys_attention
from fairseq_localness.modules.projections import (
    stacked_linear, stacked_parameters, stacked_projection, stacks_projections,
)
from fairseq_localness.modules.observe import QUERY_PADDING, VALID, Observable

HEAD_REDUCTIONS = ("max", "mean", "per_head")
# Devices where a pass without incremental state computes both FI units as one SDPA
# call of 2H heads (DualContextModule._joint_pass): CUDA, where a training step is
# bound by its launches (issue 38); not yet measured on a GPU. The CPU keeps the
# units' own calls and the kernels chosen for them there.
JOINT_PASS_DEVICES = ("cuda",)


def kernel_split(kernel_size: int, causal: bool) -> Tuple[int, int]:
    """Neighbours ``(a, b)`` to the left and right of token t in a window of f tokens.

    Encoder: ``a = floor(f/2), b = f - 1 - a`` (eq. 6's window start ``t - f/2``);
    decoder (causal): ``a = f - 1, b = 0``.
    """
    if kernel_size < 1:
        raise ValueError(f"kernel size must be >= 1 (got {kernel_size})")
    if causal:
        return kernel_size - 1, 0
    left = kernel_size // 2
    return left, kernel_size - 1 - left


@with_incremental_state
class LocalContextUnit(nn.Module, IncrementalBuffer):
    """The Local Context Unit (eq. 6): ``lc = LayerNorm(GLU(Conv1d_f(r)) + r)``.

    Args:
        embed_dim: C.
        kernel_size: f (>= 1); the window split is :func:`kernel_split`.
        causal: decoder (window ``[t-f+1, t]``), with an incremental cache.
        dropout: dropout on ``r_hat`` before the residual.
    """

    def __init__(self, embed_dim: int, kernel_size: int = 2, causal: bool = False, dropout: float = 0.0):
        super().__init__()
        self.embed_dim = embed_dim
        self.kernel_size = kernel_size
        self.causal = causal
        self.left, self.right = kernel_split(kernel_size, causal)
        # W_r (f*C x 2C) and b_r of eq. 6; weight stored as 2C x C x f by nn.Conv1d.
        self.conv = nn.Conv1d(embed_dim, 2 * embed_dim, kernel_size)
        self.layer_norm = LayerNorm(embed_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=self.__class__.__name__)
        self.reset_parameters()

    def reset_parameters(self):
        # Xavier uniform on W_r seen as an f*C x 2C matrix (fan_in f*C, fan_out 2C).
        fan_in, fan_out = self.kernel_size * self.embed_dim, 2 * self.embed_dim
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        nn.init.uniform_(self.conv.weight, -bound, bound)
        nn.init.zeros_(self.conv.bias)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, causal={self.causal}, window=[t-{self.left}, t+{self.right}]"

    # ------------------------------------------------------------------ caching
    # the last f - 1 inputs (``prev_input``, ``B x (f-1) x C``, oldest first) under
    # "conv_state" in incremental_state, reordered for beam search by
    # IncrementalBuffer.reorder_incremental_state; a beam-search step's weight (W_r with
    # the window's positions outermost, see _step_weight) under "conv_step_weight"
    buffer_name = "conv_state"
    _STEP_WEIGHT = "conv_step_weight"

    def _step_weight(self, incremental_state) -> Tensor:
        """W_r as ``2C x f*C`` with the window's positions outermost (``[W_{t-a}, ...,
        W_t]``, each ``2C x C``), so that a step's window is its f inputs side by side
        (one concatenation) instead of an unfolded copy; built at the first step of a
        search and kept in its ``incremental_state`` (a search's parameters do not
        change; built again after a change of their dtype or device)."""
        weight = self.conv.weight
        return search_constants(self, incremental_state, self._STEP_WEIGHT, weight, lambda: {
            "weight": weight.permute(0, 2, 1).reshape(self.conv.out_channels, -1)})["weight"]

    def _step(self, r: Tensor, buffer, incremental_state) -> Tensor:
        """One decoder step without gradients (beam search): ``r`` ``1 x B x C`` ->
        ``GLU(r_hat)`` of eq. 6, ``1 x B x C``, from the cached f - 1 inputs and this one
        side by side (``B x f*C``) times :meth:`_step_weight`: three operator calls
        where the unfolded window took eight."""
        bsz = r.size(1)
        prev = buffer.get("prev_input")
        if prev is None:
            prev = r.new_zeros(bsz, self.left, r.size(2))
        window = torch.cat([prev.reshape(bsz, -1).to(r.dtype), r[0]], dim=-1)  # B x f*C, oldest input first
        buffer["prev_input"] = window[:, r.size(2):].view(bsz, self.left, r.size(2))
        self._set_input_buffer(incremental_state, buffer)
        return F.glu(F.linear(window, self._step_weight(incremental_state), self.conv.bias), dim=-1).unsqueeze(0)

    # ------------------------------------------------------------------ forward
    def convolve(
        self,
        r: Tensor,
        padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
    ) -> Tensor:
        """``r_hat`` of eq. 6 (before dropout and residual): ``T x B x C`` -> ``T x B x C``.

        Args:
            r: ``T x B x C``.
            padding_mask: ``B x T``, True at padding (zeroed before the convolution).
            incremental_state: decoder only; the new T steps continue the cached ones.
        """
        # the test for any padding runs on a CPU only (on an accelerator it would wait
        # for the device; the fill is cheap there)
        if padding_mask is not None and (padding_mask.device.type != "cpu" or bool(padding_mask.any())):
            r = r.masked_fill(padding_mask.transpose(0, 1).unsqueeze(-1), 0.0)
        tgt_len = r.size(0)
        if incremental_state is not None:
            if not self.causal:
                raise RuntimeError("incremental_state is only supported by the causal (decoder) unit")
            buffer = self._get_input_buffer(incremental_state)
            if tgt_len == 1 and self.left > 0 and not torch.is_grad_enabled():
                return self._step(r, buffer, incremental_state)
            prev = buffer.get("prev_input")  # B x (f-1) x C
            if prev is None:
                prev = r.new_zeros(r.size(1), self.left, r.size(2))
            x = torch.cat([prev.transpose(0, 1).to(r.dtype), r], dim=0)  # (f-1+T) x B x C
            if self.left > 0:
                buffer["prev_input"] = x[x.size(0) - self.left :].transpose(0, 1)
                self._set_input_buffer(incremental_state, buffer)
        else:
            x = F.pad(r, (0, 0, 0, 0, self.left, self.right))  # (a+T+b) x B x C
        # Eq. 6 as written: the window [r_{t-a}, ..., r_{t+b}] (f*C) times W_r (f*C x 2C),
        # one matrix product. W_r is the convolution's weight (2C x C x f, seen as
        # 2C x C*f, the window flattened channel-major), so parameters are unchanged;
        # this replaces nn.Conv1d, whose CPU kernel (forward and backward) was several
        # times slower than the same arithmetic as a matrix product.
        windows = x.unfold(0, self.kernel_size, 1)[:tgt_len]  # T x B x C x f
        weight = self.conv.weight.reshape(self.conv.out_channels, -1)  # 2C x C*f
        pre = F.linear(windows.reshape(tgt_len, r.size(1), -1), weight, self.conv.bias)  # T x B x 2C
        return F.glu(pre, dim=-1)  # T x B x C

    def forward(self, r: Tensor, padding_mask: Optional[Tensor] = None, incremental_state=None) -> Tensor:
        """``lc = LayerNorm(r_hat + r)`` (eq. 6), ``T x B x C``."""
        r_hat = self.dropout_module(self.convolve(r, padding_mask, incremental_state))
        return self.layer_norm(r_hat + r)


@with_incremental_state
class DualContextModule(nn.Module, Observable):
    """The DC module (Fig. 1, eq. 6-8): returns ``z_hat``; the enclosing fairseq layer
    adds dropout, the residual and the LayerNorm of eq. 9 (see the module docstring).

    A beam-search step (one query, no gradients; :meth:`_joint_step_applies`) computes
    both FI units as one attention of 2H heads: the local unit's heads first, then the
    global unit's, all with the row's scale ``1/sqrt(Dh)``, its causal keys (every
    cached step) and its padding, so the heads' outputs merge straight into
    ``[h_l; h_g]`` of eq. 8. Its queries, keys and values are two products with
    weights stacked once per search (``[W^q_l; W^q_g; W^k_g; W^v_g]`` on r,
    ``[W^k_l; W^v_l]`` on lc), and the two units' keys and values one cache
    (:meth:`_append_joint`), written and reordered once per step. One step then made
    16 operator calls where the two units' own steps made 26 (at C = 512, 8 heads, on
    the CPU, the softmax counted as one call: fairseq's self-attention step makes 10;
    with three products, before r's two were one)
    and reorders 2 caches instead of 5, where a beam search is bound by the host's
    launches (issue 38: the H200's beam search, 338 ms of CPU time against 22 ms of
    kernels).

    On CUDA (:data:`JOINT_PASS_DEVICES`) a pass without incremental state (training,
    validation without the divergence logged) likewise computes both units as one SDPA
    call of 2H heads (:meth:`_joint_pass`).

    Drop-in for fairseq's ``MultiheadAttention`` as a layer's ``self_attn``: same call
    signature; ``key`` and ``value`` must be the query (self-attention); returns
    ``(z_hat T x B x C, None)``.

    Args:
        embed_dim: C.
        num_heads: H of both FI units.
        kernel_size: f of the Local Context Unit.
        causal: decoder self-attention.
        dropout: dropout on ``r_hat`` (eq. 6).
        attention_dropout: dropout on the FI distributions.
        log_divergence: log the Jensen-Shannon divergence between the FI units
            (eq. 10-11, heads reduced by max) as ``<prefix>_js`` in fairseq's
            validation.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        kernel_size: int = 2,
        causal: bool = False,
        dropout: float = 0.0,
        attention_dropout: float = 0.0,
        log_divergence: bool = False,
    ):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.causal = causal
        self.log_divergence = log_divergence
        self.metric_passes = (VALID,) if log_divergence else ()
        self.local_context = LocalContextUnit(embed_dim, kernel_size, causal=causal, dropout=dropout)
        # FI(r, lc): queries from r, keys and values from lc, at the same token positions
        self.fi_local = AttentionCore(
            embed_dim,
            num_heads,
            dropout=attention_dropout,
            causal=causal,
            output_projection=False,
            self_positions=True,
        )
        self.fi_global = AttentionCore(
            embed_dim,
            num_heads,
            dropout=attention_dropout,
            self_attention=True,
            causal=causal,
            output_projection=False,
        )
        # W_z (2C x C) and b_z of eq. 8.
        self.aggregate = nn.Linear(2 * embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.aggregate.weight)
        nn.init.zeros_(self.aggregate.bias)

    # fairseq's decoder layer reads its self_attn's buffer at every call, and uses it with
    # --cross-self-attention (which these models refuse) and in ONNX tracing: the global
    # FI unit's buffer, which holds its keys and values except during a beam search
    # (the joint cache holds them then; a prev_self_attn_state written here is not read
    # by the joint step).
    def _get_input_buffer(self, incremental_state):
        return self.fi_global._get_input_buffer(incremental_state)

    def _set_input_buffer(self, incremental_state, buffer):
        return self.fi_global._set_input_buffer(incremental_state, buffer)

    def _plain_step(self, r: Tensor, incremental_state, attn_mask: Optional[Tensor]) -> bool:
        """Whether this call is one decoder step that both FI units compute by the
        one-row kernel (:func:`~.incremental.attention_step`): one query, no
        ``attn_mask``, nothing recorded, no attention dropout drawn, a fast-path dtype,
        ``attention_impl`` not ``"eager"``. A beam-search step then skips the cores'
        context, masks and kernel choice, which a step of one query row does not use
        (a DC step at d = 16: 1.28 -> 1.06 ms; docs/benchmark_appendix.md, "Dec-DC's
        beam search at long sentences")."""
        if incremental_state is None or r.size(0) != 1 or attn_mask is not None or self.recording:
            return False
        return r.dtype in STEP_DTYPES and all(
            core.attention_impl != "eager" and not core.recording and not core._dropout_active()
            for core in (self.fi_local, self.fi_global)
        )

    # ------------------------------------------------------------ the joint step
    # one cache of both FI units' keys and values under "joint" in incremental_state:
    # "kv_store" (cap x 2B x 2H x Dh: per step the keys of B rows, then their values;
    # per row the local unit's H heads, then the global unit's), "kv" (its view of the
    # T steps, 2B x 2H x T x Dh) and "padding" (B x T, or None); and the stacked
    # weights of the search under "joint_weights" (:meth:`_stacked_weights`)
    _JOINT = "joint"
    _WEIGHTS = "joint_weights"

    def _projection_pairs(self) -> Tuple[Tuple[nn.Linear, nn.Linear], ...]:
        """The FI units' projections in the pairs the joint step and pass stack: the
        queries ``(W^q_l, W^q_g)`` and the global unit's keys and values ``(W^k_g,
        W^v_g)``, both of r, and the local unit's keys and values ``(W^k_l, W^v_l)``,
        of lc."""
        local, glob = self.fi_local, self.fi_global
        return (local.q_proj, glob.q_proj), (glob.k_proj, glob.v_proj), (local.k_proj, local.v_proj)

    def _joint_step_applies(self, r: Tensor, incremental_state, attn_mask: Optional[Tensor]) -> bool:
        """A step of :meth:`_plain_step` without gradients (beam search): :meth:`_joint_step`."""
        return not torch.is_grad_enabled() and self._plain_step(r, incremental_state, attn_mask)

    def _stacked_weights(self, incremental_state) -> Dict[str, Tensor]:
        """The weights of r's one product, ``[W^q_l; W^q_g; W^k_g; W^v_g]`` (the queries
        of both units, then the global unit's keys and values) and those of lc's,
        ``[W^k_l; W^v_l]``, with their biases (zeros for a projection without one),
        once per search (:func:`~.incremental.search_constants`: two concatenations per
        DC layer). The projections' modules are not called in a joint step: forward
        hooks on them do not run there (as in the stacked products of a full pass)."""
        queries, kv_global, kv_local = self._projection_pairs()

        def build():
            (w_r, b_r), (w_lc, b_lc) = stacked_parameters(queries + kv_global), stacked_parameters(kv_local)
            return {"w_r": w_r, "b_r": b_r, "w_kv_local": w_lc, "b_kv_local": b_lc}

        return search_constants(self, incremental_state, self._WEIGHTS, self.fi_global.q_proj.weight, build)

    def _joint_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        """The joint cache; at the search's first joint step (or the first after a pass
        that took the units' own path), made from the units' cached steps, if any
        (:meth:`_take_over_caches`)."""
        buffer = self.get_incremental_state(incremental_state, self._JOINT)
        if not buffer:
            buffer = self._take_over_caches(incremental_state)
            self.set_incremental_state(incremental_state, self._JOINT, buffer)
        return buffer

    def _joint_step(self, r: Tensor, lc: Tensor, key_padding_mask: Optional[Tensor], incremental_state) -> Tensor:
        """``[h_l; h_g]`` (``1 x B x 2C``) of one decoder step: eq. 7 for both FI units
        as one attention of 2H heads over their joint cache (see the class docstring)."""
        weights = self._stacked_weights(incremental_state)
        from_r = F.linear(r, weights["w_r"], weights["b_r"])  # 1 x B x 4C: [q_l, q_g, k_g, v_g]
        q = split_heads(from_r[..., : 2 * self.embed_dim], 2 * self.num_heads)  # B x 2H x 1 x Dh: [q_l, q_g]
        kv_local = F.linear(lc, weights["w_kv_local"], weights["b_kv_local"])
        k, v, padding = self._append_joint(self._joint_buffer(incremental_state), kv_local,
                                           from_r[..., 2 * self.embed_dim:], key_padding_mask)
        return merge_heads(last_keys_attention(q, k, v, self.fi_global.scaling, used_padding(padding), None))

    def _append_joint(self, buffer: Dict[str, Optional[Tensor]], kv_local: Tensor, kv_global: Tensor,
                      key_padding_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
        """Write one step's keys and values (``1 x B x 2C`` each, ``[k; v]`` of the local
        and of the global unit) into the joint cache ``buffer``; returns the keys and
        values of all steps (``B x 2H x T x Dh`` each) and their padding (``B x T``)."""
        bsz, heads, head_dim = kv_local.size(1), self.num_heads, self.head_dim
        store, length = buffer.get("kv_store"), 0 if buffer.get("kv") is None else buffer["kv"].size(2)
        if store is None or store.size(0) <= length or store.dtype != kv_local.dtype:
            store = grown_store(store, None if store is None else store[:length], length + 1,
                                (2 * bsz, 2 * heads, head_dim), kv_local)
        slot = store[length].view(2, bsz, 2, heads, head_dim)  # (k, v) x B x (local, global) x H x Dh
        slot[:, :, 0] = kv_local.view(bsz, 2, heads, head_dim).transpose(0, 1)
        slot[:, :, 1] = kv_global.view(bsz, 2, heads, head_dim).transpose(0, 1)
        kv = _steps_view(store, length + 1)
        padding = joined_padding(buffer.get("padding"), key_padding_mask, bsz, length, 1, kv)
        buffer.update(kv_store=store, kv=kv, padding=padding)  # (the dict held in incremental_state)
        return kv[:bsz], kv[bsz:], padding

    def _take_over_caches(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        """A joint cache where there is none: empty, or where the FI units hold steps in
        their own caches (a pass before took their path), those steps (theirs then
        emptied)."""
        local = self.fi_local._get_input_buffer(incremental_state)
        glob = self.fi_global._get_input_buffer(incremental_state)
        if local.get("prev_key") is None:
            return {}
        k = torch.cat([local["prev_key"], glob["prev_key"]], dim=1)  # B x 2H x T x Dh
        v = torch.cat([local["prev_value"], glob["prev_value"]], dim=1)
        kv = torch.cat([k, v], dim=0)  # 2B x 2H x T x Dh
        store = kv.permute(2, 0, 1, 3).contiguous()
        padding = glob.get("prev_key_padding_mask")
        for core in (self.fi_local, self.fi_global):
            core._set_input_buffer(incremental_state, {})
        return {"kv_store": store, "kv": _steps_view(store, store.size(0)),
                "padding": None if padding is None else padding.bool()}

    def _hand_back_caches(self, incremental_state):
        """Before a pass that takes the FI units' own path: the joint cache's steps back
        into their caches (views of it), the joint cache emptied."""
        buffer = self.get_incremental_state(incremental_state, self._JOINT)
        if not buffer or buffer.get("kv") is None:
            return
        kv = buffer["kv"]
        bsz, heads = kv.size(0) // 2, self.num_heads
        for unit, core in enumerate((self.fi_local, self.fi_global)):
            part = slice(unit * heads, (unit + 1) * heads)
            core._set_input_buffer(incremental_state, {
                "prev_key": kv[:bsz, part], "prev_value": kv[bsz:, part], "prev_key_padding_mask": buffer["padding"]})
        self.set_incremental_state(incremental_state, self._JOINT, {})

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search's reorder of the joint cache (the units' own caches and the Local
        Context Unit's window are reordered by their modules)."""
        buffer = self.get_incremental_state(incremental_state, self._JOINT)
        if not buffer or buffer.get("kv") is None:
            return
        length = buffer["kv"].size(2)
        buffer["kv_store"] = reordered_key_value_rows(buffer["kv_store"], length, new_order)
        buffer["kv"] = _steps_view(buffer["kv_store"], length)
        if buffer.get("padding") is not None:
            buffer["padding"] = buffer["padding"].index_select(0, new_order)
        self.set_incremental_state(incremental_state, self._JOINT, buffer)

    # ------------------------------------------------------------ the joint pass
    def _joint_pass_applies(self, r: Tensor, incremental_state, want_probs: bool,
                            attn_mask: Optional[Tensor] = None) -> bool:
        """Whether this pass computes both FI units as one call (:meth:`_joint_pass`):
        no incremental state, on a device of :data:`JOINT_PASS_DEVICES` where the
        projections are stacked (:func:`~.projections.stacks_projections`), nothing
        recorded or logged, a dtype of SDPA's fused kernels, no ``attn_mask`` that the
        units would apply (a causal unit ignores fairseq's future mask), and both units
        on the ``"auto"``, ``"sdpa"`` or ``"dense"`` path (``"eager"`` and ``"flex"`` keep
        theirs)."""
        queries, kv_global, kv_local = self._projection_pairs()
        return (incremental_state is None and r.device.type in JOINT_PASS_DEVICES and not want_probs
                and (attn_mask is None or self.causal) and r.dtype in STEP_DTYPES and not self.recording
                and all(core.attention_impl in ("auto", "sdpa", "dense") and not core.recording
                        for core in (self.fi_local, self.fi_global))
                and stacks_projections(r, queries + kv_global + kv_local))

    def _joint_pass(self, r: Tensor, lc: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """``[h_l; h_g]`` (``T x B x 2C``, eq. 7) of a pass without incremental state as
        one attention of 2H heads (the local unit's, then the global unit's): the
        queries ``[q_l; q_g]`` and the global unit's keys and values one product of
        r, the local unit's keys and values one product of lc, and one
        ``scaled_dot_product_attention`` call with the units' shared scale, padding,
        causality and attention dropout (:func:`~.kernels.sdpa.masked_attention`, as
        each unit's own call; in the encoder :func:`~.kernels.sdpa.padding_attention`,
        its float mask of the padding made once per pass for all layers and no row
        repaired; dropout drawn for the 2H heads at once: the same
        distribution as two draws, not the same numbers for a seed), whose merged
        heads are the concatenation of eq. 8. The queries are copied out of r's
        product, so that the fused call keeps ``2C`` values per token for them and not
        the whole ``4C`` product: the pass keeps as much for the backward pass as the
        units' own calls. Per module and training step: one fused
        call forward and one backward, and one mask, instead of two; the keys and
        values are concatenated instead of the outputs."""
        queries, kv_global, kv_local = self._projection_pairs()
        heads = self.num_heads
        # (split, not sliced: the backward pass puts the parts' gradients together in
        # one concatenation, where a slice's fills a zero tensor of the whole)
        from_r = stacked_projection(r, queries + kv_global)  # T x B x 4C
        q, k_g, v_g = split_heads(from_r, 4 * heads).split([2 * heads, heads, heads], dim=1)  # B x 2H x T x Dh, ...
        q = q.contiguous()
        k_l, v_l = split_heads(stacked_projection(lc, kv_local), 2 * heads).split(heads, dim=1)
        k, v = torch.cat([k_l, k_g], dim=1), torch.cat([v_l, v_g], dim=1)
        glob = self.fi_global
        dropout = glob.dropout_module.p if glob._dropout_active() else 0.0
        if not self.causal:
            # the mask is the sentences' padding alone, and every sentence has a real
            # token: no row is empty (with causality a left-padded target's would be)
            return merge_heads(padding_attention(q, k, v, key_padding_mask, dropout))
        blocked = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
        if blocked is not None:
            blocked = blocked | causal_mask(r.size(0), r.size(0), r.device)[None, None]
        return merge_heads(masked_attention(q, k, v, blocked, None, dropout, blocked is None))

    def _projections(self, r: Tensor, lc: Tensor):
        """The FI units' queries, keys and values (``T x B x C`` each) of a pass without
        incremental state, as two products instead of six: ``r`` times the stacked
        weights of the local unit's queries and the global unit's queries, keys and
        values, ``lc`` times those of the local unit's keys and values. The parameters
        stay the units' own; the backward pass then runs two products (and one
        gradient per input) where the separate projections ran six (and summed four
        gradients of ``r`` and two of ``lc``). Returns ``(local q, k, v), (global q, k,
        v)``, or ``(None, None)`` where :func:`~.projections.stacks_projections` says
        no (each unit projects its own then)."""
        queries, kv_global, from_lc = self._projection_pairs()
        from_r = queries + kv_global
        if not stacks_projections(r, from_r + from_lc):
            return None, None
        q_l, q_g, k_g, v_g = stacked_linear(r, from_r)
        k_l, v_l = stacked_linear(lc, from_lc)
        return (q_l, k_l, v_l), (q_g, k_g, v_g)

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = False,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """``query`` = r, ``T x B x C``; ``key_padding_mask`` ``B x T`` (cached steps not
        included in incremental decoding, as in fairseq). Returns ``(z_hat, None)``."""
        if static_kv or before_softmax:
            raise NotImplementedError("the DC module is a self-attention sublayer")
        if (key is not None and key is not query) or (value is not None and value is not query):
            raise ValueError("the DC module is a self-attention sublayer: key and value must be the query")
        r = query
        tgt_len = r.size(0)
        new_padding = None
        if key_padding_mask is not None:
            new_padding = query_part(key_padding_mask, tgt_len).bool()
        lc = self.local_context(r, new_padding, incremental_state)  # eq. 6
        if self._joint_step_applies(r, incremental_state, attn_mask):  # a step of beam search
            return self.aggregate(self._joint_step(r, lc, key_padding_mask, incremental_state)), None  # eq. 7-8
        if incremental_state is not None:
            self._hand_back_caches(incremental_state)
        if self._plain_step(r, incremental_state, attn_mask):  # a decoder step trained through
            h_l = attention_step(self.fi_local, r, lc, key_padding_mask, incremental_state)  # eq. 7
            h_g = attention_step(self.fi_global, r, r, key_padding_mask, incremental_state)
            return self.aggregate(torch.cat([h_l, h_g], dim=-1)), None  # eq. 8
        # validation forward passes only (not training, not inference, not decoding steps)
        want_probs = incremental_state is None and self.logging_metrics
        if self._joint_pass_applies(r, incremental_state, want_probs, attn_mask):
            return self.aggregate(self._joint_pass(r, lc, key_padding_mask)), None  # eq. 7-8
        local_proj, global_proj = self._projections(r, lc) if incremental_state is None else (None, None)
        h_l, p_l = self.fi_local(  # eq. 7, h_l = FI(r, lc): T x B x C
            r, lc, lc, key_padding_mask=key_padding_mask, incremental_state=incremental_state,
            need_weights=want_probs, need_head_weights=want_probs, attn_mask=attn_mask, projections=local_proj,
        )
        h_g, p_g = self.fi_global(  # eq. 7, h_g = FI(r, r): T x B x C
            r, r, r, key_padding_mask=key_padding_mask, incremental_state=incremental_state,
            need_weights=want_probs, need_head_weights=want_probs, attn_mask=attn_mask, projections=global_proj,
        )
        z_hat = self.aggregate(torch.cat([h_l, h_g], dim=-1))  # eq. 8: T x B x 2C -> T x B x C
        if self.recording or want_probs:
            query_padding = (
                new_padding if new_padding is not None else r.new_zeros(r.size(1), tgt_len, dtype=torch.bool)
            )
            self.record(QUERY_PADDING, query_padding)
            if want_probs:
                # H x B x Tq x Tk -> B x H x Tq x Tk
                js = reduced_js(p_l.float().transpose(0, 1), p_g.float().transpose(0, 1), "max")  # B x Tq
                keep = ~query_padding
                self.log_metric("js", (js * keep).sum() / keep.sum().clamp(min=1), weight=float(keep.sum()))
        return z_hat, None


# ---------------------------------------------------------------------- divergence
def js_divergence(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """Jensen-Shannon divergence between distributions along ``dim`` (eq. 11-12),
    natural log (bounded by ln 2)::

        JS(P || Q) = 1/2 KL(P || M) + 1/2 KL(Q || M),   M = (P + Q) / 2
        KL(P || Q) = sum_x P(x) log P(x) - sum_x P(x) log Q(x)

    ``0 log 0 = 0`` (``torch.xlogy``), so zero probabilities need no epsilon.
    """
    m = 0.5 * (p + q)
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(dim)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(dim)
    return 0.5 * kl_pm + 0.5 * kl_qm


def reduce_heads(probs: Tensor, how: str = "max") -> Tensor:
    """Eq. 10: one distribution per query from the H heads, ``B x H x Tq x Tk`` ->
    ``B x Tq x Tk``.

    ``max`` (the paper's ``alpha = max([alpha^1, ..., alpha^H])``, read as the
    element-wise maximum over heads, renormalised over the keys so that eq. 11 compares
    distributions); ``mean`` (average over heads). Rows that are all zero (queries with
    no visible key) stay zero.
    """
    if how == "max":
        reduced = probs.max(dim=1).values
        total = reduced.sum(-1, keepdim=True)
        return reduced / total.clamp(min=torch.finfo(reduced.dtype).tiny)
    if how == "mean":
        return probs.mean(dim=1)
    raise ValueError(f"head reduction {how!r}: allowed: max, mean")


def reduced_js(p_local: Tensor, p_global: Tensor, head_reduce: str = "max") -> Tensor:
    """``dv`` per query (eq. 10-11): ``B x H x Tq x Tk`` twice -> ``B x Tq``.

    ``head_reduce``: ``max``/``mean`` (:func:`reduce_heads`), or ``per_head`` (the mean
    over heads of the per-head divergences).
    """
    if head_reduce == "per_head":
        return js_divergence(p_local, p_global).mean(dim=1)
    if head_reduce not in HEAD_REDUCTIONS:
        raise ValueError(f"head reduction {head_reduce!r}: allowed: {', '.join(HEAD_REDUCTIONS)}")
    return js_divergence(reduce_heads(p_local, head_reduce), reduce_heads(p_global, head_reduce))
