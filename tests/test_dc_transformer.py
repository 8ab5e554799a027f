"""dc_transformer (the Dual Contextual module): the convolution by hand and rebuilt in
float64, eq. 6-9 rebuilt in float64, causality, incremental decoding (one and several
steps at a time) with beam reordering, batch invariance, parity with fairseq's
transformer, empty rows, parameter fingerprints, option validation, the
Jensen-Shannon divergence (eq. 10-13), CLI."""
import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_localness.analysis.divergence import dc_divergence
from fairseq_localness.models._locality import OptionError
from fairseq_localness.models.dc_transformer import DCOptions
from fairseq_localness.modules import dual_context, projections
from fairseq_localness.modules.attention import set_attention_impl
from fairseq_localness.modules.incremental import MIN_STEPS
from fairseq_localness.modules.observe import AttentionRecorder
from fairseq_localness.modules.dual_context import (
    DualContextModule,
    LocalContextUnit,
    js_divergence,
    kernel_split,
    reduce_heads,
    reduced_js,
)
from fairseq_localness.modules.projections import stacked_linear
from model_utils import (
    TINY, OperatorCalls, build_model, check_equals_fairseq_transformer, check_generation_batch_invariance, command_line_error,
    count_parameters, parse_model_args, random_batch,
)

ARCH = "dc_transformer"
C, H = 8, 2
MODES = {"enc": ["--dc-mode", "enc"], "dec": ["--dc-mode", "dec"], "full": ["--dc-mode", "full"]}


def _left_padding(lengths, total):
    return torch.stack([torch.arange(total) < total - n for n in lengths])


# ---------------------------------------------------------------- Local Context Unit
def test_kernel_splits():
    # encoder: floor(f/2) tokens on the left (eq. 6's window start t - f/2)
    assert [kernel_split(f, causal=False) for f in (1, 2, 3, 4, 5)] == [(0, 0), (1, 0), (1, 1), (2, 1), (2, 2)]
    # decoder: causal
    assert [kernel_split(f, causal=True) for f in (1, 2, 3, 4)] == [(0, 0), (1, 0), (2, 0), (3, 0)]


def _unit_with_hand_weights(kernel_size, causal, value_taps):
    """C = 1: value channel = sum_k value_taps[k] * x_(window k); gate pre-activation 0,
    so GLU = 0.5 * value."""
    unit = LocalContextUnit(1, kernel_size, causal=causal).double()
    with torch.no_grad():
        unit.conv.weight.zero_()
        unit.conv.bias.zero_()
        unit.conv.weight[0, 0] = torch.tensor(value_taps, dtype=torch.float64)
    return unit


@pytest.mark.parametrize(
    "kernel_size,causal,taps,expected",
    [
        # r = [1, 2, 3] (after two padding slots holding 100, which must be zeroed)
        (2, False, [1.0, 10.0], [0.5 * (0 + 10), 0.5 * (1 + 20), 0.5 * (2 + 30)]),  # [t-1, t]
        (3, False, [1.0, 10.0, 100.0], [0.5 * (0 + 10 + 200), 0.5 * (1 + 20 + 300), 0.5 * (2 + 30 + 0)]),
        (4, False, [1.0, 10.0, 100.0, 1000.0],  # [t-2, t-1, t, t+1]
         [0.5 * (0 + 0 + 100 + 2000), 0.5 * (0 + 10 + 200 + 3000), 0.5 * (1 + 20 + 300 + 0)]),
        (3, True, [1.0, 10.0, 100.0], [0.5 * (0 + 0 + 100), 0.5 * (0 + 10 + 200), 0.5 * (1 + 20 + 300)]),
        (1, False, [10.0], [5.0, 10.0, 15.0]),
    ],
)
def test_convolution_by_hand_with_left_padding(kernel_size, causal, taps, expected):
    unit = _unit_with_hand_weights(kernel_size, causal, taps)
    r = torch.tensor([100.0, 100.0, 1.0, 2.0, 3.0], dtype=torch.float64).view(5, 1, 1)  # T x B x C
    pad = torch.tensor([[True, True, False, False, False]])
    out = unit.convolve(r, pad)
    assert out[2:, 0, 0].tolist() == pytest.approx(expected, abs=1e-12)


def _conv_reference(unit: LocalContextUnit, r, pad):
    """Eq. 6's r_hat token by token in float64: the window of each real token, zeros
    outside the sentence, [r_(t-a), ..., r_(t+b)] W_r + b_r, then GLU."""
    T, B, Cd = r.shape
    W = unit.conv.weight.double()  # 2C x C x f
    out = torch.zeros(T, B, Cd, dtype=torch.float64)
    for b in range(B):
        real = [t for t in range(T) if pad is None or not pad[b, t]]
        for n, t in enumerate(real):
            pre = unit.conv.bias.double().clone()
            for k in range(unit.kernel_size):
                m = n - unit.left + k  # index among the real tokens
                if 0 <= m < len(real):
                    pre = pre + W[:, :, k] @ r[real[m], b].double()
            out[t, b] = pre[:Cd] * torch.sigmoid(pre[Cd:])
    return out


@pytest.mark.parametrize("kernel_size", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
def test_convolution_equals_float64_reference_on_a_left_padded_batch(kernel_size, causal):
    torch.manual_seed(kernel_size)
    unit = LocalContextUnit(C, kernel_size, causal=causal).double()
    torch.nn.init.normal_(unit.conv.bias)
    r = torch.randn(6, 3, C, dtype=torch.float64)
    pad = _left_padding([6, 2, 4], 6)
    ref = _conv_reference(unit, r, pad)
    out = unit.convolve(r, pad)
    keep = ~pad.t()
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-12, rtol=1e-10)
    # lc = LayerNorm(r_hat + r) (eq. 6)
    lc = unit(r, pad)
    torch.testing.assert_close(lc[keep], F.layer_norm(ref + r, (C,), unit.layer_norm.weight.double(),
                                                      unit.layer_norm.bias.double())[keep])


