"""A branch's description (:mod:`~fairseq_localness.modules.scores`) as one fused
FlexAttention call (``torch.nn.attention.flex_attention``): the window and causality
as a block mask (the kernel skips the blocks outside it), padding and every score
term inside one ``score_mod``.

Shape notation as in :mod:`~fairseq_localness.modules.attention`; K = Shaw et al.'s
clipping distance, R = 2K + 1. Queries ``q`` are unscaled ``B x H x Tq x Dh`` and
bottom-right aligned (query ``q_idx`` sits at key index ``q' = q_idx + Tk - Tq``).

The score function, for ``d = kv_idx - q'``::

    score + (k_pos[b, kv] - P[b, h, q])^2 * c[b, h, q]      Yang et al. 2018, eq. 5; c = -1 / (2 sigma^2)
          + table[b, h, q, clip(d, -K, K) + K]              Shaw et al. 2018, eq. 4 (q w^K / sqrt(Dh))
          + bias[b, h, q, kv]                               a bias given whole (a float attn_mask)
    -inf where key_padding_mask[b, kv]

and the mask function ``-left <= d <= right`` (a window; causality is ``right <= 0``).

How it is called, and why (the pitfalls met on an H200, issue 38):

* The function that builds the ``score_mod`` closure, :func:`_attend`, is defined once
  here and compiled on CUDA once per kind of call (:func:`_kernel`, :func:`variant`);
  every per-call tensor (centres, coefficients, the bucket table, the padding, the
  geometry ``left, right, Tk - Tq, K``) is an argument, captured by the closure as a
  buffer. A closure made anew per call, or one capturing Python numbers, would
  compile again for every call or every value; the geometry's numbers are separate
  0-d tensors, not one vector that the functions index (``geometry[2]`` inside a
  score or mask function traces into an index tensor of its own, a constant of the
  compiled graph, and a graph with constants on the GPU is one that AOTAutograd cannot
  cache on disk: the H200 logged "unable to serialize" for every graph, so every new
  process compiled each kind again, 8-24 s each); here only the presence of each term
  (``None`` or not), the dtypes, the grad mode and a call's Python constants (the
  number of branches of :func:`flex_windows`, its fusion's function and flags) select
  a compiled graph, each kind under its own code object (one rel_pos model reached dynamo's limit of 8 graphs
  per code object, past which a ``fullgraph=True`` call raises), with dynamic shapes
  from the first call.
* A captured tensor that needs gradients is indexed once per score: ``P[b, h, q]``
  and ``c[b, h, q]`` once each, ``c = -1 / (2 sigma^2)`` computed outside the score
  function.
* On CUDA the captured tensors of a term given by a prologue (Yang et al.'s P and c
  from the queries, eq. 6-9; Shaw et al.'s table, eq. 4) are computed within the same
  compiled call, before the fused call (:func:`_attend_after_prologue`), each kind
  checked once against torch's reference implementation (:func:`_prologue_problem`).
* The backward pass of a table bias runs out of shared memory with the default
  blocks: a call with Shaw et al.'s table passes :data:`TABLE_KERNEL_OPTIONS`.
* Block masks depend only on the window and the lengths, never on the batch: they are
  cached (:func:`_block_mask`); padding goes into the score function instead.

Shaw et al.'s value term, ``z_i += sum_j alpha_ij w^V_{clip(d, -K, K) + K}``, is no
score: it needs each row's probability mass per bucket. The call returns the row's
log-sum-exp (``return_lse``); the 2K - 1 buckets with ``|d| < K`` are the band
around the diagonal, whose probabilities ``exp(s_ij - lse_i)`` are recomputed
(energies ``q k^T`` in float32, gathered at the band, plus the same score terms); the
far-left bucket (``d <= -K``) is ``exp(lse^left_i - lse_i)`` from a second call masked
to ``d <= -K`` (in causal attention, where the far right is empty, it is the rest of
the row's mass and no second call is made), and the far right the rest of the row's
mass. Cost: one float32 ``q k^T`` (``B x H x Tq x Tk``, not kept for the backward
pass), a gather of ``B x H x Tq x (2K - 1)``, one more fused call outside causal
attention, and element-wise work (:func:`_value_term`): about a hundred small
operations forward and backward, which Inductor fuses into a few kernels (for the
CPU it makes 22 of them, ``tests/test_flex_path.py``); gradients flow through the
log-sum-exp into the fused call's own backward pass. The calls and the value term are
one compiled function (:func:`_attend_with_value_term`), called once per sublayer.

No attention dropout (the kernel draws none): :mod:`.choice` sends calls with dropout
elsewhere. On a CPU, torch (2.13) runs the call's forward pass without compiling
(its reference implementation) and refuses its backward pass: :mod:`.choice` takes it
there only without gradients, which is how most tests run it against the eager
reference; within :func:`~.emulation.cuda_paths_on_cpu` (tests) the CPU takes CUDA's
paths and the reference implementation's backward pass too.
"""
import functools
import logging
import types
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from fairseq_localness.modules.context import AttentionContext
from fairseq_localness.modules.fusion import FusedOutput
from fairseq_localness.modules.scores import BucketScore, Description, GaussianScore, ValueTerm, Window

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch < 2.5
    create_block_mask = flex_attention = None
try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # torch < 2.9: return_lse
    AuxRequest = None

logger = logging.getLogger(__name__)

# Shaw et al.'s table bias: the blocks with which its backward pass fits in shared
# memory (issue 38, measured on an H200: the default blocks ran out of it).
TABLE_KERNEL_OPTIONS = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 1}

# The kernel options of every fused call that has none of its own (None: Inductor's
# defaults; Shaw et al.'s table keeps TABLE_KERNEL_OPTIONS). A switch for measurements:
# scripts/gpu_attention_probe.py's ``blocks`` variant sets SMALL_BLOCKS here.
KERNEL_OPTIONS = None

# An unbounded side of a window, in the geometry.
_UNBOUNDED = 1 << 30


