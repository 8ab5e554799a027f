"""Which computation an attention call takes, and on the fast path, each branch.

Shape notation as in :mod:`~fairseq_localness.modules.attention`: B = batch size,
H = heads, Tq = query length, Tk = key length, Dh = head dimension, L = branches.

Two paths compute the same thing and are tested against each other: the *eager*
reference of :class:`~fairseq_localness.modules.attention.AttentionCore` (energies
once, one float32 softmax per branch, returns weights) and the *fast path* (one
kernel call per branch, the fusion applied to the outputs as in the eager path).
``attention_impl`` (:data:`ATTENTION_IMPLS`) chooses: ``"auto"`` takes the fast path
where it applies except where the eager path was measured to be as fast, ``"sdpa"``
wherever it applies, ``"flex"`` likewise with every branch in the fused kernel
(:mod:`.flex`; on a CPU its forward pass only, for the tests), ``"dense"`` likewise
with every branch of a full pass one SDPA call with its mask and bias given whole
(:mod:`.dense`: no compiled call; a call with Shaw et al.'s value term one autograd
function per branch, :func:`~.dense.dense_relative`; not yet measured on a GPU against
the fused call), ``"eager"`` never.

The kernel layer. A branch describes its distribution once, as data
(:meth:`~fairseq_localness.modules.context.AttentionBranch.describe`, a
:class:`~fairseq_localness.modules.scores.Description`: a window, score terms of
``(b, h, q_idx, kv_idx)`` with their captured tensors, a mask given whole); the call
adds padding, causality and Shaw et al.'s terms. :func:`branch_attention` reads the
description once and turns it into the call of one kernel per device:

* on a CPU, the kernels chosen and measured there (bands, the CPU flash kernel, the
  per-block recomputation of learned biases, SDPA with a dense mask; the rows marked
  "CPU" or "any" below), computing exactly what they computed before the
  descriptions existed (the same operations in the same order: the outputs and
  gradients are bit for bit the same);
* on CUDA, a branch with anything of its own (a bounded window, a score term, a
  mask given whole) or in a call with Shaw et al.'s terms goes to one fused
  FlexAttention call (:mod:`.flex`: the window as a block mask, the rest in one
  score function, compiled once per kind of call); a branch with nothing of its own stays on SDPA's
  fused kernels, which are faster per call than flex (below, [6]_).

The call (:func:`use_fast_path`): the first row that matches decides.

+--------------------------------------+---------+---------+-----------------+---------+
| the call                             | device  | dtype   | length          | path    |
+======================================+=========+=========+=================+=========+
| ``attention_impl="eager"``, or a     | any     | any     | any             | eager   |
| recorder wants the distributions     |         |         |                 |         |
+--------------------------------------+---------+---------+-----------------+---------+
| one branch, asked for its weights    | any     | any     | any             | eager   |
+--------------------------------------+---------+---------+-----------------+---------+
| any                                  | any     | float64 | any             | eager   |
+--------------------------------------+---------+---------+-----------------+---------+
| Shaw et al.'s value term with        | CUDA    | any     | Tq > 1          | one     |
| attention dropout, or with           | (any    |         |                 | autograd|
| ``"dense"`` (:func:`takes_relative`) | with    |         |                 | function|
|                                      | dense)  |         |                 | [9]_    |
+--------------------------------------+---------+---------+-----------------+---------+
| Shaw et al.'s value term with        | any     | any     | any             | eager   |
| attention dropout otherwise (the     |         |         |                 |         |
| fused call draws no dropout; the     |         |         |                 |         |
| CPU keeps its measured path)         |         |         |                 |         |
+--------------------------------------+---------+---------+-----------------+---------+
| ``"auto"``: several branches trained | CPU     | float32 | any             | eager   |
| with attention dropout               |         |         |                 | [1]_    |
+--------------------------------------+---------+---------+-----------------+---------+
| ``"auto"``: several branches trained | CPU     | float32 | Tk <= 64        | eager   |
|                                      |         |         |                 | [2]_    |
+--------------------------------------+---------+---------+-----------------+---------+
| ``"auto"``: without gradients,       | CPU     | float32 | Tk <= 64        | one     |
| several query rows (validation, beam |         |         |                 | product |
| search's encoder pass), several      |         |         |                 | [7]_    |
| branches that are windows alone, no  |         |         |                 |         |
| attention dropout                    |         |         |                 |         |
+--------------------------------------+---------+---------+-----------------+---------+
| ``"auto"``: without gradients,       | CPU     | float32 | Tk <= 64        | eager   |
| several query rows, several branches |         |         |                 | [2]_    |
| otherwise                            |         |         |                 |         |
+--------------------------------------+---------+---------+-----------------+---------+
| anything else: one branch, no        | any     | float32 | any             | fast    |
| gradients, frozen parameters,        |         | float16 |                 |         |
| several branches over more keys,     |         | bfloat16|                 |         |
| ``"sdpa"``, ``"flex"``               |         |         |                 |         |
+--------------------------------------+---------+---------+-----------------+---------+

Several branches that are windows alone (HySAN's, the hybrid's), at least one of
them bounded, where the fused kernel computes the call's branches (CUDA; ``"flex"``
on a CPU without gradients; no attention dropout, no ``attn_mask`` of the call's own,
no Shaw et al. terms, ``Tq > 1``): one FlexAttention call for all of them
(:func:`fused_windows`, :func:`~.flex.flex_windows`: each branch a group of query
heads with its window in the block mask), and a fusion that can take the stacked
outputs whole does (HySAN's squeeze gate: one gate over all branches), on CUDA within
the same compiled call (the fusion's ``epilogue``: the gate's products, element-wise
steps and logged means compiled with the branches, forward and backward). On CUDA that
is one compiled call forward and one backward per sublayer for the branches and the
gate; not yet measured on a GPU.
At one query row (an incremental step; no attention dropout, no ``attn_mask`` of the
call's own, no Shaw et al. terms), several branches that are hard windows alone take
one product (:func:`~.windows.windows_attention`: the row's energies once, a row per
window; on a CPU up to :data:`EAGER_MAX_KEYS` keys; on CUDA one fused call, [8]_),
stacked for the fusion likewise;
so do several query rows on a CPU without gradients over up to
:data:`EAGER_MAX_KEYS` keys (the table's "one product"). One HySAN decoder self-attention
step (forward, local1) went from 91 operator calls to 71 (the transformer's: 35), a
beam search of the benchmark's default shape from 18,747 to 16,593 (the
transformer's: 11,260; counted by dispatch, ``iwslt_de_en``, 8 sentences, beam 4,
16 steps); with the heads' products as one ``bmm`` each and the windows' blocked keys
as a cached row added to the energies (:mod:`.windows`), and the squeeze gate without
its autograd function under ``no_grad``, to 60 per step and 15,574 per search.

Otherwise each branch on the fast path (:func:`branch_attention`): the first row that
matches decides. "Plain" is a call without a float ``attn_mask`` of its own (whose finite
part is then a bias of every branch); a hard window is a branch that is exactly
``-l <= j - i <= r`` (a description with a :class:`~fairseq_localness.modules.scores.Window`
and nothing else; ``l``, ``r`` or both unbounded), with ``r <= 0`` in a causal core.

+--------------------------------------+--------+-------+-----------------+-----------------------+
| kind of branch                       | device | dtype | length          | kernel                |
+======================================+========+=======+=================+=======================+
| any branch of a call with Shaw et    | CUDA;  | any   | Tq > 1          | ``dense_relative``    |
| al.'s value term, with attention     | any    |       |                 | (:mod:`.dense`, one   |
| dropout or ``"dense"``               | with   |       |                 | autograd function)    |
| (:func:`takes_relative`)             | dense  |       |                 | [9]_                  |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| any branch, ``attention_impl=        | CPU,   | any   | Tq > 1; on CUDA | :mod:`.flex` (CPU:    |
| "flex"``, no ``attn_mask`` of the    | no     |       | Dh >= 16        | forward only)         |
| call's own, no attention dropout     | grads; |       |                 |                       |
|                                      | CUDA   |       |                 |                       |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| a bounded window, a score term       | CUDA   | any   | Tq > 1, Dh >=   | :mod:`.flex` [6]_     |
| (Yang et al.'s Gaussian), a mask     |        |       | 16; not yet     |                       |
| given whole, or any branch of a call |        |       | measured on a   |                       |
| with Shaw et al.'s terms; no         |        |       | GPU against the |                       |
| ``attn_mask`` of the call's own, no  |        |       | rows below      |                       |
| attention dropout                    |        |       |                 |                       |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| a learned bias (Yang et al.'s        | any    | any   | any             | :mod:`.recompute`     |
| Gaussian, with gradients; Shaw et    |        |       |                 | [3]_                  |
| al.'s key and value terms), no       |        |       |                 |                       |
| attention dropout                    |        |       |                 |                       |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| Shaw et al.'s terms on a branch with | any    | any   | Tq = 1          | ``RelativePositions`` |
| no mask or bias of its own, in self- |        |       |                 | ``.step_attention``   |
| attention, no attention dropout      |        |       |                 | [4]_; on CUDA one     |
|                                      |        |       |                 | fused call [8]_       |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| a hard window, plain, no dropout     | any    | any   | Tq = 1          | :mod:`.step` [4]_; on |
|                                      |        |       |                 | CUDA one fused call   |
|                                      |        |       |                 | [8]_                  |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| a hard window bounded on both sides, | any    | any   | l + r + 1 < Tk  | :mod:`.banded` [5]_   |
| plain                                |        |       |                 |                       |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| ``j <= i`` (a forward branch, the    | CPU    | any   | Tq = Tk > 1     | CPU flash kernel,     |
| causal core's global branch) or      |        |       |                 | ``is_causal`` [5]_    |
| ``j >= i`` (a backward branch),      |        |       |                 | (:mod:`.sdpa`)        |
| plain, no dropout, torch >= 2.5      |        |       |                 |                       |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| no mask or bias of its own (encoder- | any    | any   | Tq = 1          | :mod:`.step` [4]_; on |
| decoder attention), plain, no        |        |       |                 | CUDA one fused call   |
| dropout                              |        |       |                 | [8]_                  |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| the plain causal mask alone (no      | any    | any   | Tq = Tk         | SDPA, ``is_causal``   |
| padding, no bias)                    |        |       |                 | (:mod:`.sdpa`)        |
+--------------------------------------+--------+-------+-----------------+-----------------------+
| anything else                        | any    | any   | any             | SDPA with the mask    |
|                                      |        |       |                 | and bias              |
|                                      |        |       |                 | (:mod:`.sdpa`)        |
+--------------------------------------+--------+-------+-----------------+-----------------------+

The measurements behind the choices and their thresholds (the sections named are
docs/benchmark_appendix.md's; 2 threads on the project's 2-core CPU unless a note says
otherwise):

.. [1] "The attention paths on a CPU (``attention_impl="auto"``)": with dropout
   (which the CPU flash kernel and the recomputation do not draw) the per-branch
   calls fall back to SDPA's reference kernel, where the eager path, computing
   ``q k^T`` once for all branches and reusing the saved distributions in its
   backward pass, was measured within a few percent of it (HySAN e1 gated, sum and
   concat, hybrid; 16 x 32 tokens, 7 rounds).
.. [2] 64 is :data:`EAGER_MAX_KEYS`. "Attention paths at real lengths: what was
   tried and measured", its last point (commit ``78d8ea7``): HySAN e1 training
   ratio / bound, eager against fast, 0.964 / 0.917 at T = 32, 0.947 / 0.907 at 64,
   0.937 / 0.934 at 128; the fast path is ahead from T = 256 on (hybrid with decoder
   layers: 1.007 / 0.990 at 64). Without gradients (one HySAN e1 encoder sublayer,
   d = 512, one thread, process CPU time, 15 paired rounds of 10 passes, median of
   the fast path's time over the eager path's): 1.064 at 8 x 32, 1.018 at 8 x 64,
   0.932 at 4 x 128, 0.897 at 2 x 256.
.. [3] "Attention paths at real lengths", its table: recomputed per block against a
   split into flash-kernel calls and a band, and the block size
   (:data:`~.recompute.BLOCK_ELEMENTS`).
.. [4] "Attention paths at real lengths", the point on incremental steps: decode
   ratio / bound at T = 256 from 0.87-0.92 to 0.94-0.98 for HySAN, 0.90 to 0.91-0.96
   for rel_pos, 0.90-0.93 to 0.95-0.97 for Dec-DC.
.. [5] "Attention paths at real lengths", its table's first row (the CPU flash kernel,
   the transformer's own attention: 6.6, 22.5 and 80.0 ms at T = 32, 256 and 1024),
   and the commit that brought bands and the flash kernel's ``is_causal`` (commit
   ``03ceaba``: HySAN e1 gated at T = 256 trained at 0.81 of the transformer's speed
   against 0.63 eager).
.. [6] Issue 38, measured on an NVIDIA H200 (torch 2.11, bf16; one call, forward and
   backward, B x 8 heads x T x 64): SDPA 0.24-0.27 ms at 32 x 128 and 0.19-0.25 ms at
   8 x 512; flex alone 0.75 / 0.68 ms, with Yang et al.'s Gaussian (gradients into
   centre and width) 1.32 / 1.08, with Shaw et al.'s key table 0.77 / 0.75, with a
   hard window as a block mask 0.91 / 0.78. One flex call is one fused kernel pair,
   where the CPU kernels launch per query block and per diagonal (localness + rel_pos
   at 32 x 128: 9,031 kernels per training step against the transformer's 1,727). So
   a branch with nothing of its own stays on SDPA (3 times faster per call), and every
   other branch goes to flex whatever its length: where the band (:mod:`.banded`) or
   SDPA with a dense mask would be faster on a GPU has not yet been measured on a
   GPU. Calls with attention dropout (flex draws none) and one-row steps keep the
   rows below; an ``attn_mask`` of the caller's own keeps the dense kernels.
.. [7] :func:`_few_keys_windows`: one HySAN e1 encoder pass without gradients (8
   sentences of 32 tokens, one thread, process CPU time) took 0.959 of the eager
   path's time. With gradients the same product was as fast as the eager path (a
   training step at 16 x 32 tokens: 0.998 of its time, 12 alternating rounds), which
   keeps those calls.
.. [8] :data:`.step.FUSED_STEP_DEVICES`: on CUDA a step's attention is one call of
   SDPA's fused kernel with its mask or bias as data (:func:`.step.row_attention`),
   where the step kernels made its products, scaling, casts and softmax one operator
   each. Not yet measured on a GPU; counted on the CPU on CUDA's paths (one
   Transformer-base decoder step at width 64, bfloat16, 8 sentences at their 20th
   token): the decoder's operators per step, HySAN e1 232 -> 208, Dec-DC 238 -> 202,
   localness + rel_pos 232 -> 190 (the transformer's: 208). The H200's beam search
   launched 1.10 (HySAN), 1.15 (Dec-DC) and 1.19 (rel_pos) times the transformer's
   kernels and ran at 0.77, 0.82 and 0.74 of its speed (8 sentences of 128 tokens).
   On the CPU the fused step is no faster: a beam search with it over one with the
   step kernels (``iwslt_de_en``, beam 4, float32, one thread, process CPU time,
   paired rounds, median speed ratio) 0.977 (rel_pos), 1.002 (HySAN e1) and 0.988
   (Dec-DC) at 8 sentences of 32 tokens, 32 steps, 7 rounds (the transformer, which
   takes neither, 1.023: the noise); 0.988, 1.004 and 1.025 at 2 sentences of 256
   tokens, 64 steps, 5 rounds. So the CPU keeps its measured kernels.
.. [9] :func:`~.dense.dense_relative`: Shaw et al.'s key term, the mask and score
   terms, the softmax, the dropout and both value products as one autograd function
   with its own backward pass. Counted on the CPU on CUDA's paths (a benchmark
   training step of localness + rel_pos, width 32, 2 x 16 tokens, float32, SDPA and
   each compiled call one operator forward and one backward): 2,205 operators on the
   eager path against 2,147 with ``"dense"``; with attention dropout 0.1 under
   ``"auto"``, 2,277 against 2,219 (the transformer's: 1,575 and 1,599). It keeps the
   float32 distribution and the dropout's mask for its backward pass, where the eager
   path also keeps the dropped distribution in the values' dtype. Not yet measured on
   a GPU; the CPU's ``"auto"`` keeps the eager path it was measured with.
"""
from typing import Optional