def test_causal_convolution_never_sees_the_future():
    torch.manual_seed(0)
    unit = LocalContextUnit(C, 3, causal=True)
    r = torch.randn(7, 2, C)
    changed = r.clone()
    changed[4:] = torch.randn(3, 2, C) * 10
    torch.testing.assert_close(unit(changed)[:4], unit(r)[:4], rtol=0, atol=0)
    assert not torch.allclose(unit(changed)[4:], unit(r)[4:])


def _reorder(module, state, order):
    for sub in module.modules():
        if hasattr(sub, "reorder_incremental_state"):
            sub.reorder_incremental_state(state, order)


@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("kernel_size", [1, 2, 4])
def test_convolution_cache_several_steps_at_once_and_reordered(kernel_size, grad):
    """Steps and chunks of the Local Context Unit, with a reorder (a repeated row) and
    padding on one step, give the full pass; without gradients (beam search) the steps
    take the window side by side with W_r's positions outermost (built once per
    search), with gradients the unfolded window."""
    torch.manual_seed(0)
    unit = LocalContextUnit(C, kernel_size, causal=True)
    r = torch.randn(9, 3, C)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 5] = True
    order = torch.tensor([2, 0, 0])
    with torch.set_grad_enabled(grad):
        full = unit(r, pad)
        state, outs = {}, []
        for start, end in [(0, 1), (1, 2), (2, 5), (5, 6), (6, 7), (7, 9)]:
            outs.append(unit(r[start:end], pad[:, start:end], incremental_state=state))
            if end == 5:
                _reorder(unit, state, order)
                r, pad, full, outs = r[:, order], pad[order], full[:, order], [o[:, order] for o in outs]
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-6, rtol=1e-5)


def test_a_convolution_step_without_gradients_concatenates_instead_of_unfolding():
    """A beam-search step of the Local Context Unit: its window is one concatenation of
    the cached inputs and this one, one product, the GLU (no unfold, no copy of the
    unfolded window)."""
    torch.manual_seed(0)
    unit = LocalContextUnit(C, 3, causal=True).eval()
    r = torch.randn(4, 2, C)
    with torch.no_grad():
        state = {}
        for t in range(3):
            unit(r[t : t + 1], incremental_state=state)
        with OperatorCalls() as step:
            unit(r[3:], incremental_state=state)
    assert "unfold" not in step.names and "clone" not in step.names
    assert step.names.count("cat") == 1 and step.names.count("addmm") == 1 and step.names.count("glu") == 1


def test_decoder_steps_past_the_cache_room_with_reorders_equal_the_full_pass(monkeypatch):
    """Beam-search steps of the DC module (both FI units as one attention of 2H heads
    over their joint cache, its store filled past its first room and reordered, the
    batch shrinking as sentences finish) give the full teacher-forced pass, and bit for
    bit what the cores' own forward passes give for the same steps."""
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).eval()
    steps = MIN_STEPS + 4
    reorders = {2: torch.tensor([2, 0, 0]), MIN_STEPS: torch.tensor([1, 2])}

    def decode(r):
        state, outs = {}, []
        with torch.no_grad():
            for t in range(steps):
                x = r[t : t + 1]
                outs.append(dc(x, x, x, incremental_state=state)[0])
                if t in reorders:
                    _reorder(dc, state, reorders[t])
                    r, outs = r[:, reorders[t]], [o[:, reorders[t]] for o in outs]
        return torch.cat(outs), r

    r = torch.randn(steps, 3, C)
    out, reordered = decode(r)
    full, _ = dc(reordered, reordered, reordered)
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-4)
    monkeypatch.setattr(DualContextModule, "_plain_step", lambda self, *args: False)
    through_cores, _ = decode(r)
    torch.testing.assert_close(out, through_cores, rtol=0, atol=0)


@pytest.mark.parametrize("start", ["step", "chunk"])
def test_decoder_steps_switch_between_the_joint_cache_and_the_units_own(start):
    """Steps of beam search (the joint step, no gradients), chunks of several steps and a
    step with gradients (the FI units' own path and caches), in any order, with
    reorders (one of them dropping a finished sentence) while either holds the steps,
    and padding masks given to some passes (a uint8 one too), give the full pass: each
    path takes over the other's cached steps."""
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).eval()
    r = torch.randn(11, 4, C)
    pad = torch.zeros(4, 11, dtype=torch.bool)
    pad[1, 1] = pad[1, 3] = pad[2, 6] = True  # keys that no later step may see
    # (start, end, gradients, padding given): the units' path for chunks and the step with gradients
    plan = [(0, 1, False), (1, 2, False), (2, 5, False), (5, 6, False), (6, 7, True), (7, 8, False),
            (8, 10, False), (10, 11, False)]
    if start == "chunk":  # a chunk first (its padding mask uint8), then a joint step takes its steps over
        plan = [(0, 2, False), (2, 3, False), (3, 5, False)] + plan[3:]
    reorders = {2: torch.tensor([3, 0, 1, 2]), 5: torch.tensor([1, 1, 2, 0]), 7: torch.tensor([0, 2, 1]),
                10: torch.tensor([2, 0, 1])}  # at 7 a sentence finishes: 3 rows go on
    state, outs = {}, []
    for i, (first, end, grad) in enumerate(plan):
        x = r[first:end]
        mask = pad[:, first:end]
        mask = mask.to(torch.uint8) if i == 0 else mask
        with torch.set_grad_enabled(grad):
            outs.append(dc(x, x, x, key_padding_mask=mask, incremental_state=state)[0].detach())
        if end in reorders:
            order = reorders[end]
            _reorder(dc, state, order)
            r, pad, outs = r[:, order], pad[order], [o[:, order] for o in outs]
    with torch.no_grad():
        full, _ = dc(r, r, r, key_padding_mask=pad)
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-5, rtol=1e-4)