# Devices where the call is compiled into Triton kernels, and the smallest head
# dimension those take: Inductor's lowering of the call raises for a head dimension
# under 16 ("NYI: embedding dimension of the query, key, and value must be at least
# 16": Triton's tl.dot needs 16), which with ``fullgraph=True`` fails the call.
TRITON_DEVICES = ("cuda",)
MIN_HEAD_DIM = 16


def available() -> bool:
    """Whether this torch has FlexAttention."""
    return flex_attention is not None


def supports(q: Tensor) -> bool:
    """Whether the fused call can compute attention for the queries ``q``
    (``B x H x Tq x Dh``): FlexAttention in this torch, and on a device where the call
    is compiled into Triton kernels (:data:`TRITON_DEVICES`), ``Dh >= 16``
    (:data:`MIN_HEAD_DIM`)."""
    return available() and (q.device.type not in TRITON_DEVICES or q.size(-1) >= MIN_HEAD_DIM)


def _attend(q, k, v, scale, block_mask, padding, centre, coeff, k_pos, table, geometry, bias, return_lse,
            kernel_options, gqa=False):
    """One fused call; every tensor the score function reads is an argument (see the
    module docstring). ``geometry``: ``(left, right, Tk - Tq, K)``, 0-d long tensors
    (:func:`_geometry`). ``gqa``:
    ``q`` has a group of query heads per head of ``k`` and ``v`` (:func:`flex_windows`)."""

    offset, clip = geometry[2], geometry[3]

    def score_mod(score, b, h, q_idx, kv_idx):
        if centre is not None:  # Yang et al. 2018, eq. 5
            dist = k_pos[b, kv_idx] - centre[b, h, q_idx]
            score = score + dist * dist * coeff[b, h, q_idx]
        if table is not None:  # Shaw et al. 2018, eq. 4
            bucket = torch.clamp(kv_idx - q_idx - offset, -clip, clip) + clip
            score = score + table[b, h, q_idx, bucket]
        if bias is not None:
            score = score + bias[b, h, q_idx, kv_idx]
        if padding is not None:
            score = torch.where(padding[b, kv_idx], float("-inf"), score)
        return score

    if not return_lse:
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              kernel_options=kernel_options, enable_gqa=gqa)
    if AuxRequest is None:
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, return_lse=True,
                              kernel_options=kernel_options, enable_gqa=gqa)
    out, aux = flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                              kernel_options=kernel_options, return_aux=AuxRequest(lse=True), enable_gqa=gqa)
    return out, aux.lse


# Where :func:`_attend` is compiled, and by which ``torch.compile`` backend; elsewhere
# it runs uncompiled (torch's reference implementation of the call; forward only on
# a CPU). The tests add ``"cpu": "eager"`` to trace it with dynamo on a CPU (the
# tracing and the guards, without Inductor's kernels).
COMPILE_BACKENDS = {"cuda": "inductor"}


def variant(q: Tensor, block_mask, padding, centre, table, bias, return_lse: bool, kernel_options,
            gqa: bool = False) -> tuple:
    """What selects a compiled graph of :func:`_attend` besides shapes: the dtypes, the
    grad mode, which arguments are present, the log-sum-exp, the kernel options and
    grouped query heads; and the two sizes dynamo specializes even with dynamic shapes
    (:func:`_specialized`)."""
    return _kind(q, (block_mask, padding, centre, table, bias, kernel_options), (bool(return_lse), bool(gqa)))


def _kind(q: Tensor, optional, flags) -> tuple:
    """The key of a kind of call of a compiled function (:func:`variant`,
    :func:`_with_value_term`): ``q``'s dtype, the grad mode, which ``optional``
    arguments are present, the Python ``flags`` and :func:`_specialized`."""
    return ((str(q.dtype), torch.is_grad_enabled()) + tuple(a is not None for a in optional) + tuple(flags)
            + _specialized(q))


def _specialized(q: Tensor) -> tuple:
    """The sizes of ``q`` (``B x H x Tq x Dh``) that dynamo compiles a graph of their
    own for even with dynamic shapes: the query heads ``H`` (``H L`` with grouped heads
    given to :func:`_attend`; :func:`flex_windows` also puts L in its kind's flags:
    HySAN's and the hybrid's sublayers differ in L), and a batch of one sentence (its
    0/1 specialization). Part of a kind's key, they give each such graph a budget of
    its own: under one code object, HySAN sublayers of 2 to 5 branches, each with a
    batch of 3 sentences and of 1, reached dynamo's limit of 8 graphs (with
    ``fullgraph=True``, a ``FailOnRecompileLimitHit`` error)."""
    return (q.size(1), q.size(0) == 1)


# Whether a kind of call is compiled with dynamic shapes from its first call (see
# :func:`_compiled`); False compiles a graph per shape, for measuring what dynamic
# shapes cost the kernels (``scripts/gpu_attention_probe.py``'s ``static`` variant).
DYNAMIC_SHAPES = True

# Devices where a fusion's epilogue (:meth:`~fairseq_localness.modules.fusion.Fusion.epilogue`)
# runs within the fused call of the branches (:func:`flex_windows`): CUDA, where each
# operator outside a compiled call is a launch of its own. Elsewhere, and with it empty
# (``scripts/gpu_attention_probe.py``'s ``apart`` variant), the fusion runs after the call.
EPILOGUE_DEVICES = ("cuda",)

# Devices where a score term's prologue (:class:`~fairseq_localness.modules.scores.Prologue`:
# Yang et al.'s P and sigma predicted from the queries, and the means the branch logs)
# runs within the fused call that reads the term (:func:`_attend_after_prologue`): CUDA,
# where each operator outside a compiled call is a launch of its own. Elsewhere the
# term's tensors are computed before the call, as every other kernel reads them.
PROLOGUE_DEVICES = ("cuda",)

