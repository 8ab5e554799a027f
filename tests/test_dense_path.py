"""``attention_impl="dense"`` (modules/kernels/dense.py): every branch of a full pass as
one SDPA call with its mask and bias given whole, against the eager reference.

The path is the same on every device, so the CPU runs it whole, forward and backward:
every branch kind of the four models, with padding on either side, in float32 and
bfloat16. The CUDA twin (skipped without a GPU) runs it in float32, float16 and
bfloat16, where SDPA's memory-efficient kernel computes the learned biases'
gradients.
"""
import contextlib

import pytest
import torch
import torch.nn.functional as F

from fairseq_localness.modules.attention import AttentionCore, set_attention_impl
from fairseq_localness.modules.context import AttentionBranch, base_mask, build_context
from fairseq_localness.modules.gaussian import GaussianLocalness
from fairseq_localness.modules import hysan
from fairseq_localness.modules.hysan import make_branch
from fairseq_localness.modules.kernels import banded, choice, dense, emulation, recompute
from fairseq_localness.modules.kernels.choice import ATTENTION_IMPLS
from fairseq_localness.modules.kernels.sdpa import padding_bias
from fairseq_localness.modules.scores import Description, Window
from test_flex_path import B, C, CUDA_DTYPES, CUDA_TOL, H, KINDS, _FlexCalls, _module, _padding, _relative, _run

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# kinds with Shaw et al.'s value term: one autograd function per branch
# (dense.dense_relative) instead of an SDPA call
VALUE_TERM_KINDS = ("shaw-key-value", "gaussian+shaw")


def _outputs_and_gradients(module, x32, impl, padding, dtype=torch.float32):
    module = module.to(dtype)
    x = x32.to(dtype).clone().requires_grad_(True)
    module.zero_grad()
    out = _run(module, x, impl, padding)
    out.float().pow(2).sum().backward()
    return [out.float(), x.grad.float()] + [p.grad.float() for p in module.parameters() if p.grad is not None]


def _check_against_eager(kind, causal, side, dtype, device, tol):
    T = 37
    module = _module(kind, causal, device=device)
    torch.manual_seed(1)
    x32 = torch.randn(T, B, C, device=device)
    padding = _padding(side, B, T, [T, 20, 1], device=device) if side else None
    ref = _outputs_and_gradients(module, x32, "eager", padding)
    got = _outputs_and_gradients(module, x32, "dense", padding, dtype)
    assert len(got) == len(ref)
    floor = 0.01 * max(t.norm().item() for t in ref)
    for a, b in zip(got, ref):
        assert _relative(a, b, floor) < tol


@pytest.mark.parametrize("side", ["left", "right", None], ids=["left", "right", "unpadded"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_dense_path_equals_the_eager_reference_outputs_and_gradients(kind, causal, side):
    """Every branch kind, the whole output (rows without keys too: left padding under
    HySAN's and the hybrid's windows and causality leaves some, which both paths give
    0) and the gradients of the input and of every parameter (centres' and widths'
    projections, z, a^K, gates, the convolution) == the eager reference's, float32."""
    _check_against_eager(kind, causal, side, torch.float32, "cpu", 1e-5)


@pytest.mark.parametrize("kind", ["gaussian-query", "hysan", "hybrid-gate", "shaw-key", "shaw-key-value",
                                  "gaussian+shaw"])
def test_dense_path_in_bfloat16_is_within_its_rounding(kind):
    _check_against_eager(kind, False, "left", torch.bfloat16, "cpu", 0.05)


class _Spies:
    """Counts SDPA's calls and the calls of the kernels the dense path replaces."""

    def __init__(self, monkeypatch):
        self.sdpa, self.masks, self.other = 0, [], []
        sdpa = F.scaled_dot_product_attention

        def counted(q, k, v, attn_mask=None, **kwargs):
            self.sdpa += 1
            self.masks.append((q, attn_mask, kwargs.get("is_causal", False)))
            return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

        monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
        for module, name in ((choice, "recomputed_attention"), (choice, "banded_attention"),
                             (recompute, "recomputed_attention"), (banded, "banded_attention")):
            original = getattr(module, name)
            monkeypatch.setattr(module, name, self._spy(original, name))
        self.flex = _FlexCalls(monkeypatch)

    def _spy(self, original, name):
        def spy(*args, **kwargs):
            self.other.append(name)
            return original(*args, **kwargs)

        return spy


class _RelativeCalls:
    """Records the attention dropout of each call of :class:`~.dense._RelativeAttention`."""

    def __init__(self, monkeypatch):
        self.dropout = []
        original = dense._RelativeAttention.apply

        def spy(*args):
            self.dropout.append(args[-1])
            return original(*args)

        monkeypatch.setattr(dense._RelativeAttention, "apply", spy)


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "dual-context"])
def test_each_branch_is_one_sdpa_call_with_a_float_mask_and_nothing_else(kind, causal, monkeypatch):
    """In training, each branch of a full pass is one SDPA call, not the fused call, the
    recomputation per block or the band, with a float mask in the query's dtype whose
    rows lie a multiple of 8 elements apart where it is the cached one; a call with
    Shaw et al.'s value term is one call of :class:`~.dense._RelativeAttention` per
    branch instead (no SDPA call, no eager path)."""
    module = _module(kind, causal)
    x = torch.randn(21, B, C, requires_grad=True)
    padding = _padding("right" if causal else "left", B, 21, [21, 13, 5])
    spies = _Spies(monkeypatch)
    relative = _RelativeCalls(monkeypatch)
    _run(module, x, "dense", padding).sum().backward()
    assert spies.flex.count == 0 and spies.other == []
    cores = [m for m in module.modules() if isinstance(m, AttentionCore)]
    branches = sum(len(core.branches) for core in cores)
    assert spies.sdpa == (0 if kind in VALUE_TERM_KINDS else branches)
    assert len(relative.dropout) == (branches if kind in VALUE_TERM_KINDS else 0)
    for q, mask, is_causal in spies.masks:
        assert mask is not None and mask.dtype == q.dtype and not is_causal
        # the cached masks and the biases added to them alike
        assert mask.stride(-1) == 1 and mask.stride(-2) % 8 == 0 and mask.data_ptr() % 16 == 0