def test_joint_steps_and_the_units_own_beam_search_steps_take_over_each_others_steps():
    """Beam-search steps (no gradients) alternate between the joint step and the units'
    own calls (the eager path: the global unit then keeps its steps in its own step
    store, the local unit in its cache), with reorders between and after: each takes
    the other's steps over, and the steps give the full pass."""
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).eval()
    r = torch.randn(8, 3, C)
    reorders = {3: torch.tensor([2, 0, 1]), 5: torch.tensor([1, 1, 0])}
    state, outs = {}, []
    with torch.no_grad():
        for t in range(8):
            set_attention_impl(dc, "eager" if t in (2, 3, 4, 6) else "auto")
            x = r[t : t + 1]
            outs.append(dc(x, x, x, incremental_state=state)[0])
            if t in reorders:
                _reorder(dc, state, reorders[t])
                r, outs = r[:, reorders[t]], [o[:, reorders[t]] for o in outs]
        set_attention_impl(dc, "auto")
        full, _ = dc(r, r, r)
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-5, rtol=1e-4)


def test_a_beam_search_step_is_one_attention_of_both_units():
    """One step without gradients: the two units' queries, keys and values in two
    products (r's and lc's, stacked once, not per step), one product of the queries with the cached
    keys and one with the values for both units, one softmax; the aggregation and the
    Local Context Unit's product; and a reorder index-selects one joint cache besides
    the unit's window."""
    torch.manual_seed(0)
    dc = DualContextModule(16, 4, kernel_size=2, causal=True).eval()
    r, state = torch.randn(6, 5, 16), {}
    with torch.no_grad():
        for t in range(6):
            x = r[t : t + 1]
            if t < 5:
                dc(x, x, x, incremental_state=state)
        with OperatorCalls() as step:
            dc(x, x, x, incremental_state=state)
        with OperatorCalls() as reorder:
            _reorder(dc, state, torch.tensor([4, 3, 2, 1, 0]))
    assert step.names.count("addmm") == 4 and step.names.count("bmm") == 2 and "cat" in step.names  # (the window's)
    assert step.names.count("cat") == 1
    assert reorder.names.count("index_select") == 2


def test_a_dc_module_moved_to_another_dtype_during_a_search_steps_on():
    """A search whose module goes to bfloat16 between two steps steps on: the joint
    step's stacked weights and the Local Context Unit's follow the parameters' dtype,
    and the cached keys, values and inputs are taken in the new one."""
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).eval()
    r, state, outs = torch.randn(4, 2, C), {}, []
    with torch.no_grad():
        for t in range(4):
            if t == 2:
                dc.to(torch.bfloat16)
                r = r.to(torch.bfloat16)
            x = r[t : t + 1]
            outs.append(dc(x, x, x, incremental_state=state)[0])
        full, _ = dc(r, r, r)
    torch.testing.assert_close(torch.cat(outs[2:]), full[2:], atol=3e-2, rtol=3e-2)


def test_each_search_decodes_with_the_parameters_it_starts_with():
    """The joint step's stacked weights live in the search's incremental state: a new
    search uses the parameters as they are then, however they were changed (in place,
    through ``.data`` as fairseq's optimizers write, or replaced), and a module built
    under ``torch.inference_mode`` decodes too."""
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).eval()
    r = torch.randn(4, 2, C)

    def check(module):
        state, outs = {}, []
        with torch.no_grad():
            for t in range(4):
                x = r[t : t + 1]
                outs.append(module(x, x, x, incremental_state=state)[0])
            full, _ = module(r, r, r)
        torch.testing.assert_close(torch.cat(outs), full, atol=1e-5, rtol=1e-4)
        return torch.cat(outs)

    first = check(dc)
    with torch.no_grad():
        dc.fi_local.k_proj.weight.mul_(2.0)
    dc.fi_global.q_proj.bias.data.add_(1.0)  # no version counter bump
    dc.fi_global.v_proj.weight = torch.nn.Parameter(torch.randn_like(dc.fi_global.v_proj.weight))
    assert not torch.allclose(check(dc), first)
    with torch.inference_mode():
        torch.manual_seed(0)
        built = DualContextModule(C, H, kernel_size=2, causal=True).eval()
        check(built)