# Inductor's options for the compiled calls (``torch.compile``'s ``options``; None: its
# defaults), for measuring what they change on a GPU: ``scripts/gpu_attention_probe.py``'s
# ``cpp`` variant sets ``{"cpp_wrapper": True}`` (the kernels of a compiled call launched
# from generated C++ instead of Python: less host time per call, where a step is bound
# by its host) and its ``graphs`` variant ``{"triton.cudagraphs": True}`` (each call
# replayed as a CUDA graph, recorded per shape). Not measured on a GPU yet.
INDUCTOR_OPTIONS = None

# (function name, variant, backend, dynamic shapes, Inductor's options) -> the compiled
# function (:func:`_compiled`)
COMPILED = {}


def _compiled(key: tuple, backend: str, function=_attend):
    """``function`` (default :func:`_attend`) compiled for one kind of call ``key``
    (:func:`variant`), under a code object of its own.

    dynamo keeps its compiled graphs per code object, at most ``recompile_limit``
    (8) of them, and with ``fullgraph=True`` a call past the limit raises. One model
    makes several kinds of call (with and without a Gaussian, a bucket table, a block
    mask, the log-sum-exp; each in training and under ``no_grad`` for validation and
    beam search), the default compiles each kind twice (static shapes first, then
    dynamic ones when fairseq's next batch changes B or T), and a process may hold
    several models (the benchmark): with one code object, one rel_pos model traced
    on a CPU reached 8 graphs in its third batch, without gradients. Here each kind
    has its own code object and compiles with dynamic shapes from the first call
    (``dynamic=True``).
    """
    dynamic = DYNAMIC_SHAPES
    options = dict(INDUCTOR_OPTIONS) if INDUCTOR_OPTIONS and backend == "inductor" else None
    options_key = None if options is None else tuple(sorted(options.items()))
    compiled = COMPILED.get((function.__name__, key, backend, dynamic, options_key))
    if compiled is None:
        name = function.__name__ + "_" + "_".join(str(part) for part in key).replace("torch.", "").replace(".", "_")
        name += ("" if dynamic else "_static") + ("" if options is None else "_options")
        code = function.__code__.replace(co_name=name, co_qualname=name)
        copy = types.FunctionType(code, function.__globals__, name, function.__defaults__, function.__closure__)
        compiled = torch.compile(copy, fullgraph=True, dynamic=dynamic, backend=backend, options=options)
        COMPILED[(function.__name__, key, backend, dynamic, options_key)] = compiled
    return compiled


def _kernel(device: torch.device, key: tuple, function=_attend):
    """The call of ``function`` (default :func:`_attend`) for one kind of call ``key``
    on ``device``: compiled where :data:`COMPILE_BACKENDS` names a backend (called
    through :func:`_call_compiled`), else the function itself, uncompiled."""
    backend = COMPILE_BACKENDS.get(device.type)
    return function if backend is None else functools.partial(_call_compiled, _compiled(key, backend, function))


class _DuckSizingOff:
    """Within it, torch's duck sizing is off (``torch.fx.experimental._config.
    use_duck_shape``, private, a per-thread setting; where torch lacks it, nothing
    changes). The setting is written and restored directly, the value it had kept by
    this object, one per call: the config module's own ``patch`` builds a class per
    call, which cost a fused call 16 us of its host time (this CPU)."""

    __slots__ = ("saved",)

    def __enter__(self):
        if _fx_config is not None:
            self.saved = _fx_config.use_duck_shape
            _fx_config.use_duck_shape = False
        return self

    def __exit__(self, *exc):
        if _fx_config is not None:
            _fx_config.use_duck_shape = self.saved
        return False


try:  # torch's switch for duck sizing (private; absent: the default, duck sizing on)
    from torch.fx.experimental import _config as _fx_config

    if not hasattr(_fx_config, "use_duck_shape"):  # pragma: no cover - every torch this package supports has it
        _fx_config = None
except ImportError:  # pragma: no cover
    _fx_config = None


def _no_duck_sizing() -> _DuckSizingOff:
    return _DuckSizingOff()


def _call_compiled(compiled, *args):
    """``compiled(*args)`` such that a kind of call keeps one graph whatever the layout
    its inputs come from.

    * A tensor that is a view (q, k and v are views of their projections, whose own
      layout differs: a 3-D output in the first layer, a view of a 2-D product after,
      a stacked product on CUDA) goes in as an alias without view tracking
      (``aten._unsafe_view``: no copy, gradients flow): dynamo guards a view input's
      base, so every new base layout compiled the kind again (HySAN e1, traced on the
      CPU over 5 batches: 6 second compiles, "k._base.size()[0] == q.size()[2]",
      "tuple index out of range").
    * Dynamo traces it without duck sizing: with it, two sizes equal at the first call
      (the batch and a window table's L entries; a base's length and the queries') are
      one symbol, and the first call where they differ compiles again.

    Each compile of a fused call took 8 to 24 s on an H200."""
    args = tuple(torch.ops.aten._unsafe_view(a, a.shape) if isinstance(a, Tensor) and a._base is not None else a
                 for a in args)
    with _no_duck_sizing():
        return compiled(*args)


# Kinds of call (the compiled function's name and its kind key, :func:`variant` or
# :func:`_kind`, without kernel options) whose backward pass ran out of the GPU's shared
# memory with the default blocks, and which take SMALL_BLOCKS instead; and the kinds
# checked (:func:`_call_kind`).
SMALL_BLOCKS = TABLE_KERNEL_OPTIONS
_NEED_SMALL_BLOCKS = set()
_CHECKED = set()


def _fused_call(q, k, v, scale, block_mask, padding, centre, coeff, k_pos, table, geometry, bias, return_lse,
                options, gqa=False):
    """:func:`_attend` for one call, by the kernel of its kind (:func:`_kernel`,
    :func:`_call_kind`)."""

    def key_of(options):
        return variant(q, block_mask, padding, centre, table, bias, return_lse, options, gqa)

    def args_of(options):
        return (q, k, v, scale, block_mask, padding, centre, coeff, k_pos, table, geometry, bias, return_lse, options,
                gqa)

    return _call_kind(_attend, q, key_of, args_of, options)


