"""The attention core every model of this package is built on.

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
  several *branches*. A branch is one softmax over those energies with its own boolean
  mask and/or additive bias (Gaussian localness, a band, a direction, ...):
  ``P_b = softmax(e + bias_b, masked by mask_b)`` (Yang et al. 2018, eq. 4; Xu et al. 2019,
  eq. 1-3; Song et al. 2019, eq. 8-12).
* A *fusion* (the :class:`~.fusion.Fusion` interface: sum, concatenation, and the
  papers' scalar and squeeze gates) combines the branch outputs ``P_b V`` before the
  output projection.
* Optional Shaw et al. (2018) relative position representations on keys and values,
  memory-linear in the sequence length (see :mod:`.relative_position`).

Positions are the *real* token positions: computed from ``key_padding_mask`` (so a
left-padded source sentence sees positions 0..I-1 whatever its padding), and
bottom-right aligned for queries (``query i`` of ``Tq`` sits at key index
``Tk - Tq + i``), so an incremental decoding step sees the same positions as the full
teacher-forced pass.

Numerics: masks are boolean and combined with ``|`` (no ``-inf`` planes are ever
summed); softmax runs in float32 whatever the input dtype; a query row that its masks
leave without any key (e.g. a padding query in a forward-only branch) gets an all-zero
distribution instead of NaN, in the forward and the backward pass.

Two paths compute the same thing and are tested against each other:
``eager`` (the readable reference: energies once, one float32 softmax per branch,
returns weights) and ``sdpa`` (one fused call per branch, the fusion applied to the
outputs as in the eager path), which applies in float32, float16 and bfloat16 to any
number of branches whenever no distribution is needed: not while a recorder is on,
and not when a one-branch attention is asked for its weights (nor, with attention
dropout, with Shaw et al.'s value term). Per branch, the fast path takes the
cheapest computation that gives the branch's distribution:

* a hard window narrower than the keys (a local pattern or a ``local<k>`` branch):
  the band of :mod:`.banded`, ``O(Tq x W)`` in time and memory;
* ``j <= i`` or ``j >= i`` (a forward or backward branch, the causal core's own
  mask) on a CPU without dropout: the CPU flash kernel with ``is_causal`` (on the
  reversed sequence for ``j >= i``) and the padding as a ``B x 1 x 1 x Tk`` mask;
* learned biases (Yang et al.'s Gaussian, Shaw et al.'s key and value terms) while
  training, without dropout: :mod:`.recompute`, which keeps nothing of size
  ``Tq x Tk`` for the backward pass and recomputes the bias per block of queries;
* an incremental step (one query row) of a window or of the global branch: the
  window's last keys by one product and softmax (:meth:`AttentionCore._step_branch`;
  with Shaw et al.'s terms alone,
  :meth:`~.relative_position.RelativePositions.step_attention`);
* anything else: ``torch.nn.functional.scaled_dot_product_attention`` with the
  branch's boolean mask and bias, drawing its own dropout.

A call per branch recomputes ``q k^T`` for every branch that is not a band (and again
in the backward pass) and keeps each branch's output (``B x H x Tq x Dh``) for the
backward pass instead of its distribution (``B x H x Tq x Tk``).
``attention_impl`` (:data:`ATTENTION_IMPLS`) chooses: ``"auto"`` takes the fast path
where it applies except where the eager path was measured to be as fast (several
float32 branches trained on a CPU with attention dropout or over at most
:data:`EAGER_MAX_KEYS` keys: :meth:`AttentionCore._use_sdpa`),
``"sdpa"`` wherever it applies, ``"eager"`` never; :func:`set_attention_impl` sets
it for a whole model, ``fairseq-localness-bench --attention-impl`` for the benchmark.

Masks that depend on ``j - i`` only (the causal mask, window branches, relative
position buckets) are computed from *index* distances and taken as views of a table
cached per device (:func:`distance_table`); :func:`distance_table` says why index
distances are the real-position distances wherever it matters.

No host synchronisation on accelerators: the shortcuts that inspect a mask's values
(dropping an all-False padding mask, skipping the empty-row repair when no row is
empty) run on CPU tensors only.
"""
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from fairseq.incremental_decoding_utils import with_incremental_state
from fairseq.modules.fairseq_dropout import FairseqDropout
from torch import Tensor, nn

from fairseq_localness.modules.banded import banded_attention
from fairseq_localness.modules.fusion import Fusion, MergeHeads, SumFusion, split_heads
from fairseq_localness.modules.observe import Observable, probs_key
from fairseq_localness.modules.recompute import recomputed_attention

# A float attn_mask value at or below this blocks the key (fairseq's encoder turns a
# boolean attn_mask into -1e8 in fp32 and -1e4 in fp16; its decoder uses -inf).
_BLOCKING_BIAS = -1e4