# ---------------------------------------------------------------- eq. 6-9 in float64
def _attention_reference(q_in, kv_in, core, pad, causal):
    """Multi-head attention without output projection (eq. 7), float64, by hand."""
    T, B, Cd = q_in.shape
    dh = Cd // core.num_heads
    q = q_in @ core.q_proj.weight.double().t() + core.q_proj.bias.double()
    k = kv_in @ core.k_proj.weight.double().t() + core.k_proj.bias.double()
    v = kv_in @ core.v_proj.weight.double().t() + core.v_proj.bias.double()
    out = torch.zeros(T, B, Cd, dtype=torch.float64)
    for b in range(B):
        for i in range(T):
            keys = [j for j in range(T) if not pad[b, j] and (not causal or j <= i)]
            if not keys:
                continue
            for h in range(core.num_heads):
                sl = slice(h * dh, (h + 1) * dh)
                e = torch.stack([q[i, b, sl] @ k[j, b, sl] for j in keys]) / math.sqrt(dh)
                a = torch.softmax(e, 0)
                out[i, b, sl] = sum(a[n] * v[j, b, sl] for n, j in enumerate(keys))
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_dc_module_equals_paper_equations_float64(causal):
    torch.manual_seed(1)
    dc = DualContextModule(C, H, kernel_size=3, causal=causal).double().eval()
    r = torch.randn(5, 3, C, dtype=torch.float64)
    pad = _left_padding([5, 3, 4], 5)
    z_hat, _ = dc(r, r, r, key_padding_mask=pad)

    lc = F.layer_norm(_conv_reference(dc.local_context, r, pad) + r, (C,),
                      dc.local_context.layer_norm.weight.double(), dc.local_context.layer_norm.bias.double())
    h_l = _attention_reference(r, lc, dc.fi_local, pad, causal)  # FI(r, lc)
    h_g = _attention_reference(r, r, dc.fi_global, pad, causal)  # FI(r, r)
    ref = torch.cat([h_l, h_g], -1) @ dc.aggregate.weight.double().t() + dc.aggregate.bias.double()  # eq. 8
    keep = ~pad.t()
    torch.testing.assert_close(z_hat[keep], ref[keep], atol=1e-10, rtol=1e-9)


def test_stacked_projections_equal_the_units_own_and_keep_no_stacked_weight(monkeypatch):
    """A pass without incremental state on a device of ``STACKED_PROJECTION_DEVICES``
    (CUDA; here the CPU too) computes the FI units' six projections as two products
    (``DualContextModule._projections``): outputs and the gradients of the
    input and of every parameter equal those of the units' own projections (float64),
    and what the pass keeps for the backward pass holds no stacked weight (the
    product's backward builds it again)."""
    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(3)
    dc = DualContextModule(C, H, kernel_size=2, causal=False).double().train()
    r = torch.randn(5, 3, C, dtype=torch.float64)
    pad = _left_padding([5, 3, 4], 5)

    params = {p.untyped_storage().data_ptr() for p in dc.parameters()}

    def run():
        x = r.clone().requires_grad_(True)
        saved = []  # the 2-D tensors kept that are no parameter's storage
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: (t.dim() == 2 and t.untyped_storage().data_ptr() not in params
                           and saved.append(tuple(t.shape))) or t, lambda t: t):
            z, _ = dc(x, x, x, key_padding_mask=pad)
        dc.zero_grad(set_to_none=True)
        (z * torch.linspace(-1, 1, C, dtype=z.dtype)).sum().backward()
        return [z, x.grad] + [p.grad.clone() for p in dc.parameters()], saved

    calls = []
    monkeypatch.setattr(dual_context, "stacked_linear", lambda *a: calls.append(1) or stacked_linear(*a))
    stacked, saved = run()
    assert len(calls) == 2  # r's four projections, lc's two
    stacked_weights = [shape for shape in saved if sorted(shape) in ([C, 2 * C], [C, 4 * C])]  # or transposed
    assert saved and not stacked_weights, saved  # (the aggregate's input is kept)
    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda",))  # each unit its own
    own, _ = run()
    assert len(calls) == 2
    for a, b in zip(stacked, own):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_stacked_projections_equal_the_cpu_pass():
    """On CUDA a training pass takes the stacked projections and both FI units as one
    call (the joint pass): outputs and gradients (of the input and every parameter)
    equal the CPU's pass, which projects and attends per unit (float32)."""
    torch.manual_seed(5)
    dc = DualContextModule(32, 4, kernel_size=2, causal=True).train()
    r = torch.randn(7, 3, 32)
    pad = _left_padding([7, 5, 6], 7)

    def run(device):
        module = dc.to(device)
        x = r.detach().to(device).requires_grad_(True)  # a leaf on each device
        z, _ = module(x, x, x, key_padding_mask=pad.to(device))
        module.zero_grad(set_to_none=True)
        (z * torch.linspace(-1, 1, 32, device=device)).sum().backward()
        return [t.detach().cpu() for t in [z, x.grad] + [p.grad for p in module.parameters()]]

    want = run("cpu")
    calls = []
    originals = dual_context.stacked_projection, dual_context.masked_attention
    dual_context.stacked_projection = lambda *a: calls.append("product") or originals[0](*a)
    dual_context.masked_attention = lambda *a: calls.append("attention") or originals[1](*a)
    try:
        got = run("cuda")
    finally:
        dual_context.stacked_projection, dual_context.masked_attention = originals
    assert sorted(calls) == ["attention", "product", "product"]  # r's four projections, lc's two; one call
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def _count_joint_calls(monkeypatch, calls):
    """Append to ``calls`` at each fused call of the joint pass (the encoder's
    ``padding_attention``, the decoder's ``masked_attention``)."""
    for name in ("masked_attention", "padding_attention"):
        original = getattr(dual_context, name)
        monkeypatch.setattr(dual_context, name, lambda *args, f=original: calls.append(1) or f(*args))


@pytest.mark.parametrize("causal, padding", [(False, "left"), (False, None), (True, None), (True, "left"),
                                             (True, "right")])