def _call_kind(function, q: Tensor, key_of, args_of, options):
    """``function(*args_of(options))`` by the kernel of its kind ``key_of(options)``.

    The first call of a kind with gradients on a device where it is compiled into
    Triton kernels runs once more, forward and backward, on detached copies of its
    inputs: where that runs out of shared memory (the backward pass of Shaw et al.'s
    table did with the default blocks on an H200, issue 38; a learned Gaussian at a
    head dimension of 128 has not been measured), the kind takes :data:`SMALL_BLOCKS`
    from then on, with a warning, instead of failing in the training step's backward
    pass. Any other error is raised."""
    key = key_of(options)
    name = function.__name__
    if options is None and (name, key) not in _NEED_SMALL_BLOCKS and (name, key) not in _CHECKED \
            and torch.is_grad_enabled() and q.device.type in COMPILE_BACKENDS and q.device.type in TRITON_DEVICES:
        _CHECKED.add((name, key))
        if not _fits(_kernel(q.device, key, function), args_of(None)):
            logger.warning("FlexAttention: a kind of call ran out of shared memory with the default blocks; "
                           "it takes kernel_options=%s from now on", SMALL_BLOCKS)
            _NEED_SMALL_BLOCKS.add((name, key))
    if options is None and (name, key) in _NEED_SMALL_BLOCKS:
        options = SMALL_BLOCKS
        key = key_of(options)
    return _kernel(q.device, key, function)(*args_of(options))


def _fits(function, args) -> bool:
    """Whether ``function(*args)`` runs forward and backward (on detached copies of the
    float tensors, those that need gradients again needing them) without running out of
    the GPU's shared memory; any other error is raised."""
    try:
        _forward_backward(function, args)
        return True
    except Exception as error:  # noqa: BLE001 - sorted below: only this one is caught
        if _out_of_shared_memory(error):
            return False
        raise


def _forward_backward(function, args):
    """``function(*copies)`` on :func:`_detached_copies` of ``args``, and the backward
    pass of the sum of the squares of its float outputs that need gradients (tensors
    anywhere in nested tuples); returns the result and the copies, which hold the
    gradients."""
    copies = _detached_copies(args)
    result = function(*copies)
    total = sum(out.float().square().sum() for out in _tensors(result) if out.requires_grad)
    if isinstance(total, Tensor):
        total.backward()
    return result, copies


def _tensors(result):
    """The tensors of ``result``: a tensor, or nested tuples holding tensors and None."""
    if isinstance(result, Tensor):
        yield result
    elif isinstance(result, tuple):
        for part in result:
            yield from _tensors(part)


def _detached_copies(args) -> list:
    """``args`` with each float tensor detached, needing gradients where it did; a
    parameter stays a parameter (``nn.Parameter``): dynamo guards an input's type, so
    a plain tensor in a parameter's place would compile the kind a second time."""
    return [(torch.nn.Parameter(a.detach(), requires_grad=a.requires_grad) if isinstance(a, torch.nn.Parameter)
             else a.detach().requires_grad_(a.requires_grad)) if isinstance(a, Tensor) and a.is_floating_point() else a
            for a in args]


def _out_of_shared_memory(error: BaseException) -> bool:
    """Whether ``error`` or one it was raised from is Triton's "out of resource: shared
    memory" (``triton.runtime.errors.OutOfResources``), as Inductor passes it on."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = f"{type(error).__name__}: {error}".lower()
        if "outofresources" in text or ("out of resource" in text and "shared memory" in text):
            return True
        error = error.__cause__ or error.__context__
    return False


@functools.lru_cache(maxsize=256)
def _geometry(left: Optional[int], right: Optional[int], offset: int, k: int,
              device: torch.device) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(left, right, Tk - Tq, K)`` as four 0-d long tensors (an unbounded side:
    :data:`_UNBOUNDED`), cached: data of the score and mask functions, which read them
    without indexing (see the module docstring)."""
    left = _UNBOUNDED if left is None else left
    right = _UNBOUNDED if right is None else right
    with torch.inference_mode(False):  # cached: usable by a later pass with gradients
        return tuple(torch.tensor(x, dtype=torch.long, device=device) for x in (left, right, offset, k))


def _window_mask_mod(geometry: Tuple[Tensor, ...]):
    left, right, offset = geometry[:3]

    def mask_mod(b, h, q_idx, kv_idx):
        d = kv_idx - q_idx - offset
        return (d >= -left) & (d <= right)

    return mask_mod


@functools.lru_cache(maxsize=256)
def _block_mask(left: Optional[int], right: Optional[int], tgt_len: int, src_len: int, device: torch.device):
    """The block mask of the window ``-left <= d <= right``, cached per window, lengths
    and device; None for an unbounded window."""
    if left is None and right is None:
        return None
    geometry = _geometry(left, right, src_len - tgt_len, 0, device)
    with torch.inference_mode(False):
        return create_block_mask(_window_mask_mod(geometry), None, None, tgt_len, src_len, device=device)


def _empty(window: Window, tgt_len: int, src_len: int) -> bool:
    """Whether no query has a key in ``window`` (``left + right < 0``, or out of range)."""
    left = src_len if window.left is None else window.left
    right = src_len if window.right is None else window.right
    offset = src_len - tgt_len
    return left + right < 0 or -left > src_len - 1 - offset or right < -(offset + tgt_len - 1)