@pytest.mark.parametrize("side", ["left", "right", None], ids=["left", "right", "unpadded"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_hysans_branches_go_to_its_gate_stacked_where_the_gate_takes_them_so(causal, side, monkeypatch):
    """Where HySAN's squeeze gate takes all branches at once (CUDA: not a device of
    ``hysan.BRANCH_LOOP_DEVICES``), the branches' SDPA outputs are handed to it stacked
    (:func:`~.dense.dense_windows`: one gate over the L*B rows), rows without keys
    zeroed by one fill over all branches: outputs and every gradient == the eager
    reference's; one SDPA call per branch; the gate's stacked path taken."""
    monkeypatch.setattr(hysan, "BRANCH_LOOP_DEVICES", ())
    stacked = []
    original = hysan._StackedGatedSum.apply
    monkeypatch.setattr(hysan._StackedGatedSum, "apply", lambda *a: stacked.append(1) or original(*a))
    spies = _Spies(monkeypatch)
    _check_against_eager("hysan", causal, side, torch.float32, "cpu", 1e-5)
    branches = 2 if causal else 4
    assert spies.sdpa == branches and stacked == [1]


def test_the_mask_is_made_once_per_padding_mask_and_window_for_all_layers(monkeypatch):
    """Two layers' calls over the same padding mask make each window's float mask once
    (the global branch's, the padding alone, is the float mask of the padding that the
    other calls over it share, :func:`~.sdpa.padding_bias`); a call without padding
    makes none, across passes."""
    made = []
    original = dense._make_mask
    monkeypatch.setattr(dense, "_make_mask", lambda *args: made.append(args) or original(*args))
    masks = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None, **kw: masks.append(attn_mask) or sdpa(q, k, v, attn_mask, **kw))
    names = ("global", "forward", "backward", "local3")
    layers = [AttentionCore(C, H, self_attention=True, branches=[make_branch(n, "encoder") for n in names])
              for _ in range(2)]
    x = torch.randn(15, B, C)
    padding = _padding("left", B, 15, [15, 9, 4])
    for layer in layers:
        _run(layer, x, "dense", padding)
    assert len(made) == 3  # one per window, none for the second layer
    shared = padding_bias(padding, torch.float32, padded=True).untyped_storage().data_ptr()
    assert [m.untyped_storage().data_ptr() == shared for m in masks] == [True, False, False, False] * 2
    made.clear()
    masks.clear()
    y = torch.randn(11, B, C)
    for layer in layers + layers:
        _run(layer, y, "dense", None)
    # without padding: views of one table of distances per window (nothing made per shape)
    assert made == [] and len(masks) == 16 and masks[0] is None
    tables = {m.untyped_storage().data_ptr() for m in masks if m is not None}
    assert len(tables) == 3
    assert all(m.stride(-2) % 8 == 0 and m.data_ptr() % 16 == 0 for m in masks if m is not None)


def test_rows_without_keys_are_zero_and_padding_alone_is_not_repaired(monkeypatch):
    """A left-padded sentence's first queries have no key in a window of 1: their
    output is 0 (as the eager path's); a call whose mask is the keys' padding alone
    (a global branch) is not repaired (no fill)."""
    core = AttentionCore(C, H, self_attention=True, branches=[make_branch("local1", "encoder")])
    x = torch.randn(9, B, C)
    padding = _padding("left", B, 9, [9, 4, 1])
    with torch.no_grad():
        out = _run(core, x, "dense", padding)
        ref = _run(core, x, "eager", padding)
    torch.testing.assert_close(out, ref)
    assert (out[:3, 2] == 0).all() and out[-1, 2].abs().sum() > 0
    q = torch.randn(B, H, 9, C // H)
    ctx = build_context(x, q, q, padding, False, True)
    mask, row_empty = dense._float_mask(ctx, Description(), base_mask(ctx, None)[0])
    assert row_empty is None and torch.isinf(mask).any()  # the padding alone: no repair
    mask, row_empty = dense._make_mask(torch.ones(1, 1, 3, 4, dtype=torch.bool), torch.float32)
    assert row_empty.all() and (mask == 0).all()  # unblocked, zeroed after the call


def test_the_host_knows_which_windows_leave_rows_empty_without_padding():
    """:func:`~.dense.leaves_rows_empty` against the window's mask itself, for windows
    bounded or not on either side, strictly left or right of the diagonal, causal or
    not, at Tq <= Tk."""
    sides = [None, -3, -1, 0, 1, 2, 5]
    for left in sides:
        for right in sides:
            for causal in (False, True):
                for tgt_len, src_len in ((1, 1), (4, 4), (3, 7), (6, 6), (1, 5)):
                    q = torch.arange(tgt_len)[:, None] + src_len - tgt_len
                    d = torch.arange(src_len)[None, :] - q
                    keep = torch.ones_like(d, dtype=torch.bool)
                    if left is not None:
                        keep &= d >= -left
                    if right is not None:
                        keep &= d <= right
                    if causal:
                        keep &= d <= 0
                    want = bool((~keep.any(-1)).any())
                    assert dense.leaves_rows_empty(left, right, causal, tgt_len, src_len) == want, \
                        (left, right, causal, tgt_len, src_len)


def test_the_plain_causal_mask_alone_goes_to_sdpa_as_is_causal(monkeypatch):
    core = AttentionCore(C, H, self_attention=True, causal=True)
    spies = _Spies(monkeypatch)
    x = torch.randn(7, B, C)
    with torch.no_grad():
        out = _run(core, x, "dense", None)
        ref = _run(core, x, "eager", None)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert [(mask, is_causal) for _, mask, is_causal in spies.masks] == [(None, True)]


def test_a_float16_bias_far_below_its_range_keeps_every_visible_key():
    """float16: a bias of -1e6 (a narrow Gaussian window far from the key) is shifted by
    the row's maximum before the cast, so no visible key becomes -inf; the mask's
    blocked key stays -inf; the floored entries get no gradient."""
    bias = torch.tensor([[[[-1e6, -1e6 - 3.0, -1e6 + 5.0, -1e6 - 1e5]]]], requires_grad=True)
    mask = torch.zeros(1, 1, 1, 8, dtype=torch.float16)
    mask[..., 2] = float("-inf")
    total = dense._BiasedMask.apply(None, None, None, bias, mask, torch.float16, 4, 8)
    assert total.dtype == torch.float16 and total.shape == (1, 1, 1, 4) and total.stride(-2) == 8
    assert torch.isfinite(total[..., [0, 1, 3]]).all() and torch.isinf(total[..., 2]).all()
    torch.testing.assert_close(total[..., :2].float().softmax(-1), bias[..., :2].detach().softmax(-1), atol=1e-3,
                               rtol=0)
    total.float().sum().backward()
    assert bias.grad.tolist() == [[[[1.0, 1.0, 1.0, 0.0]]]]  # the last floored at float16's lowest


def test_the_learned_bias_keeps_nothing_of_the_attention_size_for_the_backward_pass():
    """:class:`~.dense._BiasedMask` keeps P, c and the key positions (``B x H x Tq``,
    ``B x Tk``) for its backward pass, not the ``B x H x Tq x Tk`` difference and square
    that autograd's operators would keep; its gradients of P and c == autograd's."""
    torch.manual_seed(0)
    bsz, heads, tq, tk = 2, 3, 5, 7
    k_pos = torch.arange(tk).float().expand(bsz, tk)
    centre = (torch.rand(bsz, heads, tq) * tk).requires_grad_()
    coeff = (-torch.rand(bsz, heads, tq) - 0.1).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        out = dense._BiasedMask.apply(F.pad(k_pos, (0, 1)), centre, coeff, None, None, torch.float32, tk, 8)
    assert max(saved) < bsz * heads * tq * tk
    weights = torch.randn(bsz, heads, tq, tk)
    grads = torch.autograd.grad((out * weights).sum(), (centre, coeff))
    ref = ((k_pos[:, None, None, :] - centre.unsqueeze(-1)) ** 2 * coeff.unsqueeze(-1) * weights).sum()
    for got, want in zip(grads, torch.autograd.grad(ref, (centre, coeff))):
        torch.testing.assert_close(got, want)


def _nan_for_rows_without_keys(monkeypatch):
    """SDPA as some kernels on an accelerator compute it: a row whose keys are all
    ``-inf`` gives NaN (torch's CPU kernels give 0 there, which would hide a missing
    repair)."""
    sdpa = F.scaled_dot_product_attention

    def stand_in(q, k, v, attn_mask=None, **kwargs):
        out = sdpa(q, k, v, attn_mask=attn_mask, **kwargs)
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            empty = torch.isinf(attn_mask).all(-1, keepdim=True)
            out = out.masked_fill(empty, float("nan"))
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", stand_in)


@pytest.mark.parametrize("stacked", [False, True], ids=["per-branch", "stacked"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", ["hysan", "hybrid-gate", "gaussian-query"])
def test_rows_without_keys_are_repaired_where_a_kernel_would_give_nan(kind, causal, stacked, monkeypatch):
    """Left padding under windows and causality leaves rows without keys; with a kernel
    that gives such rows NaN, the dense path's outputs and gradients still equal the
    eager reference's (rows unblocked in the mask, their output zeroed), per branch and
    stacked for HySAN's gate."""
    if stacked:
        monkeypatch.setattr(hysan, "BRANCH_LOOP_DEVICES", ())
    _nan_for_rows_without_keys(monkeypatch)
    _check_against_eager(kind, causal, "left", torch.float32, "cpu", 1e-5)


class _StrictlyLeft(AttentionBranch):
    """A branch of one's own whose window leaves out the diagonal (``-3 <= d <= -1``):
    the first query has no key, with or without padding."""

    name = "strictly_left"

    def describe(self, ctx):
        return Description(window=Window(3, -1))


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_a_window_that_leaves_the_first_row_empty_without_padding_is_repaired(causal, monkeypatch):
    """Without padding the host decides whether a window leaves rows empty
    (:func:`~.dense.leaves_rows_empty`); a branch's window without the diagonal does,
    and its rows are repaired (under a kernel that gives them NaN): == eager."""
    _nan_for_rows_without_keys(monkeypatch)
    torch.manual_seed(2)
    core = AttentionCore(C, H, self_attention=True, causal=causal, branches=[_StrictlyLeft()])
    x32 = torch.randn(10, B, C)
    ref = _outputs_and_gradients(core, x32, "eager", None)
    got = _outputs_and_gradients(core, x32, "dense", None)
    assert ref[0][0].abs().max() == 0 and len(got) == len(ref)
    for a, b in zip(got, ref):
        assert _relative(a, b, 0.01 * max(t.norm().item() for t in ref)) < 1e-5


def test_cuda_paths_on_the_cpu_keep_dense_cores_off_the_fused_calls(monkeypatch):
    """Where ``"auto"`` takes the compiled FlexAttention calls (CUDA's paths, taken on the
    CPU), a core on ``"dense"`` takes none, and equals the eager reference."""
    with emulation.cuda_paths_on_cpu():
        for kind in ("gaussian-query", "hysan", "hybrid-gate", "shaw-key"):
            calls = _FlexCalls(monkeypatch)
            _check_against_eager(kind, False, "left", torch.float32, "cpu", 1e-5)
            assert calls.count == 0, kind
            module = _module(kind, False)
            with torch.no_grad():
                _run(module, torch.randn(9, B, C), "auto", None)
            assert calls.count >= 1, kind  # ("auto" takes them there: the check above could fail)


@pytest.mark.parametrize("kind", ["gaussian-query", "hysan", "shaw-key", "hybrid-gate", "shaw-key-value"])
def test_a_chunk_after_a_cached_prefix_cross_attention_an_attn_mask_and_one_sentence(kind, monkeypatch):
    """Beyond full self-attention passes: several queries after a cached prefix (``Tq <
    Tk``, causal), encoder-decoder attention over a padded source, a caller's float
    ``attn_mask`` (the per-call mask), and a batch of one sentence: each == eager."""
    torch.manual_seed(3)
    relative = _RelativeCalls(monkeypatch)
    module = _module(kind, True).eval()
    prefix, chunk = torch.randn(6, B, C), torch.randn(4, B, C)
    outs = {}
    for impl in ("eager", "dense"):
        set_attention_impl(module, impl)
        state = {}
        with torch.no_grad():
            module(prefix, prefix, prefix, incremental_state=state, need_weights=False)
            outs[impl] = module(chunk, chunk, chunk, incremental_state=state, need_weights=False)[0]
    torch.testing.assert_close(outs["dense"], outs["eager"], atol=2e-6, rtol=1e-5)
    assert len(relative.dropout) == (2 if kind == "shaw-key-value" else 0)  # the prefix's call and the chunk's
    cross = AttentionCore(C, H, branches=[GaussianLocalness(C, H)] if kind == "gaussian-query" else None)
    src, tgt = torch.randn(11, B, C), torch.randn(5, B, C)
    padding = _padding("left", B, 11, [11, 7, 2])
    soft = torch.randn(11, 11) * 0.5
    soft[0, 3] = float("-inf")
    enc = _module(kind, False)
    for name, call in (
        ("cross", lambda m, impl: _cross(m, impl, tgt, src, padding)),
        ("attn_mask", lambda m, impl: _masked(m, impl, src, soft)),
        ("one sentence", lambda m, impl: _run(_impl(m, impl), src[:, :1], impl, None)),
    ):
        mod = cross if name == "cross" else enc
        with torch.no_grad():
            torch.testing.assert_close(call(mod, "dense"), call(mod, "eager"), atol=2e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("kind", ["gaussian-query", "shaw-key", "hysan", "gaussian+shaw"])
def test_a_learned_bias_with_a_callers_soft_attn_mask_has_the_eager_gradients(kind, monkeypatch):
    """A learned bias (the Gaussian: :class:`~.dense._BiasedMask` with ``extra``; Shaw
    et al.'s key term: ``extra`` alone) plus the finite part of a caller's float
    ``attn_mask``: outputs and every gradient == eager's."""
    torch.manual_seed(4)
    module = _module(kind, False)
    x32 = torch.randn(11, B, C)
    soft = torch.randn(11, 11) * 0.5
    soft[0, 3] = float("-inf")

    def run(impl):
        set_attention_impl(module, impl)
        x = x32.clone().requires_grad_(True)
        module.zero_grad()
        out = module(x, x, x, attn_mask=soft, need_weights=False)[0]
        out.pow(2).sum().backward()
        return [out, x.grad] + [p.grad for p in module.parameters() if p.grad is not None]

    relative = _RelativeCalls(monkeypatch)
    ref, got = run("eager"), run("dense")
    assert len(relative.dropout) == (1 if kind == "gaussian+shaw" else 0)
    assert len(got) == len(ref)
    floor = 0.01 * max(t.norm().item() for t in ref)
    for a, b in zip(got, ref):
        assert _relative(a, b, floor) < 1e-5


@pytest.mark.parametrize("kind", ["gaussian-query", "gaussian-head", "shaw-key", "hysan", "shaw-key-value",
                                  "gaussian+shaw"])
def test_dense_path_in_float16_on_the_cpu_is_within_its_rounding(kind):
    """float16 (the Gaussian's bias shifted by its row maximum and floored before the
    cast; with Shaw et al.'s value term a float32 bias): outputs and gradients against
    the float32 eager reference."""
    _check_against_eager(kind, False, "left", torch.float16, "cpu", 0.02)


def _impl(module, impl):
    set_attention_impl(module, impl)
    return module


def _cross(module, impl, tgt, src, padding):
    set_attention_impl(module, impl)
    return module(tgt, src, src, key_padding_mask=padding, need_weights=False)[0]


def _masked(module, impl, x, soft):
    set_attention_impl(module, impl)
    return module(x, x, x, attn_mask=soft, need_weights=False)[0]


def test_a_decoding_step_keeps_the_step_kernels(monkeypatch):
    """One query row (a beam-search step) takes the kernels "auto" takes there, not the
    dense path."""
    core = AttentionCore(C, H, self_attention=True, causal=True, branches=[GaussianLocalness(C, H)]).eval()
    calls = []
    monkeypatch.setattr(dense, "dense_attention", lambda *a, **k: calls.append(1))
    set_attention_impl(core, "dense")
    state = {}
    with torch.no_grad():
        for _ in range(3):
            core(torch.randn(1, B, C), None, None, incremental_state=state, need_weights=False)
    assert calls == []


def test_dense_is_an_attention_impl_and_a_benchmark_choice():
    from fairseq_localness.cli.benchmark import parse_args

    assert "dense" in ATTENTION_IMPLS
    assert parse_args(["--attention-impl", *ATTENTION_IMPLS]).attention_impl == list(ATTENTION_IMPLS)


def test_the_benchmarks_observed_pass_keeps_dense_cores_on_their_path():
    """The benchmark's multiply-adds and saved activations are observed on the eager
    path where a core would run a compiled call (on CUDA, "auto"); a core on "dense"
    has none, so its SDPA calls are what is observed (the memory this path keeps)."""
    from fairseq_localness.cli.bench_measure import observable

    dense_core, auto_core = _module("gaussian-query", False), _module("hysan", False)
    set_attention_impl(dense_core, "dense")
    model = torch.nn.ModuleList([dense_core, auto_core])
    with observable(model, torch.device("cuda")) as switched:
        assert switched and (dense_core.attention_impl, auto_core.attention_impl) == ("dense", "eager")
    assert auto_core.attention_impl == "auto"
    set_attention_impl(auto_core, "dense")
    with observable(model, torch.device("cuda")) as switched:
        assert not switched and auto_core.attention_impl == "dense"


def test_the_benchmarks_saved_bytes_leave_out_the_cached_tables_of_distances():
    """A dense core without padding hands SDPA a view of a cached table of distances,
    whose size depends on the longest call of the process: the benchmark's bytes saved
    for the backward pass count the step's own tensors, not those tables."""
    from fairseq_localness.cli import bench_measure, bench_model

    task = bench_model._Toy(64)
    _, model = bench_model.build("hysan_transformer", "tiny", [], task, torch.device("cpu"))
    set_attention_impl(model, "dense")
    batch = bench_model.make_batch(task, 2, 6, 6, torch.device("cpu"))
    before = bench_measure.measure_static(model, batch, 4, torch.device("cpu"))[1]
    model.train()
    bench_model._loss(model, bench_model.make_batch(task, 1, 300, 300, torch.device("cpu")))  # tables grow
    assert bench_measure.measure_static(model, batch, 4, torch.device("cpu"))[1] == before


@cuda
@pytest.mark.parametrize("side", ["left", "right", None], ids=["left", "right", "unpadded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_dense_path_equals_eager_outputs_and_gradients(kind, causal, dtype, side):
    """On CUDA, SDPA's kernels with the learned biases' gradients (the memory-efficient
    kernel) against the eager reference in float32, outputs and every gradient."""
    _check_against_eager(kind, causal, side, dtype, "cuda", CUDA_TOL[dtype])


def _shaw_inputs(tgt_len, src_len, dtype=torch.float64, bias=True, seed=0):
    """Inputs of :class:`~.dense._RelativeAttention`: q, k, v ``2 x 2 x T x 4``, a bias
    with a blocked key in the first query row (gradients through the rest), ``w^K``, ``w^V`` (K = 2)
    and the buckets of ``RelativePositions``' cached table (queries bottom-right
    aligned)."""
    from fairseq_localness.modules.relative_position import RelativePositions

    gen = torch.Generator().manual_seed(seed)
    rel = RelativePositions(4, 2)
    q, k, v = (torch.randn(2, 2, t, 4, generator=gen, dtype=dtype, requires_grad=True)
               for t in (tgt_len, src_len, src_len))
    terms = None
    if bias:
        terms = torch.randn(2, 2, tgt_len, src_len, generator=gen, dtype=dtype)
        terms[..., 0, -1] = float("-inf")  # a blocked key: no gradient through it
        terms.requires_grad_(True)
    w_k, w_v = (torch.randn(5, 4, generator=gen, dtype=dtype, requires_grad=True) for _ in range(2))
    return q, k, v, terms, w_k, w_v, rel._buckets(tgt_len, src_len, "cpu")[None], rel


def _shaw_reference(q, k, v, terms, w_k, w_v, buckets, scale, keep=None, p=0.0):
    """Shaw et al. (2018), eq. 3-4 written out with the ``Tq x Tk x Dh`` tensors of
    ``a^K_ij`` and ``a^V_ij`` (their section 3.3 avoids them; a test can afford them)."""
    a_k, a_v = w_k[buckets[0]], w_v[buckets[0]]  # Tq x Tk x Dh
    energies = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a_k)) * scale
    if terms is not None:
        energies = energies + terms
    alpha = torch.softmax(energies, -1)
    if keep is not None:
        alpha = alpha * keep / (1 - p)
    return alpha @ v + torch.einsum("bhij,ijd->bhid", alpha, a_v)


@pytest.mark.parametrize("dropout", [0.0, 0.3], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("lengths", [(6, 6), (3, 7)], ids=["full", "after-a-prefix"])
def test_shaws_value_term_function_has_the_gradients_of_its_equations(lengths, dropout):
    """:class:`~.dense._RelativeAttention` in float64: ``gradcheck`` of every input (q,
    k, v, the bias, ``w^K``, ``w^V``), the dropout's mask drawn alike in every call (the
    generator seeded before each), and its output == eq. 3-4 written out with that
    mask (and without dropout, with none)."""
    q, k, v, terms, w_k, w_v, buckets, _ = _shaw_inputs(*lengths)
    scale = 0.5

    def call(*inputs):
        torch.manual_seed(11)
        return dense._RelativeAttention.apply(*inputs[:6], buckets, scale, dropout)

    inputs = (q, k, v, terms, w_k, w_v)
    assert torch.autograd.gradcheck(call, inputs)
    keep = None
    if dropout:
        torch.manual_seed(11)
        keep = torch.ops.aten.native_dropout(torch.empty(2, 2, *lengths), dropout, True)[1]
        assert 0 < keep.sum() < keep.numel()
    want = _shaw_reference(*inputs, buckets, scale, keep, dropout)
    torch.testing.assert_close(call(*inputs), want)


def test_shaws_value_term_function_without_a_bias_and_in_half_precision():
    """No bias (the call's mask and score terms none), and in bfloat16 and float16 against
    the float64 equations: outputs and every gradient within half precision's
    rounding."""
    q, k, v, _, w_k, w_v, buckets, _ = _shaw_inputs(5, 5, bias=False)
    want = _shaw_reference(q, k, v, None, w_k, w_v, buckets, 0.5)
    grads = torch.autograd.grad(want.pow(2).sum(), (q, k, v, w_k, w_v))
    for dtype in (torch.float64, torch.bfloat16, torch.float16):
        inputs = [t.detach().to(dtype).requires_grad_(True) for t in (q, k, v)]
        embeddings = [t.detach().to(dtype).requires_grad_(True) for t in (w_k, w_v)]
        got = dense._RelativeAttention.apply(*inputs, None, *embeddings, buckets, 0.5, 0.0)
        assert got.dtype == dtype
        got_grads = torch.autograd.grad(got.double().pow(2).sum(), inputs + embeddings)
        tol = 1e-10 if dtype == torch.float64 else 0.03
        assert _relative(got, want) < tol, dtype
        for a, b in zip(got_grads, grads):
            assert a.dtype == dtype and _relative(a, b) < tol, dtype


def test_the_value_term_with_attention_dropout_takes_the_function_where_cuda_would(monkeypatch):
    """With attention dropout (which the fused call does not draw): on CUDA's paths the
    value term is one call of the function per branch under every setting but
    ``"eager"``; on the CPU's own paths ``"auto"`` keeps the eager path and ``"dense"``
    takes the function. Without dropout, ``"auto"`` on CUDA's paths keeps the fused
    call."""
    relative = _RelativeCalls(monkeypatch)
    flex_calls = _FlexCalls(monkeypatch)

    def calls(impl, dropout=0.25):
        module = KINDS["gaussian+shaw"](False).train()
        module.dropout_module.p = dropout
        before = len(relative.dropout)
        x = torch.randn(9, B, C, requires_grad=True)
        _run(module, x, impl, _padding("left", B, 9, [9, 5, 2])).sum().backward()
        return relative.dropout[before:]

    assert calls("auto") == [] and calls("eager") == []
    assert calls("dense") == [0.25]
    with emulation.cuda_paths_on_cpu():
        assert calls("auto") == [0.25] and calls("sdpa") == [0.25] and calls("dense") == [0.25]
        assert calls("eager") == []
        assert calls("auto", dropout=0.0) == [] and flex_calls.count == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["shaw-key-value", "gaussian+shaw"])
def test_the_value_term_function_keeps_less_for_the_backward_pass_than_the_eager_path(kind, dtype):
    """With attention dropout, the bytes of the tensors kept for the backward pass (each
    storage once) by a sublayer with Shaw et al.'s value term: under 0.75 of the eager
    path's (measured 0.53-0.68: the eager path also keeps the dropped distribution in
    the values' dtype, and its Gaussian's ``Tq x Tk`` intermediates)."""
    module = KINDS[kind](False).to(dtype).train()
    module.dropout_module.p = 0.1
    kept = {}
    for impl in ("eager", "dense"):
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        x = torch.randn(40, B, C, dtype=dtype, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _run(module, x, impl, _padding("left", B, 40, [40, 30, 9]))
        kept[impl] = sum(storages.values())
    assert kept["dense"] < 0.75 * kept["eager"], kept


@pytest.mark.parametrize("kind", ["shaw-key-value", "gaussian+shaw"])
def test_the_value_terms_dropout_route_equals_the_eager_path_where_dropout_keeps_everything(kind, monkeypatch):
    """Attention dropout drawn but keeping every entry (p = 1e-12): on CUDA's paths under
    ``"auto"`` and ``"sdpa"``, and with ``"dense"`` on the CPU's, the function's outputs
    and every gradient == the eager path's: Shaw et al.'s key term counted once (the
    core adds it to the call's soft bias only where the function does not compute it)."""
    relative = _RelativeCalls(monkeypatch)
    module = _module(kind, False).train()
    module.dropout_module.p = 1e-12
    torch.manual_seed(5)
    x32 = torch.randn(13, B, C)
    padding = _padding("left", B, 13, [13, 8, 2])

    def run(impl):
        x = x32.clone().requires_grad_(True)
        module.zero_grad()
        out = _run(module, x, impl, padding)
        out.pow(2).sum().backward()
        return [out, x.grad] + [p.grad for p in module.parameters() if p.grad is not None]

    ref = run("eager")
    floor = 0.01 * max(t.norm().item() for t in ref)
    runs = [("dense", False)] + [(impl, True) for impl in ("auto", "sdpa", "dense")]
    for impl, cuda_paths in runs:
        before = len(relative.dropout)
        with emulation.cuda_paths_on_cpu() if cuda_paths else contextlib.nullcontext():
            got = run(impl)
        assert relative.dropout[before:] == [1e-12], impl
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert _relative(a, b, floor) < 1e-5, impl


@pytest.mark.parametrize("impl, device, tgt_len, dropout, value_term, route", [
    ("auto", "cuda", 9, False, True, "fused"),  # the fused call computes both terms
    ("sdpa", "cpu", 9, False, True, "fused"),
    ("auto", "cuda", 1, True, True, "eager"),  # (a beam-search step draws no dropout in practice)
    ("auto", "cuda", 9, True, True, "function"),  # the fused call draws no dropout
    ("sdpa", "cuda", 9, True, True, "function"),
    ("auto", "cpu", 9, True, True, "eager"),  # the CPU keeps the path measured there
    ("dense", "cpu", 9, False, True, "function"),
    ("dense", "cpu", 1, False, True, "fused"),  # one query row: the step kernel
    ("dense", "cpu", 9, False, False, "bias"),  # the key term alone: SDPA's float mask
    ("auto", "cpu", 9, True, False, "bias"),
])
def test_the_relative_terms_route_is_one_rule(impl, device, tgt_len, dropout, value_term, route):
    assert choice.relative_route(impl, torch.device(device), tgt_len, dropout, value_term) == route


def test_the_value_term_function_under_dropout_one_keeps_nothing_and_stays_finite():
    """p = 1: every weight dropped, so the output is 0 and so is every gradient (no
    division by ``1 - p``)."""
    q, k, v, terms, w_k, w_v, buckets, _ = _shaw_inputs(4, 4, dtype=torch.float32)
    out = dense._RelativeAttention.apply(q, k, v, terms, w_k, w_v, buckets, 0.5, 1.0)
    assert torch.equal(out, torch.zeros_like(out))
    grads = torch.autograd.grad(out.sum(), (q, k, v, terms, w_k, w_v))
    for grad in grads:
        assert torch.isfinite(grad).all() and not grad.any()


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
@pytest.mark.parametrize("kind", VALUE_TERM_KINDS)
def test_cuda_value_terms_dropout_route_equals_eager(kind, dtype, monkeypatch):
    """On CUDA, ``"auto"`` with attention dropout (drawn, keeping everything: p = 1e-12)
    takes the function for Shaw et al.'s value term: outputs and every gradient against
    the float32 eager reference."""
    relative = _RelativeCalls(monkeypatch)
    module = _module(kind, False, device="cuda").train()
    module.dropout_module.p = 1e-12
    torch.manual_seed(1)
    x32 = torch.randn(37, B, C, device="cuda")
    padding = _padding("left", B, 37, [37, 20, 1], device="cuda")
    ref = _outputs_and_gradients(module, x32, "eager", padding)
    got = _outputs_and_gradients(module, x32, "auto", padding, dtype)
    assert relative.dropout == [1e-12]
    assert len(got) == len(ref)
    floor = 0.01 * max(t.norm().item() for t in ref)
    for a, b in zip(got, ref):
        assert _relative(a, b, floor) < CUDA_TOL[dtype]