def test_the_joint_pass_equals_the_units_own_calls(causal, padding, monkeypatch):
    """A training pass with both FI units as one call of 2H heads (CUDA's path, run here
    on the CPU) gives the units' own calls' output and gradients (of the input and of
    every parameter), with padding on either side (left-padded decoder rows see no key
    and give zeros) and causality; it is one call, and not taken while recording."""
    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    dc = DualContextModule(16, 4, kernel_size=2, causal=causal)
    r = torch.randn(7, 3, 16)
    pad = None if padding is None else (_left_padding([7, 5, 3], 7) if padding == "left"
                                        else torch.stack([torch.arange(7) >= n for n in (7, 5, 3)]))
    calls = []
    _count_joint_calls(monkeypatch, calls)

    def run(joint):
        monkeypatch.setattr(dual_context, "JOINT_PASS_DEVICES", ("cuda", "cpu") if joint else ("cuda",))
        x = r.clone().requires_grad_()
        dc.zero_grad()
        out, _ = dc(x, x, x, key_padding_mask=pad)
        out.pow(2).sum().backward()
        return out, x.grad, {n: p.grad.clone() for n, p in dc.named_parameters()}

    out, grad, grads = run(True)
    assert len(calls) == 1
    ref, ref_grad, ref_grads = run(False)
    assert len(calls) == 1
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grad, ref_grad, atol=1e-5, rtol=1e-4)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    monkeypatch.setattr(dual_context, "JOINT_PASS_DEVICES", ("cuda", "cpu"))
    with AttentionRecorder(dc):
        dc(r, r, r, key_padding_mask=pad)
    assert len(calls) == 1


def test_the_joint_pass_is_not_taken_where_the_units_compute_otherwise(monkeypatch):
    """The joint pass leaves a call to the units' own path where they do something it
    does not: an ``attn_mask`` of a non-causal module (a causal one ignores fairseq's
    future mask, and takes the joint pass with it), the eager and flex paths, and
    validation with the divergence logged (the units' distributions are needed)."""
    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(dual_context, "JOINT_PASS_DEVICES", ("cuda", "cpu"))
    calls = []
    _count_joint_calls(monkeypatch, calls)
    torch.manual_seed(0)
    r = torch.randn(6, 2, 16)
    blocked_first = torch.zeros(6, 6)
    blocked_first[:, 0] = float("-inf")
    encoder = DualContextModule(16, 4, kernel_size=2).eval()
    with torch.no_grad():
        masked, _ = encoder(r, r, r, attn_mask=blocked_first)
        assert calls == []
        monkeypatch.setattr(dual_context, "JOINT_PASS_DEVICES", ("cuda",))
        torch.testing.assert_close(masked, encoder(r, r, r, attn_mask=blocked_first)[0])  # the units' own
        monkeypatch.setattr(dual_context, "JOINT_PASS_DEVICES", ("cuda", "cpu"))
        decoder = DualContextModule(16, 4, kernel_size=2, causal=True).eval()
        future = torch.triu(torch.full((6, 6), float("-inf")), 1)
        decoder(r, r, r, attn_mask=future)
        assert calls == [1]
        for impl in ("eager", "flex"):
            set_attention_impl(decoder, impl)
            decoder(r, r, r)
        assert calls == [1]
    from fairseq.logging import metrics

    model, task = build_model(ARCH, TINY + MODES["enc"] + ["--dc-log-divergence"])
    src, lens, prev, _ = random_batch(task, [6, 3], seed=3)
    with torch.no_grad():
        model(src, lens, prev)  # inference: the joint pass, in each DC encoder layer
        assert len(calls) > 1
        del calls[:]
        with metrics.aggregate(new_root=True) as agg, metrics.aggregate("valid"):
            model(src, lens, prev)  # fairseq's validation: the units' distributions are logged
    assert calls == [] and "enc1_js" in agg.get_smoothed_values()


def test_projections_of_the_caller_need_a_pass_without_incremental_state():
    dc = DualContextModule(C, H, kernel_size=2, causal=True)
    r = torch.randn(1, 2, C)
    q = (r, r, r)
    with pytest.raises(ValueError, match="projections given with incremental_state"):
        dc.fi_global(r, r, r, incremental_state={}, projections=q)


def test_layer_applies_eq9_around_the_module():
    """z_f = LayerNorm(z_hat + r): the layer's self_attn_layer_norm gets exactly z_hat + r."""
    model, task = build_model(ARCH, TINY + MODES["enc"])
    layer = model.encoder.layers[1]
    seen = {}
    layer.self_attn.register_forward_hook(lambda m, args, kwargs, out: seen.update(r=kwargs["query"], z=out[0]),
                                          with_kwargs=True)
    layer.self_attn_layer_norm.register_forward_hook(lambda m, args, out: seen.update(ln_in=args[0], ln_out=out))
    src, lens, prev, _ = random_batch(task, [6, 4])
    with torch.no_grad():
        model(src, lens, prev)
    torch.testing.assert_close(seen["ln_in"], seen["z"] + seen["r"], rtol=0, atol=0)
    torch.testing.assert_close(seen["ln_out"], layer.self_attn_layer_norm(seen["z"] + seen["r"]))