class _Terms:
    """The score terms of one call, as the arguments of :func:`_attend`; a term given by
    a prologue (:class:`~fairseq_localness.modules.scores.Prologue`) on a device of
    :data:`PROLOGUE_DEVICES` is computed within the call (:meth:`run`)."""

    def __init__(self, ctx: AttentionContext, description: Description, call_scores, padding):
        bsz, heads, tgt_len, src_len = ctx.bsz, ctx.num_heads, ctx.tgt_len, ctx.src_len
        self.centre = self.coeff = self.k_pos = self.table = self.bias = None
        self.k = 0
        self.within = []  # (slot, term): the terms whose prologue runs within the call
        self.has_table = False
        dense = []
        within = ctx.q.device.type in PROLOGUE_DEVICES
        for term in tuple(description.scores) + tuple(call_scores):
            if isinstance(term, GaussianScore) and self.k_pos is None:
                self._take("centre", term, within)
                self.k_pos = term.k_pos.expand(bsz, src_len)
            elif isinstance(term, BucketScore) and not self.has_table:
                self.has_table, self.k = True, term.k
                self._take("table", term, within)
            elif isinstance(term, BucketScore):
                dense.append(term.dense(src_len))
            else:
                dense.append(term.dense())
        if description.mask is not None:
            mask = description.mask
            blocked = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
            dense.append(blocked.masked_fill_(mask, float("-inf")))
        if dense:
            bias = dense[0]
            for term in dense[1:]:
                bias = bias + term
            self.bias = bias.expand(bsz, heads, tgt_len, src_len)
        self.padding = padding

    def _take(self, slot: str, term, within: bool):
        """The term in its slot of the call's arguments (``"centre"``: P and the
        coefficient; ``"table"``): within the call where it has a prologue not yet run
        and ``within`` says so, else its tensors."""
        if within and term.prologue is not None and not term.computed:
            self.within.append((slot, term))
        elif slot == "centre":
            self.centre, self.coeff = term.call_values(*term.values())
        else:
            (self.table,) = term.call_values(*term.values())

    def _outside(self):
        """Every term's tensors computed before the call (their prologues run here)."""
        within, self.within = self.within, []
        for slot, term in within:
            self._take(slot, term, False)

    def options(self, q: Tensor):
        """The kernel options of the call: :data:`TABLE_KERNEL_OPTIONS` with a bucket
        table on CUDA, else :data:`KERNEL_OPTIONS` (None: the default blocks)."""
        return TABLE_KERNEL_OPTIONS if (self.has_table and q.device.type == "cuda") else KERNEL_OPTIONS

    def window(self, window: Window, tgt_len: int, src_len: int, device: torch.device):
        """The block mask and the geometry of ``window`` for a call of these terms."""
        return (_block_mask(window.left, window.right, tgt_len, src_len, device),
                _geometry(window.left, window.right, src_len - tgt_len, self.k, device))

    def call(self, q, k, v, scale, window: Window, return_lse: bool):
        block_mask, geometry = self.window(window, q.size(2), k.size(2), q.device)

        def key_of(options):
            return variant(q, block_mask, self.padding, self.centre, self.table, self.bias, return_lse, options)

        def args_of(options):
            return (q, k, v, scale, block_mask, self.padding, self.centre, self.coeff, self.k_pos, self.table,
                    geometry, self.bias, return_lse, options)

        return self.run(_attend, {"centre": 6, "table": 9}, q, key_of, args_of, self.options(q))

    def run(self, function, slots: dict, q, key_of, args_of, options):
        """``function(*args_of(options))`` by the kernel of its kind (:func:`_call_kind`);
        with terms whose prologue runs within the call, those prologues first, in the
        same compiled call (:func:`_attend_after_prologue`; ``slots``: the position of
        each slot's first argument, ``"centre"`` and ``"table"``), and the stats they
        give reported to their branches. A kind of call that fails its check (once per
        kind and grad mode where it is compiled, :meth:`_check`) computes the
        prologues before the call instead, in training and without gradients."""
        within = self.within
        if not within:
            return _call_kind(function, q, key_of, args_of, options)
        prologues = [term.prologue for _, term in within]
        specs = tuple((p.function, p.flags, len(p.tensors), slots[slot], type(term).call_values)
                      for p, (slot, term) in zip(prologues, within))
        tensors = tuple(t for p in prologues for t in p.tensors)

        def prologue_key(options):
            named = tuple((fn.__name__, flags, tuple(t is not None for t in p.tensors), at)
                          for (fn, flags, _, at, _), p in zip(specs, prologues))
            return key_of(options) + (function.__name__, named)

        def prologue_args(options):
            args = args_of(options)
            return (function, len(args), specs, *args, *tensors)

        kind = prologue_key(options)
        verdict = kind  # one verdict for a kind in training and without gradients: its key in training
        if not torch.is_grad_enabled():
            with torch.enable_grad():
                verdict = prologue_key(options)
        if kind not in _PROLOGUE_CHECKED and verdict not in _PROLOGUE_OUTSIDE \
                and q.device.type in COMPILE_BACKENDS:
            self._check(kind, verdict, q, prologue_key, prologue_args, options)
        if verdict in _PROLOGUE_OUTSIDE:
            self._outside()
            return _call_kind(function, q, key_of, args_of, options)
        result, stats = _call_kind(_attend_after_prologue, q, prologue_key, prologue_args, options)
        for prologue, stat in zip(prologues, stats):
            if stat is not None and prologue.report is not None:
                prologue.report(stat)
        return result

    @staticmethod
    def _check(kind, verdict, q, prologue_key, prologue_args, options):
        """The check of a kind of call with prologues within (:func:`_prologue_problem`),
        once per kind and grad mode (without gradients, of the outputs alone); a kind
        that fails it joins :data:`_PROLOGUE_OUTSIDE` under ``verdict``, its key in
        training, which it then shares with its calls without gradients. The kind
        counts as checked once there is a verdict (a GPU out of memory, which fairseq's
        trainer may survive by skipping the batch, leaves it unchecked). Where it ran
        with the default blocks, its verdict on shared memory stands for
        :func:`_call_kind`'s check too."""
        problem, tried = None, []
        for blocks in ((options,) if options is not None else (None, SMALL_BLOCKS)):
            tried.append(blocks)
            problem = _prologue_problem(_kernel(q.device, prologue_key(blocks), _attend_after_prologue),
                                        prologue_args(blocks))
            if problem != _SHARED_MEMORY:
                break
        _PROLOGUE_CHECKED.add(kind)
        if options is None and torch.is_grad_enabled() and problem is None:
            name, key = _attend_after_prologue.__name__, prologue_key(None)
            _CHECKED.add((name, key))
            if len(tried) == 2:  # out of shared memory with the default blocks, not with SMALL_BLOCKS
                _NEED_SMALL_BLOCKS.add((name, key))
        if problem is not None:
            logger.warning("FlexAttention: a kind of call with a score term's prologue within it failed its check "
                           "(%s); that kind computes its prologues before the call from now on", problem)
            _PROLOGUE_OUTSIDE.add(verdict)


