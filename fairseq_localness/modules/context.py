"""What a branch and a fusion see of one attention call, and the masks and softmax
the core, its branches and its kernels build with.

Shape notation as in :mod:`.attention`: B = batch size, H = heads, Tq = query length,
Tk = key length, Dh = head dimension.

* :class:`AttentionContext`: one call's queries, keys, padding and positions.
  Positions are the *real* token positions: computed from ``key_padding_mask`` (so a
  left-padded source sentence sees positions 0..I-1 whatever its padding), and
  bottom-right aligned for queries (``query i`` of ``Tq`` sits at key index
  ``Tk - Tq + i``), so an incremental decoding step sees the same positions as the
  full teacher-forced pass.
* :class:`AttentionBranch`: one softmax over the energies shared by the core's
  branches, with its own boolean mask and/or additive bias (Yang et al. 2018, eq. 4;
  Xu et al. 2019, eq. 1-3; Song et al. 2019, eq. 8-12).
* Masks are boolean, True where a key is blocked, and combined with ``|``
  (:func:`combine_masks`; no ``-inf`` planes are ever summed): the call's own
  (padding, causality, a fairseq ``attn_mask``: :func:`base_mask`) with each
  branch's (:meth:`AttentionBranch.mask_and_bias`). Masks that depend on
  ``j - i`` only (the causal mask, window branches, relative position buckets) are
  views of a table cached per device (:func:`distance_table`), which also says why
  index distances are the real-position distances wherever it matters.
* The softmax runs in float32 whatever the input dtype (:func:`at_least_float32`); a
  query row that its masks leave without any key gets an all-zero distribution
  instead of NaN, in the forward and the backward pass (:func:`safe_masked_softmax`,
  :func:`one_row_softmax`). No host synchronisation on accelerators: the test for an
  empty row (:func:`empty_rows`) inspects a mask's values on CPU tensors only.
"""
import functools
import weakref
from collections import OrderedDict
from typing import Callable, Dict, Hashable, Optional, Tuple

import torch
from torch import Tensor, nn