import torch
from torch import Tensor, nn

from fairseq_localness.modules.context import AttentionBranch, AttentionContext, combine_masks, dense_mask_and_bias
from fairseq_localness.modules.kernels import dense, flex, sdpa
from fairseq_localness.modules.kernels.banded import banded_attention
from fairseq_localness.modules.kernels.recompute import recomputed_attention, whole_bias_term
from fairseq_localness.modules.kernels.step import last_keys_attention
from fairseq_localness.modules.kernels.windows import windows_attention
from fairseq_localness.modules.scores import Description, GaussianScore, Window

# The settings of AttentionCore.attention_impl: "auto" (the fast path where it applies
# and pays), "sdpa" (the fast path wherever it applies), "eager" (the reference path),
# "flex" (every branch in the fused kernel), "dense" (every branch of a full pass one SDPA
# call with its mask and bias whole, :mod:`.dense`).
ATTENTION_IMPLS = ("auto", "sdpa", "eager", "flex", "dense")

# "auto" keeps several float32 branches trained on a CPU on the eager path up to this
# many keys: there one q k^T shared by the branches and their small saved
# distributions cost less than a kernel call (and its backward pass) per branch.
# Measured with the benchmark (iwslt size, 2,048 tokens per step, 2 threads), training
# ratio / bound of HySAN e1 eager against the fast path: 0.964 / 0.917 at T = 32,
# 0.947 / 0.907 at T = 64, 0.937 / 0.934 at T = 128 (where the eager path keeps more);
# the fast path is ahead from T = 256 on. The same bound holds for full passes without
# gradients (one HySAN encoder sublayer: the fast path's time over the eager path's
# 1.064 at T = 32, 1.018 at 64, 0.932 at 128).
EAGER_MAX_KEYS = 64