# Kinds of call with a prologue within (:meth:`_Terms.run`) checked, and those whose
# check failed (by their key in training), which compute the prologues before the call.
_PROLOGUE_CHECKED = set()
_PROLOGUE_OUTSIDE = set()


def _attend_after_prologue(function, count: int, specs: tuple, *inputs):
    """``function(*args)`` for the first ``count`` of ``inputs``, with the arguments of
    each score term given by a prologue computed first: per term ``(prologue, flags,
    n, at, call_values)`` of ``specs``, ``prologue(q, *tensors, *flags)`` (``q`` the
    first argument, ``tensors`` its ``n`` of the rest of ``inputs``, in order;
    :class:`~fairseq_localness.modules.scores.Prologue`) gives the term's tensors,
    and ``call_values`` of them go in from position ``at``. One function, compiled as
    one call, so that the prologues' products and element-wise steps (Yang et al.'s
    eq. 6-9 and the means the branch logs; Shaw et al.'s key term, eq. 4) run within
    the call instead of before it. Returns ``(function's result, each prologue's
    stats)``."""
    args, rest = list(inputs[:count]), inputs[count:]
    stats = []
    for prologue, flags, n, at, call_values in specs:
        values, stat = prologue(args[0], *rest[:n], *flags)
        rest = rest[n:]
        for offset, value in enumerate(call_values(*values)):
            args[at + offset] = value
        stats.append(stat)
    return function(*args), tuple(stats)


# :func:`_prologue_problem`'s answer where the call ran out of the GPU's shared memory
_SHARED_MEMORY = "out of the GPU's shared memory"


def _prologue_problem(compiled, args) -> Optional[str]:
    """What is wrong with ``compiled(*args)`` (:func:`_attend_after_prologue`,
    compiled), or None: run forward and backward on detached copies of the float
    tensors (those that need gradients again needing them), its outputs and the
    gradients of every argument against the same function's uncompiled (the
    prologues and torch's reference implementation of the fused call, whose autograd
    gives every tensor its gradient; without gradients, the outputs alone): an output
    (the prologues' stats too) or a gradient missing or further than
    :data:`PROLOGUE_TOLERANCE` from the reference's, or an error (its name and
    message; :data:`_SHARED_MEMORY` where it ran out of the GPU's shared memory). A
    GPU out of memory is raised.

    What this guards: the score function's captured tensors (P and the coefficient, a
    table) are computed within the compiled call, not given to it, and whether the
    compiled backward pass gives such a tensor its gradient is the compiler's to
    decide: torch's reference implementation decides at run time from
    ``requires_grad``, which a tensor computed within a traced call no longer has there
    (traced through AOTAutograd on a CPU, its backward graph then adds None and
    raises); Inductor decides from the traced joint graph. A gradient that is rightly
    zero (a window held at its floor, F >= I) is the reference's too."""

    def run(function):
        result, copies = _forward_backward(function, args)  # (the call's result, the prologues' stats)
        grads = [c.grad if isinstance(c, Tensor) and c.requires_grad else None for c in copies]
        return [out.detach() for out in _tensors(result)], grads

    try:
        got_outputs, got = run(compiled)
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure of the prologue within the call sends it outside
        return _SHARED_MEMORY if _out_of_shared_memory(error) else f"{type(error).__name__}: {error}"
    want_outputs, want = run(_attend_after_prologue)
    tolerance = PROLOGUE_TOLERANCE.get(args[3].dtype, PROLOGUE_TOLERANCE[torch.float16])  # q's (``args[3]``)
    for name, pairs in (("output", zip(got_outputs, want_outputs)), ("gradient of argument", zip(got, want))):
        for index, (a, b) in enumerate(pairs):
            if (a is None) != (b is None):
                return f"{name} {index} is {'missing' if a is None else 'one the reference lacks'}"
            if a is None:
                continue
            a, b = a.float(), b.float()
            if not torch.equal(a.isnan(), b.isnan()):
                return f"{name} {index} has NaN where the reference's has not, or the other way round"
            a, b = a.nan_to_num(0.0), b.nan_to_num(0.0)  # (NaN at the same places: equal there)
            error = ((a - b).norm() / b.norm().clamp(min=1e-6)).item()
            if not error <= tolerance:
                return f"{name} {index} differs from the reference's by {error:.3g} (relative)"
    return None


# :func:`_prologue_problem`'s largest relative difference of an output or a gradient
# from the reference's, by the queries' dtype (a gradient that the compiled call drops
# differs by about 1)
PROLOGUE_TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-2, torch.float16: 0.2, torch.bfloat16: 0.2}


def flex_branch(ctx: AttentionContext, v: Tensor, scale: float, description: Description, call_scores=(),
                value: Optional[ValueTerm] = None) -> Tensor:
    """One branch through FlexAttention, ``B x H x Tq x Dh`` in ``v``'s dtype.

    ``description``: the branch's; ``call_scores``: the call's own score terms (Shaw et
    al.'s key term, a :class:`~.scores.BucketScore`); ``value``: Shaw et al.'s value
    term, or None. Padding and causality come from ``ctx``; a mask given whole goes in
    as a ``-inf`` bias."""
    window = description.window if description.window is not None else Window(None, None)
    if ctx.causal:
        window = window.causal()
    terms = _Terms(ctx, description, call_scores, ctx.key_padding_mask)
    if value is None:
        return terms.call(ctx.q, ctx.k, v, scale, window, False)
    return _with_value_term(ctx, v, scale, terms, window, value)