def _torch_version() -> Tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# From torch 2.5 on, F.scaled_dot_product_attention returns zeros, with zero
# gradients, for a query row whose keys are all masked (pytorch/pytorch#133882,
# "_safe_softmax"); before, such a row gave NaN. The fast path relies on it on CPUs,
# where tests/test_attention_core.py checks it; on accelerators (not checked here) and
# with older torch it repairs empty rows as the eager path does.
_SDPA_ZEROES_EMPTY_ROWS_ON_CPU = _torch_version() >= (2, 5)

# The settings of AttentionCore.attention_impl: "auto" (the fast path where it applies
# and pays), "sdpa" (the fast path wherever it applies), "eager" (the reference path).
ATTENTION_IMPLS = ("auto", "sdpa", "eager")

# "auto" keeps several float32 branches trained on a CPU on the eager path up to this
# many keys: there one q k^T shared by the branches and their small saved
# distributions cost less than a kernel call (and its backward pass) per branch.
# Measured with the benchmark (iwslt size, 2,048 tokens per step, 2 threads), training
# ratio / bound of HySAN e1 eager against the fast path: 0.964 / 0.917 at T = 32,
# 0.947 / 0.907 at T = 64, 0.937 / 0.934 at T = 128 (where the eager path keeps more);
# the fast path is ahead from T = 256 on.
EAGER_MAX_KEYS = 64