# Half and single precision inputs the fast path takes (float64 stays on the reference).
_SDPA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Devices where a fused kernel (:mod:`.flex`) computes every call with anything of its
# own, in training too (the rows marked CUDA in the tables above), and where the CPU's
# rule for several branches over few keys does not apply: CUDA. The CPU joins them
# only within :func:`~.emulation.cuda_paths_on_cpu` (tests), where torch's reference
# implementation of FlexAttention computes those calls, forward and backward.
FUSED_DEVICES = ("cuda",)


def check_impl(impl: str) -> None:
    """Raise unless ``impl`` is one of :data:`ATTENTION_IMPLS`."""
    if impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl {impl!r}: allowed: {', '.join(ATTENTION_IMPLS)}")


def use_fast_path(
    impl: str,
    query: Tensor,
    src_len: int,
    *,
    branches: int,
    need_weights: bool,
    recording: bool,
    value_term: bool,
    dropout: bool,
    trainable: bool,
    windows: bool = False,
) -> bool:
    """Whether a call takes the fast path (the first table of the module docstring).

    ``query``: the layer input (its dtype and device); ``src_len``: Tk; ``branches``:
    L; ``need_weights``: the caller wants the weights (a one-branch attention returns
    them; several branches have none); ``recording``: a recorder wants the
    distributions; ``value_term``: the core has Shaw et al.'s value term;
    ``dropout``: attention dropout is drawn in this call; ``trainable``: the core's
    parameters take gradients; ``windows``: every branch is a hard window alone
    (:func:`fused_windows` computes them in one product).
    """
    check_impl(impl)
    if impl == "eager" or recording:
        return False
    if need_weights and branches == 1:
        return False
    if value_term and relative_route(impl, query.device, query.size(0), dropout, value_term) == "eager":
        return False
    if query.dtype not in _SDPA_DTYPES:
        return False
    if impl == "auto" and branches > 1 and query.dtype == torch.float32 and query.device.type == "cpu" \
            and "cpu" not in FUSED_DEVICES:
        if torch.is_grad_enabled() and trainable and (dropout or src_len <= EAGER_MAX_KEYS):
            return False
        if not torch.is_grad_enabled() and query.size(0) > 1 and src_len <= EAGER_MAX_KEYS:
            # full passes without gradients (validation, beam search's encoder): windows
            # alone take one product for all (fused_windows), other branches the eager path
            return windows and not dropout
    return True