@functools.lru_cache(maxsize=256)
def _windows_block_mask(windows: Tuple[Tuple[Optional[int], Optional[int]], ...], heads: int, tgt_len: int,
                        src_len: int, device: torch.device):
    """The block mask of :func:`flex_windows`: query head ``h * L + b`` keeps
    ``-left_b <= d <= right_b`` (``windows[b] = (left_b, right_b)``), cached per windows,
    heads, lengths and device."""
    with torch.inference_mode(False):
        # each group's left and right bound (L each) and Tk - Tq (0-d), as data: numbers
        # captured by the closure, or an index into one table (``bounds[group, 2]``),
        # would be constants of the compiled graph
        lefts, rights = (torch.tensor([_UNBOUNDED if w[side] is None else w[side] for w in windows],
                                      dtype=torch.long, device=device) for side in (0, 1))
        offset = torch.tensor(src_len - tgt_len, dtype=torch.long, device=device)

        def mask_mod(b, h, q_idx, kv_idx):
            group = h % lefts.size(0)
            d = kv_idx - q_idx - offset
            return (d >= -lefts[group]) & (d <= rights[group])

        return create_block_mask(mask_mod, None, heads * len(windows), tgt_len, src_len, device=device)


def flex_windows(ctx: AttentionContext, v: Tensor, scale: float, windows: Sequence[Window], epilogue=None):
    """L branches that are windows alone over the same energies (HySAN's directions and
    local windows, Song et al. 2019, eq. 8-12; the hybrid's global and local branches,
    Xu et al. 2019, eq. 1-3) as one FlexAttention call: branch ``b`` is a group of query
    heads (grouped-query attention: query head ``h * L + b`` reads key head ``h``) and
    the block mask keeps each group's window, so the call skips every block outside
    it. Returns ``B x H x L x Tq x Dh`` in ``v``'s dtype (branch outputs on dim 2).

    One call's launches for L (a forward and a backward kernel, one copy of the
    queries) instead of L calls'; padding in the score function and causality as in
    :func:`flex_branch`. The call is :func:`_attend_windows`; where ``epilogue`` (a
    fusion's :meth:`~fairseq_localness.modules.fusion.Fusion.epilogue`) gives the
    fusion as a function, that too (HySAN's squeeze gate, eq. 13-14), and a
    :class:`~fairseq_localness.modules.fusion.FusedOutput` is returned: one compiled
    call forward and one backward per sublayer for the branches and their fusion."""
    q, k = ctx.q, ctx.k
    bsz, heads, tgt_len, head_dim = q.shape
    count, src_len = len(windows), k.size(2)
    if ctx.causal:
        windows = [window.causal() for window in windows]
    # the queries' copy per group, made outside the compiled call: Inductor's lowering of
    # the call for the CPU reads its queries' layout as four sizes, which a copy made
    # within the call (an expanded view) does not have
    grouped = q.unsqueeze(2).expand(bsz, heads, count, tgt_len, head_dim).reshape(bsz, heads * count, tgt_len,
                                                                                 head_dim)
    block_mask = _windows_block_mask(tuple((w.left, w.right) for w in windows), heads, tgt_len, src_len, q.device)
    geometry = _geometry(None, None, src_len - tgt_len, 0, q.device)
    padding = ctx.key_padding_mask
    spec = epilogue(ctx) if epilogue is not None and q.device.type in EPILOGUE_DEVICES else None
    function, tensors, flags = spec if spec is not None else (None, (), ())

    def key_of(options):
        return _kind(grouped, (block_mask, padding, options) + tuple(tensors),
                     (count, getattr(function, "__name__", None)) + tuple(flags))

    def args_of(options):
        return (grouped, k, v, scale, block_mask, padding, geometry, options, function, tuple(flags), *tensors)

    result = _call_kind(_attend_windows, grouped, key_of, args_of, KERNEL_OPTIONS)
    return result if function is None else FusedOutput(*result)