def set_attention_impl(model: nn.Module, impl: str) -> int:
    """Set ``attention_impl`` of every :class:`AttentionCore` in ``model``; returns how
    many cores were set. ``impl`` is one of :data:`ATTENTION_IMPLS`."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl {impl!r}: allowed: {', '.join(ATTENTION_IMPLS)}")
    cores = [m for m in model.modules() if isinstance(m, AttentionCore)]
    for core in cores:
        core.attention_impl = impl
    return len(cores)


# Half and single precision inputs the fast path takes (float64 stays on the reference).
_SDPA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class AttentionContext:
    """Everything a branch or a fusion may need to know about one attention call.

    Attributes:
        query_input: the layer input the queries come from, ``Tq x B x C``.
        q: projected queries before scaling, ``B x H x Tq x Dh``.
        k: projected keys (cached ones included), ``B x H x Tk x Dh``.
        key_padding_mask: ``B x Tk``, True at padding, or None.
        q_pos: real position of each query, ``B' x Tq`` (B' is B or 1), long.
        k_pos: real position of each key, ``B' x Tk``, long.
        lengths: ``I`` of Yang et al. (2018): how many real keys query i can see,
            ``B' x Tq`` float (the real sentence length, or i + 1 when causal).
        causal: True in decoder self-attention.
        self_attention: True when queries and keys are the same token positions
            (self-attention, or a core built with ``self_positions=True``).
    """

    query_input: Tensor
    q: Tensor
    k: Tensor
    key_padding_mask: Optional[Tensor]
    q_pos: Tensor
    k_pos: Tensor
    lengths: Tensor
    causal: bool
    self_attention: bool
    cache: Dict[str, Optional[Tensor]] = field(default_factory=dict)

    @property
    def bsz(self) -> int:
        return self.q.size(0)

    @property
    def num_heads(self) -> int:
        return self.q.size(1)

    @property
    def tgt_len(self) -> int:
        return self.q.size(2)

    @property
    def src_len(self) -> int:
        return self.k.size(2)

    def query_padding_mask(self) -> Optional[Tensor]:
        """``B x Tq``, True at the padding queries; None when no query is padding or
        the queries are not the key positions (encoder-decoder attention, whose
        queries the core knows nothing about).

        Queries are bottom-right aligned with the keys (query i of Tq sits at key
        index ``Tk - Tq + i``), so this is the last Tq columns of ``key_padding_mask``.
        """
        if not self.self_attention or self.key_padding_mask is None:
            return None
        return query_part(self.key_padding_mask, self.tgt_len)

    def query_keep(self) -> Optional[Tensor]:
        """``B x Tq``, True at the real (non-padding) queries, or None when every query
        is real (see :meth:`query_padding_mask`); computed once per attention call.
        Callers broadcast it as they need (``keep[:, None]`` for ``B x 1 x Tq``,
        ``keep.t().unsqueeze(-1)`` for ``Tq x B x 1``)."""
        if "query_keep" not in self.cache:
            padding = self.query_padding_mask()
            self.cache["query_keep"] = None if padding is None else ~padding
        return self.cache["query_keep"]

    def relative_distance(self) -> Tensor:
        """``j - i`` in real positions, ``B' x 1 x Tq x Tk`` (long), computed once per
        attention call and shared by its branches."""
        distance = self.cache.get("relative_distance")
        if distance is None:
            distance = (self.k_pos.unsqueeze(1) - self.q_pos.unsqueeze(2)).unsqueeze(1)
            self.cache["relative_distance"] = distance
        return distance


class AttentionBranch(nn.Module, Observable):
    """One distribution over the shared energies: an optional mask and bias.

    Subclasses override :meth:`mask` (boolean, True = blocked) and/or :meth:`bias`
    (additive, float32 or wider); both must broadcast to ``B x H x Tq x Tk``.
    """

    name = "global"

    def mask(self, ctx: AttentionContext) -> Optional[Tensor]:
        return None

    def bias(self, ctx: AttentionContext) -> Optional[Tensor]:
        return None

    def bias_terms(self, ctx: AttentionContext) -> Optional[list]:
        """The bias as terms ``(fn, inputs)`` of :func:`~.recompute.recomputed_attention`
        (``fn(inputs, i0, i1)`` is the bias of query rows ``i0 .. i1 - 1``, computed
        from the small tensors ``inputs``), so the fast path can recompute it per
        block of queries instead of keeping it; None (the default) where the branch
        has no learned bias (the fast path then uses :meth:`bias`)."""
        return None

    def hard_window(self, ctx: AttentionContext) -> Optional[Tuple[Optional[int], Optional[int]]]:
        """``(left, right)`` when this branch is exactly the index window
        ``-left <= j - i <= right`` (``None``: unbounded on that side) with no bias, so
        the fast path may compute it as a band (:mod:`.banded`) or with a causal
        kernel; None otherwise (the default: the fast path then uses :meth:`mask` and
        :meth:`bias`)."""
        return None


def query_part(key_aligned: Tensor, tgt_len: int) -> Tensor:
    """The entries of the Tq queries in a tensor over the keys (last dim Tk): queries
    are bottom-right aligned, query i of Tq is key ``Tk - Tq + i``. E.g. the query
    padding mask from a ``B x Tk`` key padding mask, or query positions from key
    positions."""
    return key_aligned[..., key_aligned.size(-1) - tgt_len :]


def _future(distance: Tensor) -> Tensor:
    return distance > 0


def causal_mask(tgt_len: int, src_len: int, device) -> Tensor:
    """Bottom-right aligned causal mask, ``Tq x Tk``, True where key j is in the future.

    Query i sits at key index ``Tk - Tq + i``; e.g. Tq = 2, Tk = 4::

        [[0, 0, 0, 1],
         [0, 0, 0, 0]]

    A read-only view of a cached table (:func:`distance_table`).
    """
    return distance_table("causal", _future, tgt_len, src_len, device)


# (key, device) -> N x N table of fn(b - a); see distance_table.
_DISTANCE_TABLES: Dict[Tuple[Hashable, torch.device], Tensor] = {}
# Tables grow (doubling) up to this many keys; longer sequences compute their mask
# directly (an N x N int64 table of relative-position buckets at N = 1024 is 8 MiB).
DISTANCE_TABLE_MAX = 1024


def distance_table(
    key: Hashable, fn: Callable[[Tensor], Tensor], tgt_len: int, src_len: int, device
) -> Tensor:
    """``fn(j - i)`` for bottom-right aligned query indices, ``Tq x Tk``: query i sits
    at key index ``Tk - Tq + i``, so the entry (i, j) is ``fn(j - (Tk - Tq + i))``.

    ``fn`` maps a tensor of index distances to a tensor of the same shape (a boolean
    mask, bucket indices); ``key`` names it (equal keys must mean equal functions).
    The result is a view into an ``N x N`` table ``fn(b - a)`` built once per
    ``(key, device)`` and reused by every call with ``Tk <= N`` (rows
    ``Tk - Tq .. Tk - 1``, columns ``0 .. Tk - 1``): nothing is computed per call, and
    an incremental decoding step gets its one row without building anything. The view
    is shared: callers must not write into it.

    Why index distances are enough. A mask or bias that depends on ``j - i`` in real
    token positions (positions among the non-padding tokens, :func:`real_positions`)
    gives the same values from index distances wherever a result is used:

    * fairseq pads a batch on one side (sources on the left by default, targets on
      the right), so the padding of a sequence is contiguous and every real token's
      index is its real position plus the same offset (the number of left pads): for
      two real tokens the index difference is the real-position difference;
    * padding keys are blocked by the padding mask whatever their distance;
    * a padding query may get other keys than with real positions, possibly none: its
      row is then empty and its output zero (no NaN, in the forward and the backward
      pass); padding outputs are never used (fairseq masks them out of the loss and
      out of every later layer's keys);
    * incremental decoding appends the new queries after the cached keys (bottom-right
      alignment), so one step sees the distances of the full teacher-forced pass.

    Tests: eager and fast paths agree on every row; a sentence alone equals the same
    sentence inside a left- or right-padded batch (tests/test_contract.py).
    """
    device = torch.device(device)
    if src_len > DISTANCE_TABLE_MAX:
        q_idx = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)
        return fn(torch.arange(src_len, device=device).unsqueeze(0) - q_idx)
    cache_key = (key, device)
    table = _DISTANCE_TABLES.get(cache_key)
    if table is None or table.size(1) < src_len:
        size = max(src_len, 64, 2 * table.size(1) if table is not None else 0)
        size = min(size, DISTANCE_TABLE_MAX)
        # built outside inference mode, so tables made during generation under
        # torch.inference_mode() can still be saved for a later backward pass
        with torch.inference_mode(False), torch.no_grad():
            idx = torch.arange(size, device=device)
            table = fn(idx.unsqueeze(0) - idx.unsqueeze(1))
        _DISTANCE_TABLES[cache_key] = table
    return table[src_len - tgt_len : src_len, :src_len]


def real_positions(key_padding_mask: Optional[Tensor], src_len: int, device) -> Tensor:
    """Position of each key among the real (non-padding) tokens, ``B' x Tk`` long.

    With left padding ``[pad, pad, a, b]`` gives ``[0, 0, 0, 1]`` (padding slots get 0;
    they are masked anyway).
    """
    if key_padding_mask is None:
        return torch.arange(src_len, device=device).unsqueeze(0)
    real = (~key_padding_mask).long()
    return (real.cumsum(-1) - 1).clamp_(min=0)


def at_least_float32(x: Tensor) -> Tensor:
    """Half precision goes up to float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def safe_masked_softmax(scores: Tensor, blocked: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    """Softmax (at least float32) over the last dim with blocked keys removed.

    Rows in which every key is blocked get an all-zero distribution: they are unblocked
    before the softmax (so no NaN appears, not even in the backward pass) and the
    caller zeroes their output with the returned ``row_empty`` (``... x Tq x 1``).
    """
    scores = at_least_float32(scores)
    if blocked is None:
        return torch.softmax(scores, dim=-1), None
    row_empty = empty_rows(blocked)
    if row_empty is not None:
        blocked = blocked & ~row_empty
    probs = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    return probs, row_empty


def one_row_softmax(scores: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """The distribution of one query row (energies ``B x H x 1 x Tk``; at least float32)
    without the padding keys (``key_padding_mask`` ``B x Tk``, True at padding); a row
    without keys gets 0 instead of NaN, with no host sync (incremental steps)."""
    scores = at_least_float32(scores)
    if key_padding_mask is None:
        return torch.softmax(scores, -1)
    return torch.softmax(scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf")), -1).nan_to_num(0.0)


def empty_rows(blocked: Tensor) -> Optional[Tensor]:
    """``... x Tq x 1``, True at the query rows in which every key is blocked, or None
    when there is no such row on a CPU (the common case: the caller then skips the
    repair, which would otherwise cost a mask update and two fills per branch)."""
    row_empty = blocked.all(dim=-1, keepdim=True)
    if row_empty.device.type != "cpu":
        return row_empty  # no host sync on accelerators: always repair
    return row_empty if bool(row_empty.any()) else None


def _combine(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    if a is None:
        return b
    if b is None:
        return a
    return a | b


@with_incremental_state
class AttentionCore(nn.Module, Observable):
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
        # which path computes the attention: one of ATTENTION_IMPLS (see _use_sdpa)
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
    def _get_input_buffer(self, incremental_state) -> Dict[str, Optional[Tensor]]:
        result = self.get_incremental_state(incremental_state, "attn_state")
        return result if result is not None else {}

    def _set_input_buffer(self, incremental_state, buffer: Dict[str, Optional[Tensor]]):
        return self.set_incremental_state(incremental_state, "attn_state", buffer)

    @torch.jit.export
    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Reorder every cached tensor (keys, values, padding, ...) for beam search."""
        buffer = self._get_input_buffer(incremental_state)
        if buffer:
            for key, value in buffer.items():
                if value is not None:
                    buffer[key] = value.index_select(0, new_order)
            incremental_state = self._set_input_buffer(incremental_state, buffer)
        return incremental_state

    # ------------------------------------------------------------------ forward
    def _project(self, query, key, value, key_padding_mask, incremental_state, static_kv):
        """Project and cache: returns q (unscaled), k, v as ``B x H x T x Dh`` and the
        key padding mask for all keys (cached included)."""
        tgt_len, bsz, _ = query.shape
        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        if saved is not None and static_kv and "prev_key" in saved:
            key = value = None  # encoder states are already projected and cached

        heads = self.num_heads
        q = split_heads(self.q_proj(query), heads)  # B x H x Tq x Dh
        if self.self_attention:
            k, v = split_heads(self.k_proj(query), heads), split_heads(self.v_proj(query), heads)
        elif key is None:
            k = v = None
        else:
            k, v = split_heads(self.k_proj(key), heads), split_heads(self.v_proj(value), heads)

        if saved is not None:
            prev_key, prev_value = saved.get("prev_key"), saved.get("prev_value")
            prev_kpm = saved.get("prev_key_padding_mask")
            if prev_key is not None:
                if static_kv:
                    k, v = prev_key, prev_value
                    key_padding_mask = prev_kpm if key_padding_mask is None else key_padding_mask
                else:
                    if prev_kpm is not None or key_padding_mask is not None:
                        prev_kpm = (
                            prev_kpm
                            if prev_kpm is not None
                            else prev_key.new_zeros(bsz, prev_key.size(2), dtype=torch.bool)
                        )
                        new_kpm = (
                            key_padding_mask.bool()
                            if key_padding_mask is not None
                            else prev_key.new_zeros(bsz, k.size(2), dtype=torch.bool)
                        )
                        key_padding_mask = torch.cat([prev_kpm.bool(), new_kpm], dim=1)
                    k = torch.cat([prev_key, k], dim=2)
                    v = torch.cat([prev_value, v], dim=2)
            saved["prev_key"], saved["prev_value"] = k, v
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.bool()
            # an all-False mask is dropped on a CPU only: on an accelerator the test
            # would wait for the device (a mask of zeros blocks nothing anyway)
            if key_padding_mask.device.type == "cpu" and not key_padding_mask.any():
                key_padding_mask = None
        return q, k, v, key_padding_mask

    def _context(self, query, q, k, key_padding_mask) -> AttentionContext:
        tgt_len, src_len = q.size(2), k.size(2)
        k_pos = real_positions(key_padding_mask, src_len, q.device)
        same_positions = self.self_attention or self.self_positions
        if same_positions:
            q_pos = query_part(k_pos, tgt_len)
        else:
            # Encoder-decoder attention: query positions are not source positions;
            # nothing in this package uses them there.
            q_pos = torch.arange(tgt_len, device=q.device).unsqueeze(0)
        if self.causal:
            lengths = (q_pos + 1).float()
        elif key_padding_mask is None:
            lengths = torch.full((1, tgt_len), float(src_len), device=q.device)
        else:
            lengths = (~key_padding_mask).sum(-1, keepdim=True).float().expand(-1, tgt_len)
        return AttentionContext(
            query_input=query,
            q=q,
            k=k,
            key_padding_mask=key_padding_mask,
            q_pos=q_pos,
            k_pos=k_pos,
            lengths=lengths,
            causal=self.causal,
            self_attention=same_positions,
        )

    def _base_mask(self, ctx: AttentionContext, attn_mask: Optional[Tensor]):
        """Padding and causality as one boolean ``B' x 1 x Tq x Tk`` mask, plus the soft
        (finite) part of a float ``attn_mask`` as a bias."""
        blocked = None
        soft = None
        if ctx.key_padding_mask is not None:
            blocked = ctx.key_padding_mask[:, None, None, :]
        if self.causal:
            if ctx.tgt_len > 1:
                causal = causal_mask(ctx.tgt_len, ctx.src_len, ctx.q.device)[None, None]
                if blocked is None and ctx.tgt_len == ctx.src_len:
                    ctx.cache["plain_causal"] = causal
                blocked = _combine(blocked, causal)
        elif attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                blocked = _combine(blocked, attn_mask[None, None])
            else:
                hard = attn_mask <= _BLOCKING_BIAS
                blocked = _combine(blocked, hard[None, None])
                soft = at_least_float32(attn_mask).masked_fill(hard, 0.0)[None, None]
        return blocked, soft

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
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """Same contract as fairseq's ``MultiheadAttention.forward``.

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
            query, key, value, key_padding_mask, incremental_state, static_kv
        )
        ctx = self._context(query, q, k, key_padding_mask)
        base_blocked, soft_bias = self._base_mask(ctx, attn_mask)
        ctx.cache["extra_mask"] = attn_mask is not None and not self.causal

        weights = None
        if self._use_sdpa(query, need_weights, ctx.src_len):
            if self.relative_positions is not None and self._dropout_active():
                # Shaw et al.'s key term only (no values): a float mask for SDPA
                key_term = self.relative_positions.key_scores(q * self.scaling, ctx)
                soft_bias = key_term if soft_bias is None else soft_bias + key_term
            # one fused call per branch, each with its own mask, bias and dropout
            outputs = [self._sdpa(ctx, v, branch, base_blocked, soft_bias) for branch in self.branches]
        else:
            q_scaled = q * self.scaling
            energies = torch.matmul(q_scaled, k.transpose(-1, -2))  # B x H x Tq x Tk
            if self.relative_positions is not None:  # computed once, shared by the branches
                energies = energies + self.relative_positions.key_scores(q_scaled, ctx)
            energies = at_least_float32(energies)
            if soft_bias is not None:
                energies = energies + soft_bias
            outputs = []
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

    def _use_sdpa(self, query: Tensor, need_weights: bool, src_len: int) -> bool:
        """Whether this call takes the fast path.

        The fast path applies to any number of branches in float32, float16 and
        bfloat16, unless a recorder wants the distributions, a one-branch attention is
        asked for its weights (several branches return none), or Shaw et al.'s value
        term is to be computed with attention dropout (only the eager path draws it
        on the distribution the value term needs). ``attention_impl`` then decides (see
        :data:`ATTENTION_IMPLS`):

        * ``"sdpa"``: the fast path wherever it applies;
        * ``"eager"``: the reference path always;
        * ``"auto"`` (default): the fast path where it applies, except for several
          float32 branches trained on a CPU *with attention dropout* or over at most
          :data:`EAGER_MAX_KEYS` keys. Without dropout the fast path computes hard
          windows as bands, forward and backward branches with the causal flash
          kernel and learned biases by recomputation (:meth:`_structured_branch`,
          :meth:`_recomputed_branch`), and trains faster than the eager path from
          about 128 keys on (HySAN at T = 256: 0.81 of the transformer's speed
          against 0.63; docs/benchmark.md); over fewer keys the eager path's one
          ``q k^T`` for all branches costs less than a kernel call per branch.
          With dropout (which the CPU flash kernel and the recomputation do not
          draw) the per-branch calls fall back to SDPA's reference kernel, where the
          eager path, computing ``q k^T`` once for all branches and reusing the saved
          distributions in its backward pass, was measured within a few percent of
          it. Without gradients, for one branch, in half precision and on
          accelerators the fast path is taken.
        """
        impl = self.attention_impl
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl {impl!r}: allowed: {', '.join(ATTENTION_IMPLS)}")
        if impl == "eager" or self.recording:
            return False
        if need_weights and len(self.branches) == 1:
            return False
        rel = self.relative_positions
        if rel is not None and rel.value_embeddings is not None and self._dropout_active():
            return False
        if query.dtype not in _SDPA_DTYPES:
            return False
        if (
            impl == "auto"
            and len(self.branches) > 1
            and query.dtype == torch.float32
            and query.device.type == "cpu"
            and torch.is_grad_enabled()
            and self.q_proj.weight.requires_grad
            and (self._dropout_active() or src_len <= EAGER_MAX_KEYS)
        ):
            return False
        return True

    def _branch_mask_and_bias(self, ctx, branch, base_blocked):
        blocked = _combine(base_blocked, branch.mask(ctx))
        return blocked, branch.bias(ctx)

    def _eager_branch(self, ctx, energies, v, branch, base_blocked):
        """Reference path: returns the branch output ``B x H x Tq x Dh`` and its
        distribution ``B x H x Tq x Tk`` (float32)."""
        blocked, bias = self._branch_mask_and_bias(ctx, branch, base_blocked)
        scores = energies if bias is None else energies + bias
        probs, row_empty = safe_masked_softmax(scores, blocked)
        dropped = self.dropout_module(probs)
        out = torch.matmul(dropped.to(v.dtype), v)
        if self.relative_positions is not None:
            out = out + self.relative_positions.value_output(dropped, ctx).to(v.dtype)
        if row_empty is not None:
            out = out.masked_fill(row_empty, 0.0)
            probs = probs.masked_fill(row_empty, 0.0)
        return out, probs

    def _effective_window(self, ctx, branch) -> Optional[Tuple[Optional[int], Optional[int]]]:
        """The branch's hard window (:meth:`AttentionBranch.hard_window`) with the
        core's causal bound applied (``right <= 0``), or None."""
        window = branch.hard_window(ctx)
        if window is None:
            return None
        left, right = window
        if self.causal:
            right = 0 if right is None else min(right, 0)
        return left, right

    def _recomputed_branch(self, ctx, v, branch, base_blocked, soft_bias) -> Optional[Tensor]:
        """A branch with learned biases (Yang et al. 2018's Gaussian, Shaw et al.
        2018's key and value terms) through :func:`~.recompute.recomputed_attention`,
        which keeps nothing of size ``Tq x Tk`` for the backward pass; None where it
        does not apply (attention dropout, which it does not draw; no learned bias;
        or no gradient and no value term, where SDPA takes the bias as a float mask
        and needs no backward pass)."""
        rel = self.relative_positions
        if self._dropout_active():
            return None
        terms = branch.bias_terms(ctx) if (torch.is_grad_enabled() or rel is not None) else None
        if terms is None and rel is None:
            return None
        terms = list(terms or [])
        if not terms:
            bias = branch.bias(ctx)
            if bias is not None:
                terms.append((_rows_term, (bias,)))
        if soft_bias is not None:
            terms.append((_rows_term, (soft_bias,)))
        branch_mask = branch.mask(ctx)
        if rel is not None and not terms and branch_mask is None and ctx.self_attention and ctx.tgt_len == 1:
            return rel.step_attention(ctx.q, ctx.k, v, self.scaling, ctx.key_padding_mask)
        blocked = _combine(base_blocked, branch_mask)
        if rel is None:
            return recomputed_attention(ctx.q, ctx.k, v, self.scaling, blocked, terms)
        return recomputed_attention(ctx.q, ctx.k, v, self.scaling, blocked, terms, rel.max_distance,
                                    rel.key_embeddings, rel.value_embeddings, self.causal)

    def _dropout_active(self) -> bool:
        return self.dropout_module.p > 0 and (self.training or self.dropout_module.apply_during_inference)

    def _structured_branch(self, ctx, v, window) -> Optional[Tensor]:
        """A branch whose keys are a hard index window, without a ``Tq x Tk`` mask:

        * both sides bounded and the window narrower than the keys: the band of
          :func:`~.banded.banded_attention`, ``O(Tq x W)``;
        * ``j <= i`` (a forward branch, or the causal core's own mask): the CPU flash
          kernel with ``is_causal`` (it skips the blocks above the diagonal) and the
          padding as a ``B x 1 x 1 x Tk`` additive mask;
        * ``j >= i`` (a backward branch, Song et al. 2019, eq. 9): the same on the
          reversed sequence (``j >= i`` is ``j' <= i'`` for ``i' = T - 1 - i``).

        The two flash cases apply on a CPU without attention dropout (the CPU kernel
        has none) to full passes (``Tq = Tk``). Returns None where none applies (the
        caller then uses the branch's mask)."""
        left, right = window
        tgt_len, src_len = ctx.tgt_len, ctx.src_len
        if left is not None and right is not None:
            if left + right + 1 >= src_len:
                return None
            dropout = self.dropout_module if self._dropout_active() else None
            return banded_attention(ctx.q, ctx.k, v, self.scaling, left, right, ctx.key_padding_mask, dropout)
        if (
            _CPU_FLASH is None
            or not _SDPA_ZEROES_EMPTY_ROWS_ON_CPU
            or ctx.q.device.type != "cpu"
            or tgt_len != src_len
            or tgt_len == 1
            or self._dropout_active()
        ):
            return None
        if left is None and right == 0:
            return _CPU_FLASH(ctx.q, ctx.k, v, 0.0, True, attn_mask=_padding_bias(ctx), scale=self.scaling)[0]
        if left == 0 and right is None:
            flip = lambda t: t.flip(2)  # noqa: E731
            bias = _padding_bias(ctx)
            bias = None if bias is None else bias.flip(-1)
            out = _CPU_FLASH(flip(ctx.q), flip(ctx.k), flip(v), 0.0, True, attn_mask=bias, scale=self.scaling)[0]
            return flip(out)
        return None

    def _step_branch(self, ctx, v, left: Optional[int]) -> Tensor:
        """One query row (an incremental step, the query at the last key position, or
        a one-token pass) over the keys ``j >= Tk - 1 - left`` (all for ``left`` None):
        the energies of the last ``left + 1`` keys, a float32 softmax and one product,
        as fairseq's own attention computes a step. (The fused kernels' per-call cost
        exceeds the arithmetic of one row.) A row without keys gives 0."""
        k, kpm = ctx.k, ctx.key_padding_mask
        if left is not None and left + 1 < ctx.src_len:
            k, v = k[:, :, -(left + 1) :], v[:, :, -(left + 1) :]
            kpm = None if kpm is None else kpm[:, -(left + 1) :]
        probs = one_row_softmax(torch.matmul(ctx.q, k.transpose(-1, -2)) * self.scaling, kpm)  # B x H x 1 x W
        return torch.matmul(probs.to(v.dtype), v)

    def _sdpa(self, ctx, v, branch, base_blocked, soft_bias):
        """Fast path for one branch: ``F.scaled_dot_product_attention`` with the
        branch's mask and bias, ``B x H x Tq x Dh`` in the input dtype.

        * ``is_causal`` only for the plain causal mask (no padding, no bias, Tq = Tk),
          where top-left and bottom-right alignment coincide and the fused kernel skips
          the masked blocks; SDPA refuses an explicit ``attn_mask`` together with
          ``is_causal=True``, so a biased or windowed branch keeps the causal mask
          inside its own mask.
        * A bias goes in as a float mask of the input dtype with ``-inf`` at blocked
          keys. In float16 the bias is first shifted by its (detached) maximum over
          each row's visible keys, which leaves the softmax unchanged, and floored at
          float16's lowest finite value: a bias far below -65504 (a Gaussian window
          near 0 with ``min_window=0``) would otherwise overflow to ``-inf`` and empty
          its row, where the float32 reference still has a distribution.
        * Empty rows: on a CPU torch >= 2.5 returns zeros for them; elsewhere they are
          repaired as in the eager path (unblocked, output zeroed; on a CPU only when
          a row is empty, on an accelerator always, without waiting for the device).
        """
        out = self._recomputed_branch(ctx, v, branch, base_blocked, soft_bias)
        if out is not None:
            return out
        plain = soft_bias is None and not ctx.cache.get("extra_mask")
        one_row = plain and ctx.tgt_len == 1 and not self._dropout_active()
        if plain:
            window = self._effective_window(ctx, branch)
            if window is not None:
                out = self._step_branch(ctx, v, window[0]) if one_row else self._structured_branch(ctx, v, window)
                if out is not None:
                    return out
        blocked, bias = self._branch_mask_and_bias(ctx, branch, base_blocked)
        if one_row and bias is None and blocked is base_blocked:  # no mask or bias of its own: e.g. cross-attention
            return self._step_branch(ctx, v, None)
        if soft_bias is not None:
            bias = soft_bias if bias is None else bias + soft_bias
        row_empty = None
        mask = None
        is_causal = False
        if bias is None and blocked is not None and blocked is ctx.cache.get("plain_causal"):
            blocked, is_causal = None, True
        if blocked is not None and not (_SDPA_ZEROES_EMPTY_ROWS_ON_CPU and ctx.q.device.type == "cpu"):
            row_empty = empty_rows(blocked)  # no host sync on accelerators: always repairs there
            if row_empty is not None:
                blocked = blocked & ~row_empty
        if bias is not None:
            mask = _half_safe_bias(bias, blocked, ctx.q.dtype)
            if blocked is not None:
                mask = mask.masked_fill(blocked, float("-inf"))
        elif blocked is not None:
            mask = ~blocked
        out = F.scaled_dot_product_attention(
            ctx.q,
            ctx.k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout_module.p if self.dropout_module.apply_during_inference or self.training else 0.0,
            is_causal=is_causal,
        )
        if row_empty is not None:
            out = out.masked_fill(row_empty, 0.0)
        return out


def _rows_term(inputs, i0: int, i1: int) -> Tensor:
    """A bias term given whole (``... x Tq x Tk``, or broadcast over the queries)."""
    bias = inputs[0]
    return bias if bias.size(-2) == 1 else bias[..., i0:i1, :]


# The CPU flash attention kernel behind F.scaled_dot_product_attention, called directly
# where the core needs ``is_causal`` together with a padding mask (SDPA refuses an
# explicit mask with ``is_causal``; the kernel takes both). None where torch lacks it.
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def _padding_bias(ctx: AttentionContext) -> Optional[Tensor]:
    """The key padding mask as an additive ``B x 1 x 1 x Tk`` mask of the query dtype
    (``-inf`` at padding), once per attention call; None without padding."""
    if ctx.key_padding_mask is None:
        return None
    if "padding_bias" not in ctx.cache:
        bias = torch.zeros(ctx.key_padding_mask.shape, dtype=ctx.q.dtype, device=ctx.q.device)
        ctx.cache["padding_bias"] = bias.masked_fill_(ctx.key_padding_mask, float("-inf"))[:, None, None]
    return ctx.cache["padding_bias"]


def _half_safe_bias(bias: Tensor, blocked: Optional[Tensor], dtype: torch.dtype) -> Tensor:
    """``bias`` in ``dtype`` for SDPA's float mask. float16: shifted by the detached
    row maximum over the visible keys (softmax is shift invariant per row, and the
    shift's gradient is zero) and floored at the lowest finite float16, so no visible
    key overflows to ``-inf``; bfloat16 and float32 have float32's range and are cast."""
    if dtype != torch.float16:
        return bias.to(dtype)
    with torch.no_grad():
        visible = bias if blocked is None else bias.masked_fill(blocked, float("-inf"))
        shift = visible.amax(dim=-1, keepdim=True)
        shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    low = torch.finfo(torch.float16).min
    return (bias - shift).clamp(min=low).to(dtype)