def takes_relative(impl: str, device: torch.device, tgt_len: int, dropout: bool) -> bool:
    """Whether a call with Shaw et al.'s value term takes :func:`~.dense.dense_relative`
    (one autograd function per branch): a full pass (``Tq > 1``) with ``"dense"``, or
    with attention dropout on a device of :data:`FUSED_DEVICES` (CUDA), where the fused
    call draws no dropout. Elsewhere such a call with dropout takes the eager path (on a
    CPU, ``"auto"`` keeps the paths measured there)."""
    if tgt_len == 1:
        return False
    return dense.takes(impl, tgt_len) or (dropout and device.type in FUSED_DEVICES)


def relative_route(impl: str, device: torch.device, tgt_len: int, dropout: bool, value_term: bool) -> str:
    """Where a call of a core with Shaw et al.'s terms computes them, the one rule that
    :func:`use_fast_path`, the core and :func:`branch_attention` read:

    - ``"fused"``: within the kernel the call takes (CUDA's fused call, the CPU's
      recomputed kernels, the step kernel of one query row, or the eager path), the
      call drawing no attention dropout and not being ``"dense"``'s;
    - ``"function"``: :func:`~.dense.dense_relative`, both terms (:func:`takes_relative`);
    - ``"bias"``: the key term alone (no value term), as part of SDPA's float mask;
    - ``"eager"``: the value term where neither the fused call nor the function takes
      it (attention dropout on a CPU under ``"auto"``): the eager path.
    """
    if not (dropout or dense.takes(impl, tgt_len)):
        return "fused"
    if not value_term:
        return "bias"
    return "function" if takes_relative(impl, device, tgt_len, dropout) else "eager"