def _attend_windows(grouped, k, v, scale, block_mask, padding, geometry, kernel_options, epilogue, flags: tuple,
                    *tensors):
    """:func:`flex_windows`'s call: one fused call over the queries' groups of heads
    ``grouped`` (``B x H*L x Tq x Dh``), its output as ``B x H x L x Tq x Dh``, and
    ``epilogue(out, *tensors, *flags)`` on it where ``epilogue`` is given; one
    function, compiled as one call."""
    bsz, grouped_heads, tgt_len, head_dim = grouped.shape
    heads = k.size(1)
    out = _attend(grouped, k, v, scale, block_mask, padding, None, None, None, None, geometry, None, False,
                  kernel_options, True)
    out = out.view(bsz, heads, grouped_heads // heads, tgt_len, head_dim)
    if epilogue is None:
        return out
    if not torch.is_grad_enabled():
        return epilogue(out, *tensors, *flags)
    # the epilogue's own activations (HySAN's merged heads, bottleneck and gates) are
    # recomputed in the backward pass from ``out``, which the call keeps for its own
    # backward pass anyway: nothing of the epilogue's is kept for that pass (traced by
    # AOTAutograd with the partitioner Inductor uses, without the checkpoint the forward
    # graph kept the merged heads, the bottleneck and the gates, 2 C + C/r values per
    # token and branch; ``tests/test_flex_path.py``)
    return checkpoint(epilogue, out, *tensors, *flags, use_reentrant=False)


def _with_value_term(ctx: AttentionContext, v: Tensor, scale: float, terms: _Terms, window: Window,
                     value: ValueTerm) -> Tensor:
    """The branch's attention plus Shaw et al.'s value term, ``sum_r mass_r w^V_r``
    with each row's probability mass per bucket ``r = clip(d, -K, K) + K`` (see the
    module docstring), as one call of :func:`_attend_with_value_term` (compiled on
    CUDA once per kind of call, like :func:`_attend`): the fused call with its
    log-sum-exp, the far-left call where both far sides are open, and
    :func:`_value_term`'s two dozen small element-wise, gather and reduction
    operations, which Inductor fuses into a few kernels. One compiled call forward
    and one backward per sublayer instead of three (two in causal attention): the
    wrapper of each compiled call is host time, and a GPU's training step is bound by
    its host (issue 38)."""
    q, k = ctx.q, ctx.k
    tgt_len, src_len, k_clip = ctx.tgt_len, ctx.src_len, value.k
    left_open = window.left is None or window.left >= k_clip
    right_open = window.right is None or window.right >= k_clip
    block_mask, geometry = terms.window(window, tgt_len, src_len, q.device)
    far_block_mask = far_geometry = None
    if left_open and right_open:
        far = Window(window.left, -k_clip)
        if not _empty(far, tgt_len, src_len):
            far_block_mask, far_geometry = terms.window(far, tgt_len, src_len, q.device)
    j, valid = _band(tgt_len, src_len, k_clip, window.left, window.right, q.device)  # Tq x (2K - 1) each

    def key_of(options):
        optional = (block_mask, far_geometry, terms.padding, terms.centre, terms.table, terms.bias, options)
        return _kind(q, optional, (left_open, right_open))

    def args_of(options):
        return (q, k, v, scale, block_mask, far_block_mask, terms.padding, terms.centre, terms.coeff, terms.k_pos,
                terms.table, geometry, far_geometry, terms.bias, j, valid, value.embeddings, left_open, right_open,
                options)

    return terms.run(_attend_with_value_term, {"centre": 7, "table": 10}, q, key_of, args_of, terms.options(q))


def _attend_with_value_term(q, k, v, scale, block_mask, far_block_mask, padding, centre, coeff, k_pos, table,
                            geometry, far_geometry, bias, j, valid, embeddings, left_open: bool, right_open: bool,
                            kernel_options):
    """:func:`_attend` with its log-sum-exp, the log-sum-exp of the far-left call
    (its window ``d <= -K``: ``far_block_mask`` and ``far_geometry``) where
    ``far_geometry`` is given, and :func:`_value_term` on them: one function, compiled
    as one call."""
    out, lse = _attend(q, k, v, scale, block_mask, padding, centre, coeff, k_pos, table, geometry, bias, True,
                       kernel_options)
    far_lse = None
    if far_geometry is not None:
        far_lse = _attend(q, k, v, scale, far_block_mask, padding, centre, coeff, k_pos, table, far_geometry, bias,
                          True, kernel_options)[1]
    return _value_term(out, q, k, scale, lse, far_lse, j, valid, centre, coeff, k_pos, table, bias, padding,
                       embeddings, left_open, right_open)


def _value_term(out, q, k, scale, lse, far_lse, j, valid, centre, coeff, k_pos, table, bias, padding, embeddings,
                left_open: bool, right_open: bool):
    """``out + masses @ w^V`` (Shaw et al. 2018, eq. 3 with the clipping of eq. 5), where
    ``masses`` (``B x H x Tq x R``, float32) is each row's probability mass per bucket:
    the band ``|d| < K`` recomputed from the log-sum-exp ``lse`` of the fused call
    (energies ``q k^T`` in float32 gathered at the band keys ``j``, plus the same score
    terms); of the far left (``d <= -K``) and the far right (``d >= K``), a side the
    window excludes is 0, and where only one side is open it is the rest of the row;
    where both are, the far left is ``exp(far_lse - lse)`` (0 without ``far_lse``: no
    query has such a key) and the far right the rest."""
    bsz, heads, tgt_len, _ = q.shape
    width = j.size(-1)  # 2K - 1
    index = j.expand(bsz, heads, tgt_len, width)
    key_index = j.reshape(1, -1).expand(bsz, -1)
    energies = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale  # B x H x Tq x Tk
    scores = energies.gather(-1, index)
    if centre is not None:
        dist = k_pos.gather(-1, key_index).view(bsz, 1, tgt_len, width) - centre[..., None]
        scores = scores + dist * dist * coeff[..., None]
    if table is not None:
        scores = scores + table[..., 1 : width + 1].float()
    if bias is not None:
        scores = scores + bias.gather(-1, index).float()
    keep = valid
    if padding is not None:
        keep = keep & ~padding.gather(-1, key_index).view(bsz, 1, tgt_len, width)
    nonempty = torch.isfinite(lse)
    zero = torch.zeros_like(lse)
    safe_lse = torch.where(nonempty, lse, zero)
    probs = torch.exp(scores.masked_fill(~keep, float("-inf")) - safe_lse[..., None])  # B x H x Tq x W
    rest = torch.where(nonempty, 1.0 - probs.sum(-1), zero)
    far_left = far_right = zero
    if left_open and right_open:
        if far_lse is not None:
            far_left = torch.exp(far_lse - safe_lse)
        far_right = (rest - far_left).clamp(min=0.0)
    elif left_open:
        far_left = rest.clamp(min=0.0)
    elif right_open:
        far_right = rest.clamp(min=0.0)
    masses = torch.cat([far_left[..., None], probs, far_right[..., None]], dim=-1)
    return out + torch.matmul(masses, embeddings.to(masses.dtype)).to(out.dtype)


@functools.lru_cache(maxsize=256)
def _band(tgt_len: int, src_len: int, k_clip: int, left: Optional[int], right: Optional[int],
          device: torch.device) -> Tuple[Tensor, Tensor]:
    """The keys of the band ``|d| < K``: their indices ``j = q' + d`` clamped to the
    keys, and whether each is a key inside the window, ``Tq x (2K - 1)`` each."""
    with torch.inference_mode(False):  # cached: usable by a later pass with gradients
        d = torch.arange(1 - k_clip, k_clip, device=device)
        j = torch.arange(src_len - tgt_len, src_len, device=device).unsqueeze(1) + d
        valid = (j >= 0) & (j < src_len)
        if left is not None:
            valid = valid & (d >= -left)
        if right is not None:
            valid = valid & (d <= right)
        return j.clamp(0, src_len - 1), valid