def test_sdpa_and_eager_paths_agree():
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).eval()
    r = torch.randn(6, 2, C)
    pad = _left_padding([6, 3], 6)
    fast, _ = dc(r, r, r, key_padding_mask=pad)
    dc.fi_local.attention_impl = dc.fi_global.attention_impl = "eager"
    slow, _ = dc(r, r, r, key_padding_mask=pad)
    keep = ~pad.t()
    torch.testing.assert_close(fast[keep], slow[keep], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- parity
@pytest.mark.parametrize("off", [["--dc-mode", "none"], ["--dc-mode", "full", "--dc-encoder-layers", "none",
                                                          "--dc-decoder-layers", "none"]])
def test_all_options_off_equals_fairseq_transformer(off):
    ours, task = build_model(ARCH, TINY + off)
    check_equals_fairseq_transformer(ours, task)


def test_layers_outside_the_range_are_fairseq_layers():
    ours, task = build_model(ARCH, TINY + ["--dc-mode", "full", "--dc-encoder-layers", "2",
                                           "--dc-decoder-layers", "1,3"])
    kinds = [type(layer.self_attn).__name__ for layer in list(ours.encoder.layers) + list(ours.decoder.layers)]
    assert kinds == ["MultiheadAttention", "DualContextModule", "MultiheadAttention",
                     "DualContextModule", "MultiheadAttention", "DualContextModule"]


# ---------------------------------------------------------------- decoding
@pytest.mark.parametrize("kernel_size", [1, 2, 4])
def test_decoder_layer_fed_several_steps_at_once_with_reordering(kernel_size):
    """fairseq's decoder feeds one step at a time; the layer also accepts chunks."""
    model, _ = build_model(ARCH, TINY + MODES["dec"] + ["--dc-kernel-size", str(kernel_size)])
    layer = model.decoder.layers[0]
    torch.manual_seed(0)
    # two sentences x beam 2: fairseq's encoder-decoder attention keeps its cache when a
    # reorder stays within each sentence's beam (as beam search does)
    x = torch.randn(9, 4, 32)
    enc = torch.randn(5, 2, 32).repeat_interleave(2, 1)
    enc_pad = _left_padding([5, 5, 3, 3], 5)
    future = torch.triu(torch.full((9, 9), float("-inf")), 1)
    order = torch.tensor([1, 1, 3, 2])
    with torch.no_grad():
        full, _, _ = layer(x, enc, enc_pad, self_attn_mask=future)
        state, outs = {}, []
        for start, end in [(0, 3), (3, 4), (4, 8), (8, 9)]:
            out, _, _ = layer(x[start:end], enc, enc_pad, state)
            outs.append(out)
            if end == 4:
                _reorder(layer, state, order)
                x, enc, enc_pad, full = x[:, order], enc[:, order], enc_pad[order], full[:, order]
                outs = [o[:, order] for o in outs]
    torch.testing.assert_close(torch.cat(outs), full, atol=1e-5, rtol=1e-4)


def test_decoder_never_sees_future_tokens():
    model, task = build_model(ARCH, TINY + MODES["full"])
    src, lens, prev, _ = random_batch(task, [6, 4], seed=3)
    changed = prev.clone()
    changed[:, 4:] = 7
    with torch.no_grad():
        a = model(src, lens, prev)[0]
        b = model(src, lens, changed)[0]
    torch.testing.assert_close(a[:, :4], b[:, :4], rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["enc", "full"])
def test_sentence_does_not_change_when_batched_with_longer_ones(mode):
    model, task = build_model(ARCH, TINY + MODES[mode])
    check_generation_batch_invariance(model, task)


def test_teacher_forced_target_is_invariant_to_right_padding():
    model, task = build_model(ARCH, TINY + MODES["full"])
    pad = task.target_dictionary.pad()
    src, lens, prev, _ = random_batch(task, [4, 7], seed=4)
    short_prev = prev[:1, :3]
    padded = prev.clone()
    padded[0, 3:] = pad  # sentence 0's target is 3 tokens long, right-padded in the batch
    with torch.no_grad():
        batch = model(src, lens, padded)[0]
        alone = model(src[:1, -4:], lens[:1], short_prev)[0]
    torch.testing.assert_close(batch[:1, :3], alone, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- empty rows
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rows_left_empty_give_no_nan(dtype):
    """Decoder with left-padded input: the padding queries see no key at all."""
    torch.manual_seed(0)
    dc = DualContextModule(C, H, kernel_size=2, causal=True).to(dtype)
    r = torch.randn(5, 2, C, dtype=dtype, requires_grad=dtype == torch.float32)
    pad = _left_padding([5, 2], 5)
    out, _ = dc(r, r, r, key_padding_mask=pad)
    assert torch.isfinite(out).all()
    if dtype == torch.float32:
        out.sum().backward()
        assert torch.isfinite(r.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in dc.parameters() if p.grad is not None)


# ---------------------------------------------------------------- fingerprints
@pytest.mark.parametrize("mode,expected_m", [("enc", 12.66), ("dec", 12.66), ("full", 25.3)])
def test_parameter_fingerprint_base(mode, expected_m):
    """Table 1: Transformer 61.2M, Enc-DC / Dec-DC 73.86M, Full-DC 86.5M."""
    with torch.device("meta"):
        ours, _ = build_model(ARCH, ["--dc-mode", mode])
        ref, _ = build_model("transformer")
    delta = count_parameters(ours) - count_parameters(ref)
    layers = 12 if mode == "full" else 6
    assert delta == layers * (8 * 512 * 512 + 7 * 512)  # 8 d^2 per layer at f = 2
    assert abs(delta / 1e6 / expected_m - 1) < 0.03


@pytest.mark.parametrize("kernel_size", [1, 2, 3, 5])
def test_parameters_per_layer_follow_the_kernel_size(kernel_size):
    ours, _ = build_model(ARCH, TINY + ["--dc-mode", "enc", "--dc-encoder-layers", "1-2",
                                        "--dc-kernel-size", str(kernel_size)])
    ref, _ = build_model("transformer", TINY)
    d = 32
    # conv 2f d^2 + 2d, LN 2d, two FI units 6 d^2 + 6d, W_z 2 d^2 + d, minus the MHA's 4 d^2 + 4d
    assert count_parameters(ours) - count_parameters(ref) == 2 * ((2 * kernel_size + 4) * d * d + 7 * d)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "args,message",
    [
        (["--dc-kernel-size", "0"], "--dc-kernel-size must be an integer >= 1 (got 0)"),
        (["--dc-encoder-layers", "1-7"], "--dc-encoder-layers '1-7': layer 7 is out of range"),
        (["--dc-mode", "full", "--dc-decoder-layers", "3-1"], "empty range"),
        (["--dc-mode", "dec", "--dc-decoder-layers", "x"], "--dc-decoder-layers 'x': cannot parse"),
        (["--dc-decoder-layers", "1"], "--dc-decoder-layers '1' is given but --dc-mode enc leaves the decoder"),
        (["--dc-mode", "dec", "--dc-encoder-layers", "1"], "leaves the encoder alone"),
    ],
)
def test_invalid_options_are_command_line_errors_naming_the_option(args, message, capsys):
    """On the command line: argparse-style, exit status 2, the message on stderr."""
    assert message in command_line_error(ARCH, args, capsys)


def test_unknown_mode_is_an_error(capsys):
    assert "--dc-mode" in command_line_error(ARCH, ["--dc-mode", "both"], capsys)
    with pytest.raises(OptionError, match="--dc-mode 'both': unknown mode; allowed: enc, dec, full, none"):
        DCOptions(dc_mode="both").validate(None)


def test_presets():
    small = parse_model_args("dc_transformer_iwslt_small")
    assert (small.encoder_layers, small.decoder_layers, small.encoder_embed_dim, small.encoder_attention_heads,
            small.encoder_ffn_embed_dim) == (4, 4, 256, 4, 1024)
    for preset, dim in [("iwslt_de_en", 512), ("wmt_en_de", 512), ("vaswani_wmt_en_de_big", 1024), ("tiny", 64)]:
        args = parse_model_args(f"{ARCH}_{preset}")
        assert args.encoder_embed_dim == dim and args.dc_mode == "enc" and args.dc_kernel_size == 2


# ---------------------------------------------------------------- divergence
def test_js_divergence_by_hand():
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.3, 0.7]], dtype=torch.float64)
    q = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.3, 0.7]], dtype=torch.float64)
    expected = [math.log(2), 0.75 * math.log(4 / 3), 0.0]
    assert js_divergence(p, q).tolist() == pytest.approx(expected, abs=1e-12)
    assert js_divergence(q, p).tolist() == pytest.approx(expected, abs=1e-12)  # symmetric