def _fused_terms(ctx, scale, dropout, rel, impl):
    """The call's own score terms and value term for :func:`~.flex.flex_branch`, where a
    fused kernel computes this call's branches (:data:`FUSED_DEVICES`, CUDA, with
    ``"auto"`` or ``"sdpa"``; ``"flex"`` anywhere, on a CPU without gradients); else
    None. Not with attention
    dropout (the fused kernel draws none), nor for one query row (:mod:`.step`), nor
    on CUDA for a head dimension under 16 (:func:`~.flex.supports`: Inductor's kernels
    of the call need 16; the other kernels take those calls)."""
    if dropout is not None or ctx.tgt_len == 1 or not flex.supports(ctx.q):
        return None
    if ctx.q.device.type in FUSED_DEVICES:
        if impl not in ("auto", "sdpa", "flex"):
            return None
    elif impl != "flex" or (torch.is_grad_enabled() and ctx.q.requires_grad):
        return None
    if ctx.cache.get("extra_mask"):
        return None  # an attn_mask of the caller's own: the dense kernels take its mask
    scores, value = [], None
    if rel is not None:
        key, value = rel.describe(ctx.q, scale)
        scores.append(key)
    return tuple(scores), value


def fused_windows(
    ctx: AttentionContext,
    v: Tensor,
    branches,
    soft_bias: Optional[Tensor],
    scale: float,
    dropout: Optional[nn.Module],
    relative_positions: Optional[nn.Module],
    impl: str = "auto",
    epilogue=None,
    base_blocked: Optional[Tensor] = None,
    stacked_fusion: bool = False,
):
    """Several branches on the fast path in one call, ``B x H x L x Tq x Dh``, where
    every branch is a window alone (a
    :class:`~fairseq_localness.modules.scores.Window` and nothing else: HySAN's
    branches, the hybrid's) and the call has no Shaw et al. terms and no ``attn_mask``
    bias: one query row by :func:`_one_row_windows`; several where a fused kernel
    computes the call's branches (the conditions of :func:`_fused_terms`) by
    :func:`~.flex.flex_windows`, with at least one window bounded (several global
    branches stay on SDPA) unless ``impl`` is ``"flex"``; several on a CPU without
    gradients over few keys by :func:`_few_keys_windows`; else None (each branch then
    takes :func:`branch_attention`). ``epilogue``: the fusion's
    :meth:`~fairseq_localness.modules.fusion.Fusion.epilogue`, which the fused call of
    :func:`~.flex.flex_windows` asks for and computes within itself where it has one
    (a :class:`~fairseq_localness.modules.fusion.FusedOutput` is then returned).
    With ``impl`` ``"dense"``, several query rows by :func:`~.dense.dense_windows`
    where ``stacked_fusion`` (the fusion takes the branches stacked,
    :meth:`~fairseq_localness.modules.fusion.Fusion.takes_stacked`), its masks made from
    ``base_blocked`` (the call's padding and causality), else None."""
    if len(branches) < 2 or relative_positions is not None or soft_bias is not None:
        return None
    if ctx.tgt_len == 1:
        return _one_row_windows(ctx, v, branches, scale, dropout)
    if dense.takes(impl, ctx.tgt_len):
        return _dense_windows(ctx, v, branches, base_blocked, dropout) if stacked_fusion else None
    if "fused" not in ctx.cache:
        ctx.cache["fused"] = _fused_terms(ctx, scale, dropout, relative_positions, impl)
    if ctx.cache["fused"] is None:
        return _few_keys_windows(ctx, v, branches, scale, dropout, impl)
    windows = []
    for branch in branches:
        description = branch.describe(ctx)
        if description.scores or description.mask is not None:
            return None
        windows.append(description.window if description.window is not None else Window(None, None))
    if impl != "flex" and not any(window.bounded for window in windows):
        return None
    return flex.flex_windows(ctx, v, scale, windows, epilogue)


