"""fairseq_localness/modules/projections.py: several projections of the same input as
one product (an attention core's q, k and v in self-attention; the Dual Contextual
module's FI units), on CUDA only; exact outputs and gradients, nothing stacked kept
for the backward pass, and the CPU's choice of separate projections."""
import pytest
import torch

from fairseq_localness.modules import attention, projections
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.context import AttentionBranch
from fairseq_localness.modules.projections import _StackedLinear, stacked_linear, stacks_projections

C, H = 8, 2


def test_stacked_linear_equals_separate_projections_and_its_gradients_are_exact():
    """Against separate ``nn.Linear`` calls: outputs; and torch's numerical gradient
    check of the input, the weights and the biases (float64)."""
    torch.manual_seed(0)
    projs = [torch.nn.Linear(6, 5).double() for _ in range(3)]
    x = torch.randn(4, 2, 6, dtype=torch.float64, requires_grad=True)
    for got, proj in zip(stacked_linear(x, projs), projs):
        torch.testing.assert_close(got, proj(x), atol=1e-14, rtol=0)
    params = [p.weight.detach().clone().requires_grad_() for p in projs] + [
        p.bias.detach().clone().requires_grad_() for p in projs]
    assert torch.autograd.gradcheck(lambda x, *p: _StackedLinear.apply(x, *p), (x, *params))


def test_stacked_linear_under_autocast_matches_separate_projections():
    """Mixed precision (``--amp``: autocast runs the forward product in half precision
    on float32 parameters; fairseq's backward pass runs outside autocast): the
    gradients come back in float32 and match those of separate projections run the
    same way (bfloat16 autocast on the CPU)."""
    torch.manual_seed(4)
    projs = [torch.nn.Linear(16, 16) for _ in range(3)]
    x = torch.randn(5, 2, 16)

    def run(stacked):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = stacked_linear(xi, projs) if stacked else [proj(xi) for proj in projs]
        for proj in projs:
            proj.zero_grad(set_to_none=True)
        sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs)).backward()
        return [o.float() for o in outs] + [xi.grad] + [p.grad for proj in projs for p in proj.parameters()]

    want, got = run(False), run(True)
    assert all(g.dtype == torch.float32 for g in got[3:])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0.05, rtol=0.02)


def test_where_projections_are_stacked():
    """CUDA only; every projection with a bias and of one output size."""
    x = torch.randn(3, 2, C)
    same = [torch.nn.Linear(C, C) for _ in range(3)]
    assert projections.STACKED_PROJECTION_DEVICES == ("cuda",)
    assert not stacks_projections(x, same)  # a CPU tensor
    meta = x.to("meta")
    assert not stacks_projections(meta, same)
    projections.STACKED_PROJECTION_DEVICES = ("cuda", "meta")
    try:
        assert stacks_projections(meta, same)
        assert not stacks_projections(meta, same[:2] + [torch.nn.Linear(C, C, bias=False)])
        assert not stacks_projections(meta, same[:2] + [torch.nn.Linear(C, 2 * C)])
    finally:
        projections.STACKED_PROJECTION_DEVICES = ("cuda",)


def _core():
    torch.manual_seed(2)
    return AttentionCore(C, H, self_attention=True, branches=[AttentionBranch()]).double().train()


def _pass(core, x, pad):
    x = x.clone().requires_grad_(True)
    saved = []  # 2-D tensors kept that are no parameter's storage
    params = {p.untyped_storage().data_ptr() for p in core.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: (t.dim() == 2 and t.untyped_storage().data_ptr() not in params
                       and saved.append(tuple(t.shape))) or t, lambda t: t):
        out, _ = core(x, x, x, key_padding_mask=pad, need_weights=False)
    core.zero_grad(set_to_none=True)
    (out * torch.linspace(-1, 1, C, dtype=out.dtype, device=out.device)).sum().backward()
    return [out, x.grad] + [p.grad.clone() for p in core.parameters()], saved


def test_self_attention_projects_with_one_product_where_stacked(monkeypatch):
    """A self-attention core on a device that stacks (here the CPU, switched on)
    projects q, k and v with one product: outputs and gradients equal the separate
    projections' (float64), and no stacked weight is kept for the backward pass."""
    core = _core()
    x = torch.randn(5, 3, C, dtype=torch.float64)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, :2] = True
    want, _ = _pass(core, x, pad)
    calls = []
    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(attention, "stacked_linear", lambda *a: calls.append(1) or stacked_linear(*a))
    got, saved = _pass(core, x, pad)
    assert calls == [1]
    assert not [shape for shape in saved if sorted(shape) == [C, 3 * C]], saved
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)


def test_incremental_steps_and_the_cpu_keep_separate_projections(monkeypatch):
    """No stacked product in a pass with incremental state (its cache takes the
    core's own k and v), nor on the CPU."""
    monkeypatch.setattr(attention, "stacked_linear", lambda *a: pytest.fail("stacked"))
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    x = torch.randn(1, 2, C)
    core(x, x, x, need_weights=False)  # the CPU
    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    state = {}
    core(x, x, x, incremental_state=state, need_weights=False)
    core(x, x, x, incremental_state=state, need_weights=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_self_attention_with_stacked_projections_equals_the_cpu_pass():
    """On CUDA a self-attention core's training pass projects with one product:
    outputs and gradients equal the CPU's pass, which projects separately (float32)."""
    core = _core().float()
    x = torch.randn(5, 3, C)
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[1, :2] = True
    want, _ = _pass(core, x, pad)
    calls = []
    original = attention.stacked_linear
    attention.stacked_linear = lambda *a: calls.append(1) or original(*a)
    try:
        got, _ = _pass(core.cuda(), x.cuda(), pad.cuda())
        with torch.autocast("cuda", dtype=torch.float16):  # --amp
            out, _ = core(x.cuda().requires_grad_(True), x.cuda(), x.cuda(), key_padding_mask=pad.cuda(),
                          need_weights=False)
        out.float().sum().backward()  # outside autocast, as fairseq does
    finally:
        attention.stacked_linear = original
    assert calls == [1, 1]
    assert all(p.grad.dtype == torch.float32 for p in core.parameters())
    for a, b in zip(got, want):
        torch.testing.assert_close(a.cpu(), b, atol=1e-4, rtol=1e-4)
