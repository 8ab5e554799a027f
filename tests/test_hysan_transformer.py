"""hysan_transformer (Song et al. 2019): masks by hand, fusions rebuilt in float64,
parity with fairseq's transformer, incremental decoding, batch invariance, empty
rows, Table 2 parameter fingerprints, option validation, observability, CLI."""
import math

import pytest
import torch

from fairseq.models import ARCH_MODEL_REGISTRY

from fairseq_localness.models._locality import OptionError
from fairseq_localness.models.hysan_transformer import HysanOptions
from fairseq_localness.analysis.heatmaps import branch_attention
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.fusion import ConcatFusion
from fairseq_localness.modules.hysan import (
    GatedSumFusion,
    build_fusion,
    fusion_extra_parameters,
    make_branch,
)
from fairseq_localness.modules.observe import AttentionRecorder
from model_utils import TINY, ToyTask, build_model, check_equals_fairseq_transformer, check_generation_batch_invariance
from model_utils import command_line_error, count_parameters, parse_model_args, random_batch, training_metrics

ARCH = "hysan_transformer"
C, H = 16, 4
X = 1  # blocked


def _left_padding(lengths, total):
    return torch.stack([torch.arange(total) < total - n for n in lengths])


def _core(side, names, fusion="gated", reduction=4, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    core = AttentionCore(
        C, H, self_attention=True, causal=side == "decoder",
        branches=[make_branch(n, side) for n in names],
        fusion=build_fusion(fusion, C, names, reduction=reduction),
    ).to(dtype).eval()
    with torch.no_grad():  # make the gate's pre-activations non-trivial
        for p in core.fusion.parameters():
            p.normal_(0, 0.5)
    return core


def _record(core, x, kpm=None):
    with AttentionRecorder(core) as rec, torch.no_grad():
        out, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    return out, rec.records[""][0]


# ---------------------------------------------------------------- masks by hand
ENCODER_MASKS = {  # 4 tokens, rows = queries i, columns = keys j, 1 = blocked (eq. 9, 11 M_e)
    "global": [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    "forward": [[0, X, X, X], [0, 0, X, X], [0, 0, 0, X], [0, 0, 0, 0]],
    "backward": [[0, 0, 0, 0], [X, 0, 0, 0], [X, X, 0, 0], [X, X, X, 0]],
    "local1": [[0, 0, X, X], [0, 0, 0, X], [X, 0, 0, 0], [X, X, 0, 0]],
    "local2": [[0, 0, 0, X], [0, 0, 0, 0], [0, 0, 0, 0], [X, 0, 0, 0]],
}
DECODER_MASKS = {  # M_d of eq. 11 with the causal bound: i - k <= j <= i
    "forward": [[0, X, X, X], [0, 0, X, X], [0, 0, 0, X], [0, 0, 0, 0]],
    "local1": [[0, X, X, X], [0, 0, X, X], [X, 0, 0, X], [X, X, 0, 0]],
    "local2": [[0, X, X, X], [0, 0, X, X], [0, 0, 0, X], [X, 0, 0, 0]],
}


@pytest.mark.parametrize("name", list(ENCODER_MASKS))
def test_encoder_masks_by_hand(name):
    assert make_branch(name, "encoder").materialize(4).int().tolist() == ENCODER_MASKS[name]


@pytest.mark.parametrize("name", list(DECODER_MASKS))
def test_decoder_masks_by_hand(name):
    assert make_branch(name, "decoder").materialize(4).int().tolist() == DECODER_MASKS[name]
    # a decoder step: the last query alone against the 4 cached keys
    assert make_branch(name, "decoder").materialize(1, 4).int().tolist() == DECODER_MASKS[name][-1:]


def test_local5_by_hand():
    mask = make_branch("local5", "encoder").materialize(8).int()
    expected = torch.tensor([[int(abs(i - j) > 5) for j in range(8)] for i in range(8)])
    assert mask.tolist() == expected.tolist()
    assert mask[0].tolist() == [0, 0, 0, 0, 0, 0, X, X]


def test_encoder_branches_under_left_padding():
    """The distributions the core computes: nonzero exactly where the hand-written
    mask keeps a key, in real positions, whatever the left padding."""
    names = list(ENCODER_MASKS)
    core = _core("encoder", names)
    x = torch.randn(6, 2, C)
    kpm = _left_padding([6, 4], 6)  # sentence 1: [pad, pad, a, b, c, d]
    _, rec = _record(core, x, kpm)
    for name in names:
        kept = (rec[f"probs_{name}"] > 0).all(dim=1)  # B x Tq x Tk, same for every head
        expected = torch.ones(6, 6, dtype=torch.bool)
        expected[2:, :2] = False  # padding keys
        expected[2:, 2:] = torch.tensor(ENCODER_MASKS[name]) == 0
        assert kept[1, 2:].tolist() == expected[2:].tolist(), name
        # every real query row is a distribution (the padding queries of sentence 1,
        # whose outputs nothing reads, may be left empty by a branch: zeros, no NaN)
        sums = rec[f"probs_{name}"].sum(-1)
        torch.testing.assert_close(sums[0], torch.ones(H, 6))
        torch.testing.assert_close(sums[1, :, 2:], torch.ones(H, 4))
        assert torch.isfinite(rec[f"probs_{name}"]).all()


def test_decoder_steps_see_the_hand_written_rows():
    """Incremental decoder self-attention: step t's distribution is row t of M_d."""
    names = ["forward", "local1", "local2"]
    core = _core("decoder", names)
    x = torch.randn(4, 1, C)
    state = {}
    rows = {n: [] for n in names}
    with AttentionRecorder(core) as rec, torch.no_grad():
        for t in range(4):
            core(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)
    steps = rec.records[""]
    for t, step in enumerate(steps):
        for n in names:
            probs = step[f"probs_{n}"][0, :, 0]  # H x (t+1)
            rows[n].append([int(v) for v in (probs == 0).all(0).tolist()] + [X] * (3 - t))
    for n in names:
        assert rows[n] == DECODER_MASKS[n], n


def test_decoder_left_padded_target_empties_the_first_row():
    """A left-padded target: the padding query at slot 0 sees only itself (padding),
    so every branch's row is empty; zeros, no NaN."""
    core = _core("decoder", ["forward", "local1"])
    x = torch.randn(4, 2, C)
    kpm = _left_padding([4, 2], 4)
    out, rec = _record(core, x, kpm)
    assert torch.isfinite(out).all()
    for n in ("forward", "local1"):
        assert (rec[f"probs_{n}"][1, :, 0] == 0).all()
        assert (rec[f"probs_{n}"][1, :, 2:, :2] == 0).all()  # real queries never see padding
        # the real tokens: rows 2, 3 are rows 0, 1 of the hand-written matrix
        kept = (rec[f"probs_{n}"][1, :, 2:, 2:] > 0).all(0).int()
        assert (1 - kept).tolist() == [row[:2] for row in DECODER_MASKS[n][:2]]


# ---------------------------------------------------------------- fusions in float64
def _reference(core, x, kpm, side, names, fusion):
    """Song et al. (2019) eq. 6 and 8-14 written out in float64 with hand masks."""
    T, B, _ = x.shape
    dh = C // H
    out = torch.zeros(T, B, C, dtype=torch.float64)
    for b in range(B):
        real = [t for t in range(T) if kpm is None or not kpm[b, t]]
        xb = x[real, b]  # n x C
        n = len(real)
        q = core.q_proj(xb).view(n, H, dh).transpose(0, 1)  # H x n x Dh
        k = core.k_proj(xb).view(n, H, dh).transpose(0, 1)
        v = core.v_proj(xb).view(n, H, dh).transpose(0, 1)
        e = q @ k.transpose(1, 2) / math.sqrt(dh)  # eq. 6: one q k^T for all branches
        xs = []
        for name in names:
            M = torch.zeros(n, n, dtype=torch.float64)
            for i in range(n):
                for j in range(n):
                    if name == "forward":
                        ok = j <= i
                    elif name == "backward":
                        ok = j >= i
                    elif name == "global":
                        ok = True
                    else:
                        w = int(name[len("local"):])
                        ok = abs(i - j) <= w if side == "encoder" else 0 <= i - j <= w
                    if side == "decoder":
                        ok = ok and j <= i
                    M[i, j] = 0.0 if ok else -math.inf
            heads = torch.softmax(e + M, -1) @ v  # eq. 8, 10: H x n x Dh
            xs.append(heads.transpose(0, 1).reshape(n, C))  # eq. 6: heads concatenated
        if fusion == "sum":
            fused = sum(xs)
        elif fusion == "concat":
            fused = torch.cat(xs, -1)
        else:
            f1, f2 = core.fusion.gate.f1.weight, core.fusion.gate.f2.weight
            fused = sum(xi * torch.sigmoid(torch.relu(xi @ f1.t()) @ f2.t()) for xi in xs)  # eq. 13-14
        out[real, b] = core.out_proj(fused)
    return out


@pytest.mark.parametrize("fusion", ["sum", "concat", "gated"])
@pytest.mark.parametrize(
    "side,names",
    [("encoder", ["global", "forward", "backward", "local1"]), ("encoder", ["local1", "local2", "local5"]),
     ("decoder", ["forward", "local1"])],
)
def test_fusions_equal_paper_equations_float64(side, names, fusion):
    core = _core(side, names, fusion).double()
    x = torch.randn(7, 3, C, dtype=torch.float64)
    kpm = None if side == "decoder" else _left_padding([7, 5, 2], 7)
    out, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    ref = _reference(core, x, kpm, side, names, fusion)
    keep = torch.ones(7, 3, dtype=torch.bool) if kpm is None else ~kpm.t()
    torch.testing.assert_close(out[keep], ref[keep], atol=1e-10, rtol=1e-8)


def test_fusion_shapes_and_parameters():
    assert isinstance(build_fusion("concat", C, ["a", "b", "c"]), ConcatFusion)
    core = _core("encoder", ["global", "forward", "local1"], "concat")
    assert core.out_proj.weight.shape == (C, 3 * C)  # H of eq. 13 is the output projection
    gate = build_fusion("gated", 64, ["a", "b"], reduction=16)
    assert isinstance(gate, GatedSumFusion)
    assert gate.gate.f1.weight.shape == (4, 64) and gate.gate.f2.weight.shape == (64, 4)
    assert gate.gate.f1.bias is None and gate.gate.f2.bias is None
    assert sum(p.numel() for p in gate.parameters()) == fusion_extra_parameters("gated", 64, 2, 16)
    biased = build_fusion("gated", 64, ["a", "b"], reduction=16, gate_bias=True)
    assert sum(p.numel() for p in biased.parameters()) == fusion_extra_parameters("gated", 64, 2, 16, True) == 580
    with pytest.raises(ValueError, match="unknown fusion"):
        build_fusion("max", C, ["a"])
    with pytest.raises(ValueError, match="must divide"):
        build_fusion("gated", 30, ["a"], reduction=16)


@pytest.mark.parametrize("logging", [True, False], ids=["logged", "not_logged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("gate_bias", [False, True], ids=["no_bias", "bias"])
def test_gated_sum_recomputed_in_backward_equals_the_plain_computation(gate_bias, dtype, logging):
    """The gated sum's own backward pass (it keeps the branch outputs and the gate's
    bottleneck, and recomputes the rest): its output, its gradients (branch outputs,
    gate weights and biases) and its logged gate means equal autograd's on
    ``sum_b x_b * SG(x_b)`` computed directly (eq. 13-14), with the gates logged and
    without (where the gates are not returned at all)."""
    from fairseq_localness.modules.context import AttentionContext

    torch.manual_seed(3)
    fusion = build_fusion("gated", C, ["a", "b", "c"], reduction=4, gate_bias=gate_bias).to(dtype).train()
    if gate_bias:
        for lin in (fusion.gate.f1, fusion.gate.f2):
            torch.nn.init.normal_(lin.bias)
    fusion.metric_prefix = "enc1" if logging else None
    kpm = _left_padding([4, 2], 4)
    ctx = AttentionContext(query_input=None, q=torch.zeros(2, H, 4, C // H), k=torch.zeros(2, H, 4, C // H),
                           key_padding_mask=kpm, q_pos=None, k_pos=None, lengths=None, causal=False,
                           self_attention=True)
    outs = [torch.randn(2, H, 4, C // H, dtype=dtype, requires_grad=True) for _ in range(3)]
    logged = {}
    fusion.log_metrics = lambda names, values, *a, **k: logged.update(zip(names, values))
    weight = torch.randn(4, 2, C, dtype=dtype)
    fused = fusion(outs, ctx)
    (fused * weight).sum().backward()
    got = [o.grad.clone() for o in outs] + [p.grad.clone() for p in fusion.parameters()]
    for t in outs + list(fusion.parameters()):
        t.grad = None
    keep = (~kpm).t().unsqueeze(-1)
    ref, means = 0, {}
    for name, o in zip("abc", outs):
        x = o.permute(2, 0, 1, 3).reshape(4, 2, C)
        g = torch.sigmoid(fusion.gate.f2(torch.relu(fusion.gate.f1(x))))
        ref = ref + x * g
        means[f"gate_{name}"] = (g * keep).sum() / (keep.sum() * C)
    (ref * weight).sum().backward()
    want = [o.grad for o in outs] + [p.grad for p in fusion.parameters()]
    assert len(want) == (7 if gate_bias else 5)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(fused.float(), ref.detach().float(), **tol)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == dtype
        scale = max(1.0, b.float().abs().max().item())
        torch.testing.assert_close(a.float() / scale, b.float() / scale, **tol)
    if not logging:
        assert logged == {}
        from fairseq_localness.modules.hysan import _GatedSum

        gate = fusion.gate
        returned = _GatedSum.apply(False, False, gate.f1.weight, gate.f1.bias, gate.f2.weight, gate.f2.bias, *outs)
        assert len(returned) == 1  # the sum alone: no gates made or kept
        return
    assert set(logged) == set(means)
    for name, value in means.items():
        torch.testing.assert_close(logged[name].float(), value.detach().float(), **tol)


FORMS = ["per_branch", "per_branch_merged_kept", "stacked"]


def _branch_outputs(out, form):
    """``B x H x L x Tq x Dh`` as a fusion gets it on each path: a plain list (a fused
    kernel per branch), :class:`EagerOutputs` (the eager path: the gate keeps the
    merged heads) or :class:`BranchOutputs` (one fused call)."""
    from fairseq_localness.modules.fusion import BranchOutputs, EagerOutputs

    if form == "stacked":
        return BranchOutputs(out)
    return (EagerOutputs if form == "per_branch_merged_kept" else list)(out.unbind(2))


@pytest.mark.parametrize("shape", [(1, 3), (2, 1), (1, 1), (2, 3)], ids=lambda s: f"H={s[0]},Tq={s[1]}")
@pytest.mark.parametrize("form", FORMS)
def test_gated_sum_gradients_pass_gradcheck(form, shape):
    """The gated sum's own backward pass against finite differences in float64, with
    gate biases, for one head and for one query row too (where merging the heads
    gives a view of the branch output rather than a copy): the branch outputs and the
    gate's four parameters; per branch, keeping the outputs or their merged heads for
    the backward pass, and stacked."""
    from fairseq_localness.modules.fusion import BranchOutputs
    from fairseq_localness.modules.hysan import _GatedSum, _StackedGatedSum

    heads, tgt_len = shape
    torch.manual_seed(0)
    dim, reduction = 8, 4
    params = [torch.randn(dim // reduction, dim), torch.randn(dim // reduction), torch.randn(dim, dim // reduction),
              torch.randn(dim)]
    params = [p.double().requires_grad_(True) for p in params]
    out = torch.randn(2, heads, 3, tgt_len, dim // heads, dtype=torch.float64, requires_grad=True)

    def gated(out, w1, b1, w2, b2):
        if form == "stacked":
            return _StackedGatedSum.apply(out, w1, b1, w2, b2)[0]
        keep_merged = form == "per_branch_merged_kept"
        return _GatedSum.apply(False, keep_merged, w1, b1, w2, b2, *out.unbind(2))[0]

    assert torch.autograd.gradcheck(gated, (out, *params))
    fused = gated(out, *params)
    x = BranchOutputs(out).stacked.permute(3, 2, 0, 1, 4).reshape(tgt_len, 3, 2, dim)
    g = torch.sigmoid(torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, *params[:2])),
                                                 *params[2:]))
    torch.testing.assert_close(fused, (x * g).sum(1))


def _graph_nodes(tensor):
    """Every node of the autograd graph that computed ``tensor``."""
    seen, todo = [], [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.append(node)
            todo.extend(next_node for next_node, _ in node.next_functions)
    return seen


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_the_eager_path_lets_the_gate_keep_the_merged_heads_instead_of_the_outputs(side):
    """Trained on a CPU with dropout, several branches go down the eager path, whose
    outputs nothing else keeps for the backward pass (:class:`EagerOutputs`): the gated
    sum keeps their merged heads (``Tq x B x C``) in their place, and no ``B x H x Tq x
    Dh`` output; the fast path's outputs (``attention_impl="sdpa"``: one fused call
    per branch) are kept as they are."""
    names = ["global", "forward", "backward", "local1"] if side == "encoder" else ["forward", "local1"]
    core = _core(side, names).train()
    core.dropout_module.p = 0.1
    x = torch.randn(5, 2, C, requires_grad=True)
    for impl, keeps_merged in (("auto", True), ("sdpa", False)):
        core.attention_impl = impl
        out, _ = core(x, x, x, need_weights=False)
        node = next(n for n in _graph_nodes(out) if type(n).__name__ == "_GatedSumBackward")
        assert node.keep_merged is keeps_merged
        shapes = {tuple(t.shape) for t in node.saved_tensors if t is not None}
        merged, per_head = (5, 2, C), (2, H, 5, C // H)
        assert (merged in shapes, per_head in shapes) == (keeps_merged, not keeps_merged)
        out.sum().backward()  # the backward pass runs from either
        assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize("form", FORMS)
def test_gated_sum_under_autocast_equals_autograd_and_keeps_the_parameter_dtype(form):
    """Mixed precision as fairseq's --bf16 on a CPU and --amp run it: float32 weights
    and branch outputs, the products in bfloat16 under autocast. The gated sum and the
    gradients of the outputs and of the gate's weights equal autograd's on the plain
    expression under the same autocast, and the weights' gradients stay float32."""

    torch.manual_seed(1)
    fusion = build_fusion("gated", C, ["a", "b", "c"], reduction=4, gate_bias=True).train()
    base = torch.randn(2, H, 3, 5, C // H)
    weight = torch.randn(5, 2, C)

    def run(plain):
        out = base.clone().requires_grad_(True)
        fusion.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            if plain:
                x = out.permute(3, 2, 0, 1, 4).reshape(5, 3, 2, C)
                fused = (x * fusion.gate(x)).sum(1)
            else:
                fused = fusion(_branch_outputs(out, form), None)
        (fused.float() * weight).sum().backward()
        return [fused.float(), out.grad] + [p.grad for p in fusion.parameters()]

    got, want = run(False), run(True)
    assert all(p.grad.dtype == torch.float32 for p in fusion.parameters())
    for a, b in zip(got, want):
        scale = max(1.0, b.abs().max().item())
        torch.testing.assert_close(a / scale, b / scale, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("form", FORMS)
def test_the_flop_counter_sees_every_product_of_the_gate(form):
    """The benchmark's arithmetic bound counts the gate's products
    (``torch.utils.flop_counter``): per branch and token, ``2 C C/r`` multiply-adds
    forward (f1, f2) and ``5 C C/r`` backward (f2 recomputed, the two products back
    through f2 and f1, the two weight gradients), none missed by an in-place
    accumulation the counter does not see."""
    from torch.utils.flop_counter import FlopCounterMode

    count, tokens, reduction = 3, 4 * 2, 4
    fusion = build_fusion("gated", C, ["a", "b", "c"], reduction=reduction).train()
    out = torch.randn(2, H, count, 4, C // H, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        fused = fusion(_branch_outputs(out, form), None)
        fused.sum().backward()
    assert counter.get_total_flops() == 2 * 7 * count * tokens * C * (C // reduction)


# ---------------------------------------------------------------- no NaN
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fusion", ["concat", "gated"])
@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_empty_rows_give_finite_outputs_and_gradients(side, fusion, dtype):
    names = ["global", "forward", "backward", "local1"] if side == "encoder" else ["forward", "local1"]
    core = _core(side, names, fusion, dtype=dtype).train()
    core.dropout_module.p = 0.1
    x = torch.randn(5, 3, C, dtype=dtype, requires_grad=True)
    kpm = _left_padding([5, 2, 0], 5)  # sentence 2 is all padding: every row empty
    out, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    assert out.dtype == dtype and torch.isfinite(out).all()
    out.float().sum().backward()
    assert torch.isfinite(x.grad.float()).all()
    assert all(torch.isfinite(p.grad.float()).all() for p in core.parameters() if p.grad is not None)
    # the empty sentence gets only the output projection's bias
    torch.testing.assert_close(out[:, 2].float(), core.out_proj.bias.float().expand(5, C))


def test_bf16_model_forward_is_finite():
    model, task = build_model(f"{ARCH}_tiny", ["--hysan-encoder-branches", "global,forward,backward,local1,local2"])
    model = model.to(torch.bfloat16)
    src, lens, prev, _ = random_batch(task, [7, 2, 4])
    with torch.no_grad():
        out = model(src, lens, prev)[0]
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


# ---------------------------------------------------------------- parity
def test_global_branch_with_sum_fusion_equals_fairseq_transformer():
    only_global = ["--hysan-encoder-branches", "global", "--hysan-decoder-branches", "forward",
                   "--hysan-fusion", "sum"]
    ours, task = build_model(ARCH, TINY + only_global)
    assert all(isinstance(layer.self_attn, AttentionCore) for layer in ours.encoder.layers)
    assert all(isinstance(layer.self_attn, AttentionCore) for layer in ours.decoder.layers)
    check_equals_fairseq_transformer(ours, task, atol=1e-5, rtol=1e-4)


def test_no_hysan_layers_is_fairseq_transformer():
    off = ["--hysan-encoder-layers", "none", "--hysan-decoder-layers", "none"]
    ours, task = build_model(ARCH, TINY + off)
    ref, _ = build_model("transformer", TINY)
    ours.load_state_dict(ref.state_dict())
    src, lens, prev, _ = random_batch(task, [7, 4, 5])
    torch.testing.assert_close(ours(src, lens, prev)[0], ref(src, lens, prev)[0], atol=1e-6, rtol=1e-5)


def test_layer_selection_and_defaults():
    model, _ = build_model(ARCH, TINY + ["--hysan-encoder-layers", "1,3", "--hysan-decoder-layers", "2"])
    enc = [isinstance(layer.self_attn, AttentionCore) for layer in model.encoder.layers]
    dec = [isinstance(layer.self_attn, AttentionCore) for layer in model.decoder.layers]
    assert enc == [True, False, True] and dec == [False, True, False]
    # the default: e1, gated, every layer
    model, _ = build_model(ARCH, TINY)
    for layer in model.encoder.layers:
        assert [b.name for b in layer.self_attn.branches] == ["global", "forward", "backward", "local1"]
        assert isinstance(layer.self_attn.fusion, GatedSumFusion)
    for layer in model.decoder.layers:
        assert [b.name for b in layer.self_attn.branches] == ["forward", "local1"]
        assert layer.self_attn.causal and not isinstance(layer.encoder_attn, AttentionCore)


# ---------------------------------------------------------------- decoding
CONFIGS = {
    "e1_gated": [],
    "e2_concat": ["--hysan-encoder-branches", "global,forward,backward,local1,local2,local5",
                  "--hysan-decoder-branches", "forward,local1,local2,local5", "--hysan-fusion", "concat"],
    "d4_sum": ["--hysan-encoder-branches", "global", "--hysan-decoder-branches", "forward,local1,local2,local5",
               "--hysan-fusion", "sum"],
}


@pytest.mark.parametrize("config", ["e1_gated", "e2_concat"])
def test_sentence_does_not_change_when_batched_with_longer_ones(config):
    model, task = build_model(ARCH, TINY + CONFIGS[config])
    check_generation_batch_invariance(model, task)


# ---------------------------------------------------------------- fingerprints (Table 2)
IWSLT_SMALL_BASELINE = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256",
                        "--decoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024",
                        "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
                        "--decoder-attention-heads", "4"]
SIZES = {  # preset: (the vanilla transformer it extends, d, layers per side)
    "iwslt_small": (("transformer", IWSLT_SMALL_BASELINE), 256, 2),
    "wmt_en_de": (("transformer_wmt_en_de", []), 512, 6),
    "vaswani_wmt_en_de_big": (("transformer_vaswani_wmt_en_de_big", []), 1024, 6),
}
PAPER = {  # Table 2: extra parameters over the baseline
    ("iwslt_small", "gated"): 32e3, ("wmt_en_de", "gated"): 383e3, ("vaswani_wmt_en_de_big", "gated"): 1.57e6,
    ("iwslt_small", "concat"): 524e3, ("wmt_en_de", "concat"): 6.29e6, ("vaswani_wmt_en_de_big", "concat"): 25.1e6,
    ("iwslt_small", "sum"): 0, ("wmt_en_de", "sum"): 0, ("vaswani_wmt_en_de_big", "sum"): 0,
}


@pytest.mark.parametrize("size,fusion", list(PAPER))
def test_parameter_fingerprints_match_table_2(size, fusion):
    (base_arch, base_args), d, layers = SIZES[size]
    with torch.device("meta"):
        ours, _ = build_model(f"{ARCH}_{size}", ["--hysan-fusion", fusion])
        ref, _ = build_model(base_arch, base_args)
    delta = count_parameters(ours) - count_parameters(ref)
    # closed form: e1 has 4 encoder branches and 2 decoder branches per layer
    assert delta == layers * (fusion_extra_parameters(fusion, d, 4) + fusion_extra_parameters(fusion, d, 2))
    paper = PAPER[(size, fusion)]
    if paper == 0:
        assert delta == 0
    else:
        assert abs(delta / paper - 1) < 0.05, (delta, paper)


def test_gate_biases_would_break_the_iwslt_small_count():
    """Why the squeeze gate is bias-free by default: with biases IWSLT small is off by 5.8%."""
    with torch.device("meta"):
        ours, _ = build_model(f"{ARCH}_iwslt_small", ["--hysan-gate-bias"])
        ref, _ = build_model("transformer", IWSLT_SMALL_BASELINE)
    delta = count_parameters(ours) - count_parameters(ref)
    assert delta == 33856 and delta / 32e3 - 1 > 0.05


def test_iwslt_small_baseline_has_the_papers_size():
    """Table 2a's baseline: 11.9M with a 32K joint vocabulary and shared embeddings."""
    with torch.device("meta"):
        model, _ = build_model(f"{ARCH}_iwslt_small", ["--hysan-encoder-layers", "none",
                                                       "--hysan-decoder-layers", "none",
                                                       "--share-all-embeddings"], task=ToyTask(32000 - 4))
    assert abs(count_parameters(model) / 11.9e6 - 1) < 0.01


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "args,message",
    [
        (["--hysan-encoder-branches", "global,sideways"], "--hysan-encoder-branches: unknown branch 'sideways'"),
        (["--hysan-encoder-branches", "global,local0"], "local width k must be an integer >= 1"),
        (["--hysan-decoder-branches", "forward,local-2"], "local width k must be an integer >= 1"),
        (["--hysan-decoder-branches", "forward,backward"], "'backward' is not allowed in the decoder"),
        (["--hysan-decoder-branches", "global,local1"], "'global' is not allowed in the decoder"),
        (["--hysan-encoder-branches", "global,local1,local1"], "listed more than once: local1"),
        (["--hysan-encoder-branches", ""], "give at least one branch"),
        (["--hysan-gate-reduction", "24"], "--hysan-gate-reduction 24: must be a positive divisor of"),
        (["--hysan-gate-reduction", "0"], "--hysan-gate-reduction 0: must be a positive divisor of"),
        (["--hysan-encoder-layers", "4"], "--hysan-encoder-layers '4': layer 4 is out of range"),
        (["--hysan-decoder-layers", "x"], "--hysan-decoder-layers 'x': cannot parse"),
    ],
)
def test_invalid_options_are_command_line_errors_naming_the_option(args, message, capsys):
    """On the command line: argparse-style, exit status 2, the message on stderr."""
    assert message in command_line_error(ARCH, args, capsys)


def test_messages_list_the_allowed_values():
    with pytest.raises(OptionError) as err:
        HysanOptions(hysan_decoder_branches="backward").branches("decoder")
    assert "allowed: forward, local<k>" in str(err.value)
    with pytest.raises(OptionError) as err:
        HysanOptions(hysan_encoder_branches="bw").branches("encoder")
    assert "allowed: global, forward, backward, local<k>" in str(err.value)


def test_unknown_fusion_is_an_argparse_error(capsys):
    assert "--hysan-fusion" in command_line_error(ARCH, ["--hysan-fusion", "max"], capsys)


def test_reduction_is_only_checked_for_the_gated_fusion(capsys):
    """A reduction the gate could not use is no error without the gate; on the command
    line it is refused as an option without effect."""
    args = parse_model_args(ARCH, TINY + ["--hysan-fusion", "sum"])
    args.hysan_gate_reduction = 24
    model = ARCH_MODEL_REGISTRY[ARCH].build_model(args, ToyTask())
    assert isinstance(model.encoder.layers[0].self_attn, AttentionCore)
    err = command_line_error(ARCH, ["--hysan-fusion", "sum", "--hysan-gate-reduction", "24"], capsys)
    assert "--hysan-gate-reduction applies to --hysan-fusion gated only" in err


# ---------------------------------------------------------------- observability
def test_gate_means_are_logged_per_branch_and_layer():
    values = training_metrics(ARCH)
    expected = [f"enc{i}_gate_{b}" for i in (1, 2, 3) for b in ("global", "forward", "backward", "local1")]
    expected += [f"dec{i}_self_gate_{b}" for i in (1, 2, 3) for b in ("forward", "local1")]
    assert sorted(k for k in values if "_gate_" in k) == sorted(expected)
    assert all(0.0 < values[k] < 1.0 for k in expected)


def test_gate_mean_ignores_padding_queries():
    from fairseq.logging import metrics

    core = _core("encoder", ["global", "local1"]).train()
    core.fusion.metric_prefix = "enc1"
    x = torch.randn(5, 2, C)
    kpm = _left_padding([5, 2], 5)
    x[:3, 1] = 100.0  # padding queries: gates far from the real ones
    with metrics.aggregate(new_root=True) as agg:
        core(x, x, x, key_padding_mask=kpm, need_weights=False)
    with AttentionRecorder(core) as rec:
        core(x, x, x, key_padding_mask=kpm, need_weights=False)
    gate = rec.records["fusion"][0]["gate_local1"]  # B x Tq (channel mean)
    expected = torch.cat([gate[0], gate[1, 3:]]).mean()
    assert math.isclose(agg.get_smoothed_values()["enc1_gate_local1"], expected.item(), rel_tol=1e-3)


def test_branch_attention_for_figure_5():
    model, task = build_model(ARCH, TINY)
    src, lens, prev, _ = random_batch(task, [6, 3], seed=4)
    weights = branch_attention(model, src_tokens=src, src_lengths=lens, prev_output_tokens=prev)
    enc = weights["encoder.layers.0.self_attn"]
    for b in ("global", "forward", "backward", "local1"):
        assert enc[f"probs_{b}"].shape == (2, 4, 6, 6)
        assert enc[f"gate_{b}"].shape == (2, 6)
    # sentence 1 (3 real tokens, left padded): backward is upper triangular over them
    bw = enc["probs_backward"][1, :, 3:, 3:]
    assert (bw.tril(-1) == 0).all() and (bw.diagonal(dim1=-2, dim2=-1) > 0).all()
    dec = weights["decoder.layers.2.self_attn"]
    assert sorted(dec) == ["gate_forward", "gate_local1", "probs_forward", "probs_local1"]
    assert (dec["probs_local1"][0, :, 3, :2] == 0).all()  # i - k <= j only


# ---------------------------------------------------------------- CLI
def _checkpoint(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(path)


def test_train_and_generate_sum_fusion_through_the_cli(tmp_path):
    from conftest import train_and_generate

    run = train_and_generate(f"{ARCH}_tiny", ["--hysan-fusion", "sum"], tmp_path)
    state = _checkpoint(run.checkpoint)["model"]
    assert not any(".fusion." in k for k in state)
    assert "enc1_gate_" not in run.train_log


def test_train_and_generate_concat_fusion_through_the_cli(tmp_path):
    from conftest import train_and_generate

    run = train_and_generate(f"{ARCH}_tiny", ["--hysan-fusion", "concat", "--hysan-encoder-branches",
                                              "global,forward,backward,local1,local2,local5"], tmp_path)
    state = _checkpoint(run.checkpoint)["model"]
    assert state["encoder.layers.0.self_attn.out_proj.weight"].shape == (32, 6 * 32)
    assert state["decoder.layers.2.self_attn.out_proj.weight"].shape == (32, 2 * 32)


def test_train_generate_and_dump_gated_without_positions(tmp_path):
    """The default (e1, gated) with "NoPos": gates in the training log, no positional
    embeddings in the checkpoint, per-branch weights in the dump (Fig. 5)."""
    import json

    from conftest import get_tiny_data, run_fairseq, train_and_generate

    run = train_and_generate(f"{ARCH}_tiny", ["--no-token-positional-embeddings"], tmp_path)
    for name in ("enc1_gate_global", "enc3_gate_backward", "dec1_self_gate_forward", "dec3_self_gate_local1"):
        assert name in run.train_log, f"{name} missing from the training log"
    ckpt = _checkpoint(run.checkpoint)
    assert ckpt["cfg"]["model"].no_token_positional_embeddings
    assert "encoder.layers.0.self_attn.fusion.gate.f1.weight" in ckpt["model"]

    out = tmp_path / "stats.jsonl"
    run_fairseq("fairseq-localness-dump", [get_tiny_data().data_bin, "--path", run.checkpoint, "--split", "valid",
                                           "--max-sentences", "2", "--with-attention", "--output", out])
    rows = {(r["id"], r["module"]): r["stats"] for r in map(json.loads, out.read_text().splitlines())}
    enc = [stats for (_, module), stats in rows.items() if module == "encoder.layers.0.self_attn"]
    assert len(enc) == 2
    for stats in enc:
        n = len(stats["probs_global"][0])  # real source tokens
        for b in ("global", "forward", "backward", "local1"):
            probs = torch.tensor(stats[f"probs_{b}"])  # H x n x n
            assert probs.shape == (4, n, n)
            torch.testing.assert_close(probs.sum(-1), torch.ones(4, n))
        assert (torch.tensor(stats["probs_forward"]).triu(1) == 0).all()
        assert (torch.tensor(stats["probs_local1"]).triu(2) == 0).all()
    for (ident, module), stats in rows.items():
        if module == "encoder.layers.0.self_attn.fusion":  # per-token gate, channel mean
            n = len(rows[(ident, "encoder.layers.0.self_attn")]["probs_global"][0])
            assert sorted(stats) == ["gate_backward", "gate_forward", "gate_global", "gate_local1"]
            assert len(stats["gate_global"]) == n and all(0 < g < 1 for g in stats["gate_global"])
    assert sum(module == "decoder.layers.0.self_attn.fusion" for _, module in rows) == 2