def _dense_windows(ctx, v, branches, base_blocked, dropout) -> Optional[Tensor]:
    """``attention_impl="dense"``: several branches that are windows alone, for a fusion
    that takes their outputs stacked (:func:`~.dense.dense_windows`); else None (each
    branch then takes :func:`branch_attention`, the same SDPA call)."""
    if ctx.cache.get("extra_mask"):
        return None
    descriptions = [branch.describe(ctx) for branch in branches]
    if any(d.scores or d.mask is not None for d in descriptions):
        return None
    return dense.dense_windows(ctx, v, descriptions, base_blocked, dropout.p if dropout is not None else 0.0)


def _windows_product(ctx: AttentionContext, v: Tensor, branches, scale: float) -> Optional[Tensor]:
    """:func:`~.windows.windows_attention` over each branch's window (the core's causal
    bound applied, :func:`_effective_window`) where every branch is a hard window
    alone; else None."""
    windows = []
    for branch in branches:
        window = _effective_window(ctx, branch.describe(ctx))
        if window is None:
            return None
        windows.append(window)
    return windows_attention(ctx.q, ctx.k, v, scale, ctx.key_padding_mask, windows)


def _one_row_windows(ctx, v, branches, scale, dropout) -> Optional[Tensor]:
    """One query row (an incremental step) of several branches that are hard windows
    alone, without attention dropout or an ``attn_mask`` of the call's own, as one
    product (:func:`~.windows.windows_attention`, ``B x H x L x 1 x Dh``); else None.
    The same distributions as one :func:`~.step.last_keys_attention` per branch, the
    row's energies computed once. On a CPU up to :data:`EAGER_MAX_KEYS` keys only:
    every window's row spans all keys, where one product per window reads only its
    own (HySAN e1 beam search, 2 sentences of 1,024 tokens, 128 steps: 1.021 of the
    per-window steps' time; 1.005 at 256 tokens and 64 steps, 0.995 at 32 and 16)."""
    if dropout is not None or ctx.cache.get("extra_mask"):
        return None
    if ctx.q.device.type == "cpu" and ctx.src_len > EAGER_MAX_KEYS:
        return None
    return _windows_product(ctx, v, branches, scale)