from fairseq_localness.modules.observe import Observable
from fairseq_localness.modules.scores import DenseScore, Description, Window


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
        cache: what the call computes once for all its branches.
        bsz, num_heads, tgt_len, src_len: B, H, Tq and Tk.

    ``q_pos``, ``k_pos`` and ``lengths`` are computed on first use
    (:func:`real_positions`) and kept in ``cache``: only Yang et al.'s Gaussian and
    masks over real positions outside self-attention read them, so a call of windows
    and directions alone (HySAN, the hybrid, the Dual Contextual module) launches no
    kernel for them. Given to the constructor, they are used as they are.
    """

    def __init__(self, query_input: Tensor, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor],
                 causal: bool, self_attention: bool, q_pos: Optional[Tensor] = None,
                 k_pos: Optional[Tensor] = None, lengths: Optional[Tensor] = None):
        self.query_input, self.q, self.k = query_input, q, k
        self.key_padding_mask = key_padding_mask
        self.causal, self.self_attention = causal, self_attention
        self.cache: Dict[str, Optional[Tensor]] = {}
        # positions or lengths of the caller's own: nothing derived from them is shared (of_mask)
        self._positions_given = any(value is not None for value in (q_pos, k_pos, lengths))
        for name, value in (("q_pos", q_pos), ("k_pos", k_pos), ("lengths", lengths)):
            if value is not None:
                self.cache[name] = value
        # B, H, Tq and Tk, read once from the projected queries and keys
        self.bsz, self.num_heads, self.tgt_len = q.shape[:3]
        self.src_len = k.size(2)

    @property
    def k_pos(self) -> Tensor:
        if "k_pos" not in self.cache:
            padding = self.key_padding_mask
            self.cache["k_pos"] = (real_positions(None, self.src_len, self.q.device) if padding is None else
                                   of_mask(padding, "k_pos", lambda: real_positions(padding, self.src_len, None)))
        return self.cache["k_pos"]

    def shared(self, name: Hashable, make: Callable[[], Tensor]) -> Tensor:
        """``make()``, shared through :func:`of_mask` by the layers of a pass that take
        this call's padding mask; without a mask, by every call of the same lengths,
        kind of attention and device (:func:`_unpadded`: the positions and lengths are
        then those of the lengths alone); made for this call alone where the call was
        given positions or lengths of the caller's own (``make`` may read them).
        ``name`` must say everything else ``make`` depends on (e.g. Tq, a dtype)."""
        if self._positions_given:
            return make()
        if self.key_padding_mask is None:
            return _unpadded((name, self.tgt_len, self.src_len, self.self_attention, self.causal, self.q.device),
                             make)
        return of_mask(self.key_padding_mask, name, make)

    def k_pos_as(self, dtype: torch.dtype) -> Tensor:
        """:attr:`k_pos` in ``dtype`` (the Gaussian's key positions), shared like it by
        the layers of a pass (:meth:`shared`)."""
        key = f"k_pos_{dtype}"
        if key not in self.cache:
            self.cache[key] = self.shared(("k_pos", dtype), lambda: self.k_pos.to(dtype))
        return self.cache[key]

    @property
    def q_pos(self) -> Tensor:
        if "q_pos" not in self.cache:
            if self.self_attention:
                self.cache["q_pos"] = query_part(self.k_pos, self.tgt_len)
            else:
                # Encoder-decoder attention: query positions are not source positions;
                # nothing in this package uses them there.
                self.cache["q_pos"] = torch.arange(self.tgt_len, device=self.q.device).unsqueeze(0)
        return self.cache["q_pos"]

    @property
    def lengths(self) -> Tensor:
        if "lengths" not in self.cache:
            tgt_len, padding = self.tgt_len, self.key_padding_mask
            if self.causal:
                lengths = (self.q_pos + 1).float()
            elif padding is None:
                lengths = _unpadded(("lengths", tgt_len, self.src_len, self.q.device),
                                    lambda: torch.full((1, tgt_len), float(self.src_len), dtype=torch.float32,
                                                       device=self.q.device))
            else:
                lengths = of_mask(padding, "lengths", lambda: (~padding).sum(-1, keepdim=True).float())
                lengths = lengths.expand(-1, tgt_len)
            self.cache["lengths"] = lengths
        return self.cache["lengths"]

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
            self.cache["query_keep"] = None if padding is None else of_mask(
                self.key_padding_mask, ("query_keep", self.tgt_len), lambda: ~padding)
        return self.cache["query_keep"]

    def query_weights(self, transposed: bool = False) -> Optional[Tensor]:
        """The real queries as weights that sum to 1 (``1 / count`` at each, 0 at
        padding), ``B x Tq`` float32 (``Tq x B`` where ``transposed``), or None when
        every query is real: a metric's mean over the real tokens is one product with
        them (:func:`~.observe.weighted_means`). Shared by the layers of a pass."""
        keep = self.query_keep()
        if keep is None:
            return None

        def weights():
            counts = keep.sum(dtype=torch.float32).clamp(min=1.0)
            return keep.float().div_(counts)

        made = of_mask(self.key_padding_mask, ("query_weights", self.tgt_len), weights)
        if transposed:
            made = of_mask(self.key_padding_mask, ("query_weights_t", self.tgt_len), lambda: made.t().contiguous())
        return made

    def relative_distance(self) -> Tensor:
        """``j - i`` in real positions, ``B' x 1 x Tq x Tk`` (long), computed once per
        attention call and shared by its branches."""
        distance = self.cache.get("relative_distance")
        if distance is None:
            distance = (self.k_pos.unsqueeze(1) - self.q_pos.unsqueeze(2)).unsqueeze(1)
            self.cache["relative_distance"] = distance
        return distance


class AttentionBranch(nn.Module, Observable):
    """One distribution over the shared energies, described once as data
    (:meth:`describe`: a window, score terms, a mask given whole; see
    :mod:`.scores`), which the eager reference evaluates densely
    (:meth:`mask_and_bias`) and the kernels their own way (:mod:`.kernels`).

    Subclasses override :meth:`describe`, or :meth:`mask` (boolean, True = blocked)
    and/or :meth:`bias` (additive, float32 or wider; both broadcastable to ``B x H x
    Tq x Tk``), which the default description gives whole.
    """

    name = "global"
    #: whether, in self-attention, :meth:`describe` gives a window and nothing else
    #: (which the kernels may compute together with other windows)
    window_alone = False

    def mask(self, ctx: AttentionContext) -> Optional[Tensor]:
        return None

    def bias(self, ctx: AttentionContext) -> Optional[Tensor]:
        return None

    def describe(self, ctx: AttentionContext) -> Description:
        """This branch's distribution in this call, as data (:class:`~.scores.Description`).
        The default: :meth:`mask` and :meth:`bias` given whole."""
        bias = self.bias(ctx)
        return Description(mask=self.mask(ctx), scores=() if bias is None else (DenseScore(bias),))

    def mask_and_bias(self, ctx: AttentionContext, base_blocked: Optional[Tensor]):
        """The branch's mask joined to the call's own (padding, causality:
        ``base_blocked``, returned itself where the branch has no mask) and its bias,
        both dense (the eager reference's)."""
        return dense_mask_and_bias(ctx, self.describe(ctx), base_blocked)


def window_mask(ctx: AttentionContext, window: Window) -> Optional[Tensor]:
    """A window's mask over index distances, ``1 x 1 x Tq x Tk``: a view of the table
    cached per ``(left, right, device)`` (:func:`distance_table`); None when the window
    is unbounded."""
    if not window.bounded:
        return None
    key = ("window", window.left, window.right)
    return distance_table(key, window.blocked, ctx.tgt_len, ctx.src_len, ctx.q.device)[None, None]


def dense_mask_and_bias(ctx: AttentionContext, description: Description, base_blocked: Optional[Tensor]):
    """A description's mask joined to ``base_blocked`` (returned itself where the
    description blocks nothing) and its summed score terms, as dense tensors."""
    own = description.mask
    if description.window is not None:
        own = combine_masks(own, window_mask(ctx, description.window))
    return combine_masks(base_blocked, own), description.dense_bias(ctx.src_len)


def query_part(key_aligned: Tensor, tgt_len: int) -> Tensor:
    """The entries of the Tq queries in a tensor over the keys (last dim Tk): queries
    are bottom-right aligned, query i of Tq is key ``Tk - Tq + i``. E.g. the query
    padding mask from a ``B x Tk`` key padding mask, or query positions from key
    positions."""
    return key_aligned[..., key_aligned.size(-1) - tgt_len :]


def real_positions(key_padding_mask: Optional[Tensor], src_len: int, device) -> Tensor:
    """Position of each key among the real (non-padding) tokens, ``B' x Tk`` long.

    With left padding ``[pad, pad, a, b]`` gives ``[0, 0, 0, 1]`` (padding slots get 0;
    they are masked anyway). Without padding ``0 .. Tk - 1``, cached per length and
    device (:func:`_arange`): do not write into it.
    """
    if key_padding_mask is None:
        return _arange(src_len, torch.device(device))
    real = (~key_padding_mask).long()
    return (real.cumsum(-1) - 1).clamp_(min=0)


@functools.lru_cache(maxsize=64)
def _arange(length: int, device: torch.device) -> Tensor:
    with torch.inference_mode(False):  # cached: usable by a later pass with gradients
        return torch.arange(length, device=device).unsqueeze(0)


# What :func:`of_mask` computed, per padding mask: id -> (a weak reference to the mask,
# what the entries depend on besides it, {name: tensor})
_OF_MASK: Dict[int, tuple] = {}


def of_mask(mask: Tensor, name: Hashable, make: Callable[[], Tensor]) -> Tensor:
    """``make()``, a tensor that depends only on the padding mask ``mask``, computed
    once per mask and ``name`` and kept while the mask lives.

    fairseq hands each layer of a pass the same padding mask (its encoder's, the
    source's to every encoder-decoder attention), so what a call derives from it (the
    real positions, the sentence lengths, the real queries: a few kernels each) is
    computed by the first layer and read by the others: on a GPU, whose Transformer-base
    step is bound by its launches, kernels saved. An entry is dropped when its mask is
    freed, and not used after the mask is written into (its version counter) or in
    another inference mode; a mask made under ``torch.inference_mode`` (which has no
    version counter) is not kept. The tensors made are shared: do not write into them."""
    if mask.is_inference():  # (written in place without a version counter: not kept)
        return make()
    key = id(mask)
    state = (mask._version, torch.is_inference_mode_enabled())
    entry = _OF_MASK.get(key)
    if entry is None or entry[0]() is not mask or entry[1] != state:
        ref = weakref.ref(mask, lambda _ref, key=key: _OF_MASK.pop(key, None)
                          if _OF_MASK.get(key, (None,))[0] is _ref else None)
        entry = (ref, state, {})
        _OF_MASK[key] = entry
    made = entry[2]
    if name not in made:
        made[name] = make()
    return made[name]


# What :func:`_unpadded` computed: (key, inference mode) -> tensor, the _UNPADDED_SIZE
# most recently used
_UNPADDED: "OrderedDict[Hashable, Tensor]" = OrderedDict()
_UNPADDED_SIZE = 2048


def _unpadded(key: Hashable, make: Callable[[], Tensor]) -> Tensor:
    """``make()``, a tensor that depends only on ``key`` (lengths, the kind of attention,
    a device, a name: calls without a padding mask), computed once per key and
    inference mode, without gradients, and kept (the ``_UNPADDED_SIZE`` most recently
    used). fairseq sorts its batches by length, so many have no padding: what the
    layers derive from their positions then costs its kernels once per shape instead
    of once per layer and step. The tensors made are shared: do not write into them."""
    key = (key, torch.is_inference_mode_enabled())
    made = _UNPADDED.get(key)
    if made is None:
        with torch.no_grad():
            made = make()
        _UNPADDED[key] = made
        if len(_UNPADDED) > _UNPADDED_SIZE:
            _UNPADDED.popitem(last=False)
    else:
        _UNPADDED.move_to_end(key)
    return made


def build_context(query: Tensor, q: Tensor, k: Tensor, key_padding_mask: Optional[Tensor], causal: bool,
                  same_positions: bool) -> AttentionContext:
    """The context of one call. Its real key positions, query positions (the keys' last
    Tq when ``same_positions``: self-attention, or keys of their own standing at the
    query positions) and ``I`` of Yang et al. (2018) per query are computed when first
    read (:class:`AttentionContext`)."""
    return AttentionContext(query_input=query, q=q, k=k, key_padding_mask=key_padding_mask, causal=causal,
                            self_attention=same_positions)


# A float attn_mask value at or below this blocks the key (fairseq's encoder turns a
# boolean attn_mask into -1e8 in fp32 and -1e4 in fp16; its decoder uses -inf).
_BLOCKING_BIAS = -1e4


def base_mask(ctx: AttentionContext, attn_mask: Optional[Tensor]) -> Tuple[Optional[Tensor], Optional[Tensor]]:
    """The call's own mask, before any branch's: padding and causality as one boolean
    ``B' x 1 x Tq x Tk`` mask (or None), and the soft (finite) part of a float
    ``attn_mask`` as a bias (or None). Notes in ``ctx.cache`` the plain causal mask
    (``"plain_causal"``: no padding, ``Tq = Tk``) and whether the call has an
    ``attn_mask`` of its own (``"extra_mask"``), which the fast path's choice of kernel
    reads."""
    blocked = None
    soft = None
    if ctx.key_padding_mask is not None:
        blocked = ctx.key_padding_mask[:, None, None, :]
    if ctx.causal:
        if ctx.tgt_len > 1:
            causal = causal_mask(ctx.tgt_len, ctx.src_len, ctx.q.device)[None, None]
            if blocked is None and ctx.tgt_len == ctx.src_len:
                ctx.cache["plain_causal"] = causal
            blocked = combine_masks(blocked, causal)
    elif attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            blocked = combine_masks(blocked, attn_mask[None, None])
        else:
            hard = attn_mask <= _BLOCKING_BIAS
            blocked = combine_masks(blocked, hard[None, None])
            soft = at_least_float32(attn_mask).masked_fill(hard, 0.0)[None, None]
    ctx.cache["extra_mask"] = attn_mask is not None and not ctx.causal
    return blocked, soft


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
    key: Hashable, fn: Callable[[Tensor], Tensor], tgt_len: int, src_len: int, device, width: Optional[int] = None
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
    token positions (positions among the non-padding tokens,
    :func:`real_positions`) gives the same values from index distances
    wherever a result is used:

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

    The table's side is a multiple of 8, so the rows of the view lie a multiple of 8
    elements apart and start there (what SDPA's memory-efficient kernel on CUDA wants
    of a mask); ``width`` (at least ``src_len``, at most ``src_len`` rounded up to a
    multiple of 8) takes that many columns instead of ``src_len``.
    """
    device = torch.device(device)
    width = src_len if width is None else width
    if src_len > DISTANCE_TABLE_MAX:
        q_idx = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1)
        return fn(torch.arange(width, device=device).unsqueeze(0) - q_idx)
    cache_key = (key, device)
    table = _DISTANCE_TABLES.get(cache_key)
    if table is None or table.size(1) < width:
        size = max(width, 64, 2 * table.size(1) if table is not None else 0)
        size = min(aligned_width(size), DISTANCE_TABLE_MAX)
        # built outside inference mode, so tables made during generation under
        # torch.inference_mode() can still be saved for a later backward pass
        with torch.inference_mode(False), torch.no_grad():
            idx = torch.arange(size, device=device)
            table = fn(idx.unsqueeze(0) - idx.unsqueeze(1))
        _DISTANCE_TABLES[cache_key] = table
    return table[src_len - tgt_len : src_len, :width]


def aligned_width(length: int) -> int:
    """``length`` rounded up to a multiple of 8: the width of a mask's or a bias's rows
    that SDPA's memory-efficient kernel on CUDA takes as they are (rows that start at
    multiples of 16 bytes in half precision; it pads and copies others)."""
    return -(-length // 8) * 8


def distance_table_storages() -> set:
    """The storages (their ``data_ptr``) of the cached distance tables: constants that a
    call's masks are views of, not activations of the call that saves them."""
    return {table.untyped_storage().data_ptr() for table in _DISTANCE_TABLES.values()}


def at_least_float32(x: Tensor) -> Tensor:
    """Half precision goes up to float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


# torch's CPU softmax over the last dimension runs one vector of its kernel per step (16
# float32 lanes with AVX-512, 8 with AVX2 and without SIMD): a row shorter than one
# vector takes a scalar path. Measured here (AVX-512, one thread, 32 x 4 x 2 rows):
# 54 us at 12 keys and 67 us at 15, against 6.5 us at 16; four whole-tensor operations
# took 17.5 and 19.9 us (with AVX2, forced by ATEN_CPU_CAPABILITY=avx2: 35.5 against 13.9
# us at 7 keys, 4.5 against 14.3 at 8). A beam search's first steps have that few keys.
def _cpu_vector_width() -> int:
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", lambda: "DEFAULT")()
    return 16 if capability == "AVX512" else 8


_CPU_SOFTMAX_VECTOR = _cpu_vector_width()


def softmax_last(scores: Tensor) -> Tensor:
    """``torch.softmax(scores, -1)``; on a CPU, for rows of 2 to one vector's width
    less one entries (:data:`_CPU_SOFTMAX_VECTOR`) and without gradients, the same
    ``exp(x - max) / sum`` in four whole-tensor operations, which skip torch's scalar
    path for short rows. A row of ``-inf`` alone gives NaN either way."""
    size = scores.size(-1)
    if (
        scores.device.type != "cpu"
        or not 1 < size < _CPU_SOFTMAX_VECTOR
        or (scores.requires_grad and torch.is_grad_enabled())
    ):
        return torch.softmax(scores, -1)
    exp = torch.sub(scores, scores.amax(-1, keepdim=True)).exp_()
    return exp.div_(exp.sum(-1, keepdim=True))


def safe_masked_softmax(scores: Tensor, blocked: Optional[Tensor]) -> Tuple[Tensor, Optional[Tensor]]:
    """Softmax (at least float32) over the last dim with blocked keys removed.

    Rows in which every key is blocked get an all-zero distribution: they are unblocked
    before the softmax (so no NaN appears, not even in the backward pass) and the
    caller zeroes their output with the returned ``row_empty`` (``... x Tq x 1``).
    """
    scores = at_least_float32(scores)
    if blocked is None:
        return softmax_last(scores), None
    row_empty = empty_rows(blocked)
    if row_empty is not None:
        blocked = blocked & ~row_empty
    probs = softmax_last(scores.masked_fill(blocked, float("-inf")))
    return probs, row_empty


def one_row_softmax(scores: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
    """The distribution of one query row (energies ``B x H x 1 x Tk``; at least float32)
    without the padding keys (``key_padding_mask`` ``B x Tk``, True at padding); a row
    without keys gets 0 instead of NaN, with no host sync (incremental steps)."""
    scores = at_least_float32(scores)
    if key_padding_mask is None:
        return softmax_last(scores)
    return softmax_last(scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))).nan_to_num(0.0)


def empty_rows(blocked: Tensor) -> Optional[Tensor]:
    """``... x Tq x 1``, True at the query rows in which every key is blocked, or None
    when there is no such row on a CPU (the common case: the caller then skips the
    repair, which would otherwise cost a mask update and two fills per branch)."""
    row_empty = blocked.all(dim=-1, keepdim=True)
    if row_empty.device.type != "cpu":
        return row_empty  # no host sync on accelerators: always repair
    return row_empty if bool(row_empty.any()) else None


def combine_masks(a: Optional[Tensor], b: Optional[Tensor]) -> Optional[Tensor]:
    """``a | b`` for two boolean masks (True = blocked), either of which may be None
    (nothing blocked); returns ``a`` or ``b`` itself where the other is None."""
    if a is None:
        return b
    if b is None:
        return a
    return a | b