def test_head_reduction_by_hand():
    probs = torch.tensor([[[[0.7, 0.3]], [[0.2, 0.8]]]])  # B=1 x H=2 x Tq=1 x Tk=2
    assert reduce_heads(probs, "max")[0, 0].tolist() == pytest.approx([0.7 / 1.5, 0.8 / 1.5])
    assert reduce_heads(probs, "mean")[0, 0].tolist() == pytest.approx([0.45, 0.55])
    other = torch.tensor([[[[0.7, 0.3]], [[0.7, 0.3]]]])
    per_head = reduced_js(probs, other, "per_head")[0, 0].item()
    assert per_head == pytest.approx(0.5 * js_divergence(torch.tensor([0.2, 0.8]), torch.tensor([0.7, 0.3])).item())


def _divergence_by_hand(model, batches, layer):
    """dv of one encoder layer, from its FI units called directly (eq. 10-11), averaged
    over all real query tokens of all batches."""
    dc = model.encoder.layers[layer].self_attn
    total, count = 0.0, 0
    for net_input in batches:
        seen = {}
        handle = dc.register_forward_hook(
            lambda m, args, kwargs, out: seen.update(r=kwargs["query"], pad=kwargs["key_padding_mask"]),
            with_kwargs=True)
        model(**net_input)
        handle.remove()
        r, pad = seen["r"], seen["pad"]
        lc = dc.local_context(r, pad)
        _, p_l = dc.fi_local(r, lc, lc, key_padding_mask=pad, need_head_weights=True)  # H x B x T x T
        _, p_g = dc.fi_global(r, r, r, key_padding_mask=pad, need_head_weights=True)
        for b in range(r.size(1)):
            for i in range(r.size(0)):
                if pad is not None and pad[b, i]:
                    continue
                a_l = p_l[:, b, i].double().max(0).values
                a_g = p_g[:, b, i].double().max(0).values
                a_l, a_g = a_l / a_l.sum(), a_g / a_g.sum()
                m = (a_l + a_g) / 2
                kl = lambda p, q: sum(float(x * math.log(x / y)) for x, y in zip(p, q) if x > 0)  # noqa: E731
                total += 0.5 * kl(a_l, m) + 0.5 * kl(a_g, m)
                count += 1
    return total / count


def test_dc_divergence_per_layer_over_batches():
    model, task = build_model(ARCH, TINY + MODES["full"])
    batches = []
    for seed, lengths in [(0, [6, 3, 5]), (1, [4, 4])]:
        src, lens, prev, _ = random_batch(task, lengths, seed=seed)
        batches.append({"src_tokens": src, "src_lengths": lens, "prev_output_tokens": prev})
    with torch.no_grad():
        result = dc_divergence(model, [{"net_input": b} for b in batches])
        assert sorted(result) == sorted(["enc1", "enc2", "enc3", "dec1_self", "dec2_self", "dec3_self",
                                         "E_d_encoder", "E_d_decoder"])
        assert all(0 < v < math.log(2) for v in result.values())
        assert result["E_d_encoder"] == pytest.approx((result["enc1"] + result["enc2"] + result["enc3"]) / 3)
        assert result["enc2"] == pytest.approx(_divergence_by_hand(model, batches, 1), rel=1e-5)