def _few_keys_windows(ctx, v, branches, scale, dropout, impl) -> Optional[Tensor]:
    """Several float32 query rows over at most :data:`EAGER_MAX_KEYS` keys on a CPU
    without gradients (beam search's encoder pass, validation), ``"auto"``, of branches that
    are hard windows alone, without attention dropout or an ``attn_mask`` of the
    call's own: one product for all (:func:`~.windows.windows_attention`, ``B x H x L x
    Tq x Dh``), where the eager path computes a softmax, a product and the masks'
    repairs per branch; else None. One HySAN e1 encoder pass (``iwslt_de_en``, 8
    sentences of 32 tokens, the squeeze gate per branch, one thread, process CPU
    time): 0.959 of the eager path's time (median of 15 alternating rounds); the
    transformer's encoder took 0.832 of it, 0.797 of the eager path's."""
    if impl != "auto" or dropout is not None or ctx.cache.get("extra_mask"):
        return None
    if ctx.q.device.type != "cpu" or ctx.q.dtype != torch.float32 or ctx.src_len > EAGER_MAX_KEYS:
        return None
    if torch.is_grad_enabled():
        return None
    return _windows_product(ctx, v, branches, scale)


def branch_attention(
    ctx: AttentionContext,
    v: Tensor,
    branch: AttentionBranch,
    base_blocked: Optional[Tensor],
    soft_bias: Optional[Tensor],
    scale: float,
    dropout: Optional[nn.Module],
    relative_positions: Optional[nn.Module],
    impl: str = "auto",
) -> Tensor:
    """One branch on the fast path, ``B x H x Tq x Dh`` in the input dtype, by the
    cheapest kernel that gives its distribution (the second table of the module
    docstring), from the branch's description (:meth:`AttentionBranch.describe`,
    taken once).

    ``base_blocked``: the call's padding and causal mask; ``soft_bias``: the finite
    part of a float ``attn_mask`` (and, with attention dropout or ``"dense"``, Shaw et
    al.'s key term, but where :func:`~.dense.dense_relative` computes it with the value
    term); ``scale``: ``1 / sqrt(Dh)``; ``dropout``: the attention dropout where it is
    drawn in this call, else None; ``relative_positions``: the core's
    :class:`~fairseq_localness.modules.relative_position.RelativePositions`, or None;
    ``impl``: the core's ``attention_impl``.
    """
    description = branch.describe(ctx)
    rel = relative_positions
    if rel is not None and relative_route(impl, ctx.q.device, ctx.tgt_len, dropout is not None,
                                          rel.value_embeddings is not None) == "function":
        return dense.dense_relative(ctx, v, description, base_blocked, soft_bias, scale,
                                    dropout.p if dropout is not None else 0.0, rel)
    if "fused" not in ctx.cache:  # once per call, for all its branches
        ctx.cache["fused"] = _fused_terms(ctx, scale, dropout, relative_positions, impl)
    fused = ctx.cache["fused"]
    if fused is not None:
        call_scores, value = fused
        if impl == "flex" or call_scores or value is not None or _has_own(description):
            return flex.flex_branch(ctx, v, scale, description, call_scores, value)
    if dense.takes(impl, ctx.tgt_len):
        return dense.dense_attention(ctx, v, description, base_blocked, soft_bias,
                                     dropout.p if dropout is not None else 0.0)
    out = _recomputed(ctx, v, description, base_blocked, soft_bias, scale, dropout, relative_positions)
    if out is not None:
        return out
    plain = soft_bias is None and not ctx.cache.get("extra_mask")
    one_row = plain and ctx.tgt_len == 1 and dropout is None
    if plain:
        window = _effective_window(ctx, description)
        if window is not None:
            if one_row:
                out = last_keys_attention(ctx.q, ctx.k, v, scale, ctx.key_padding_mask, window.left)
            else:
                out = _structured(ctx, v, window, scale, dropout)
            if out is not None:
                return out
    blocked, bias = dense_mask_and_bias(ctx, description, base_blocked)
    if one_row and bias is None and blocked is base_blocked:  # no mask or bias of its own: e.g. cross-attention
        return last_keys_attention(ctx.q, ctx.k, v, scale, ctx.key_padding_mask, None)
    if soft_bias is not None:
        bias = soft_bias if bias is None else bias + soft_bias
    is_causal = False
    if bias is None and blocked is not None and blocked is ctx.cache.get("plain_causal"):
        blocked, is_causal = None, True
    dropout_p = dropout.p if dropout is not None else 0.0
    return sdpa.masked_attention(ctx.q, ctx.k, v, blocked, bias, dropout_p, is_causal)


def _has_own(description: Description) -> bool:
    """Whether a description restricts or biases its distribution (a bounded window,
    a score term, a mask)."""
    window = description.window
    return bool(description.scores) or description.mask is not None or (window is not None and window.bounded)


def _effective_window(ctx: AttentionContext, description: Description) -> Optional[Window]:
    """The branch's window where it is exactly a hard window (no score term, no mask
    given whole), with the core's causal bound applied (``right <= 0``); else None."""
    window = description.window
    if window is None or description.scores or description.mask is not None:
        return None
    return window.causal() if ctx.causal else window


def _recomputed(ctx, v, description, base_blocked, soft_bias, scale, dropout, rel) -> Optional[Tensor]:
    """A branch with learned biases (Yang et al. 2018's Gaussian, Shaw et al.
    2018's key and value terms) through :func:`~.recompute.recomputed_attention`,
    which keeps nothing of size ``Tq x Tk`` for the backward pass; None where it
    does not apply (attention dropout, which it does not draw; no learned bias;
    or no gradient and no value term, where SDPA takes the bias as a float mask
    and needs no backward pass)."""
    if dropout is not None:
        return None
    terms = None
    if torch.is_grad_enabled() or rel is not None:
        terms = [score.block_term() for score in description.scores if isinstance(score, GaussianScore)] or None
    if terms is None and rel is None:
        return None
    terms = list(terms or [])
    if not terms:
        bias = description.dense_bias(ctx.src_len)
        if bias is not None:
            terms.append((whole_bias_term, (bias,)))
    if soft_bias is not None:
        terms.append((whole_bias_term, (soft_bias,)))
    branch_mask = dense_mask_and_bias(ctx, description, None)[0] if _blocks(description) else None
    if rel is not None and not terms and branch_mask is None and ctx.self_attention and ctx.tgt_len == 1:
        return rel.step_attention(ctx.q, ctx.k, v, scale, ctx.key_padding_mask)
    blocked = combine_masks(base_blocked, branch_mask)
    if rel is None:
        return recomputed_attention(ctx.q, ctx.k, v, scale, blocked, terms)
    return recomputed_attention(ctx.q, ctx.k, v, scale, blocked, terms, rel.max_distance,
                                rel.key_embeddings, rel.value_embeddings, ctx.causal)


def _blocks(description: Description) -> bool:
    return description.mask is not None or (description.window is not None and description.window.bounded)


def _structured(ctx, v, window: Window, scale, dropout) -> Optional[Tensor]:
    """A branch whose keys are a hard index window, without a ``Tq x Tk`` mask: the
    band of :func:`~.banded.banded_attention` (both sides bounded and the window
    narrower than the keys), or the CPU flash kernel
    (:func:`~.sdpa.causal_flash_attention`) for ``j <= i`` and ``j >= i`` on a CPU
    without attention dropout in full passes (``Tq = Tk``). None where none applies
    (the caller then uses the branch's mask)."""
    left, right = window.left, window.right
    tgt_len, src_len = ctx.tgt_len, ctx.src_len
    if left is not None and right is not None:
        if left + right + 1 >= src_len:
            return None
        return banded_attention(ctx.q, ctx.k, v, scale, left, right, ctx.key_padding_mask, dropout)
    if (
        sdpa.CPU_FLASH is None
        or not sdpa.SDPA_ZEROES_EMPTY_ROWS_ON_CPU
        or ctx.q.device.type != "cpu"
        or tgt_len != src_len
        or tgt_len == 1
        or dropout is not None
    ):
        return None
    if left is None and right == 0:
        return sdpa.causal_flash_attention(ctx, v, scale, reverse=False)
    if left == 0 and right is None:
        return sdpa.causal_flash_attention(ctx, v, scale, reverse=True)
    return None