def test_divergence_is_logged_as_a_validation_metric():
    from fairseq.logging import metrics

    model, task = build_model(ARCH, TINY + MODES["enc"] + ["--dc-log-divergence"])
    src, lens, prev, _ = random_batch(task, [6, 3], seed=3)
    with metrics.aggregate(new_root=True) as agg, torch.no_grad():
        model(src, lens, prev)  # inference (e.g. fairseq-generate): nothing logged
    assert "enc1_js" not in agg.get_smoothed_values()
    with metrics.aggregate(new_root=True) as agg, metrics.aggregate("valid"), torch.no_grad():
        model(src, lens, prev)  # fairseq's validation (Trainer.valid_step)
    values = agg.get_smoothed_values()
    expected = dc_divergence(model, [{"src_tokens": src, "src_lengths": lens, "prev_output_tokens": prev}])
    for layer in (1, 2, 3):
        assert values[f"enc{layer}_js"] == pytest.approx(expected[f"enc{layer}"], abs=2e-3)  # logged rounded
    model.train()
    with metrics.aggregate(new_root=True) as agg, metrics.aggregate("valid"):
        model(src, lens, prev)
    assert "enc1_js" not in agg.get_smoothed_values()  # validation only, not training


# ---------------------------------------------------------------- command line
@pytest.mark.parametrize("mode", ["enc", "dec", "full"])
def test_train_and_generate_through_the_cli(mode, tmp_path):
    import re

    from fairseq import checkpoint_utils

    from conftest import get_tiny_data, train_and_generate

    run = train_and_generate("dc_transformer_tiny", ["--dc-mode", mode, "--dc-log-divergence"], tmp_path)
    logged = {name: float(value) for name, value in re.findall(r"\| ((?:enc|dec)\d_(?:self_)?js) ([0-9.]+)",
                                                               run.train_log.split("valid on 'valid'")[-1])}
    expected = ([f"enc{i}_js" for i in (1, 2, 3)] if mode != "dec" else []) + \
               ([f"dec{i}_self_js" for i in (1, 2, 3)] if mode != "enc" else [])
    assert sorted(logged) == sorted(expected), run.train_log[-3000:]

    # the same divergence from the checkpoint over the validation set, batched differently
    data = get_tiny_data()
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([run.checkpoint],
                                                                     arg_overrides={"data": data.data_bin})
    task.load_dataset("valid")
    batches = task.get_batch_iterator(task.dataset("valid"), max_sentences=5).next_epoch_itr(shuffle=False)
    result = dc_divergence(models[0], batches)
    for name, value in logged.items():
        assert result[name[: -len("_js")]] == pytest.approx(value, abs=2e-3)


def test_paper_iwslt_preset_trains_and_generates(tmp_path):
    from conftest import train_and_generate

    run = train_and_generate("dc_transformer_iwslt_small", ["--dc-mode", "full"], tmp_path, model_args=[],
                             max_update=1, beam=1)
    import torch

    state = torch.load(run.checkpoint, weights_only=False)
    model_state = state["model"]
    assert model_state["encoder.layers.3.self_attn.local_context.conv.weight"].shape == (512, 256, 2)
    assert model_state["decoder.layers.3.self_attn.aggregate.weight"].shape == (256, 512)
    assert "encoder.layers.4.self_attn.aggregate.weight" not in model_state


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_the_encoders_joint_pass_skips_the_empty_row_repair(causal, monkeypatch):
    """Where SDPA does not zero rows without keys (an accelerator), the joint pass of
    the FI units repairs them only in the decoder: the encoder's mask is the sentences'
    padding alone, and every sentence has a real token (the repair costs five kernels a
    call on CUDA), and it is a float mask made once per padding mask for all layers
    (a boolean one costs SDPA a conversion per call). Outputs equal the separate units'
    either way."""
    from fairseq_localness.modules.kernels import emulation, sdpa

    calls, original = [], sdpa.empty_rows
    made, original_bias = [], sdpa.padding_bias
    monkeypatch.setattr(sdpa, "SDPA_ZEROES_EMPTY_ROWS_ON_CPU", False)  # as on an accelerator
    monkeypatch.setattr(sdpa, "empty_rows", lambda blocked: calls.append(1) or original(blocked))
    monkeypatch.setattr(sdpa, "padding_bias", lambda *args: made.append(original_bias(*args)) or made[-1])
    torch.manual_seed(0)
    module = DualContextModule(16, 4, kernel_size=2 if causal else 3, causal=causal).eval()
    x = torch.randn(7, 3, 16)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, (slice(5, 7) if causal else slice(0, 3))] = True  # right padding in the decoder, left in the encoder
    with torch.no_grad():
        want = module(x, key_padding_mask=pad)[0]  # the CPU's path: the two units apart
        calls.clear()
        with emulation.cuda_paths_on_cpu():  # CUDA's: the joint pass
            got = module(x, key_padding_mask=pad)[0]
            again = module(x, key_padding_mask=pad)[0]  # another layer of the same pass
    assert len(calls) == (2 if causal else 0)
    if not causal:  # one float mask, of the model's dtype, for both calls
        assert len(made) == 2 and made[0].data_ptr() == made[1].data_ptr() and made[0].dtype == x.dtype
        assert made[0].stride(0) % 8 == 0 and torch.equal(made[0][:, 0, 0] == float("-inf"), pad)
    torch.testing.assert_close(again, got)
    keep = (~pad).t().unsqueeze(-1).float()
    torch.testing.assert_close(got * keep, want * keep, atol=1e-5, rtol=1e-4)
