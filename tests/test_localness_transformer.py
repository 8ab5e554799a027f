"""localness_transformer (Yang et al. 2018): equations, parity, incremental decoding,
batch invariance, parameter fingerprints, option validation, observability."""
import math

import pytest
import torch

from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.context import AttentionBranch
from fairseq_localness.modules.gaussian import GaussianLocalness
from fairseq_localness.modules.observe import AttentionRecorder
from model_utils import (
    TINY, build_model, check_equals_fairseq_transformer, check_generation_batch_invariance, command_line_error,
    copy_shared_weights, count_parameters, random_batch, training_metrics,
)

ARCH = "localness_transformer"


# ---------------------------------------------------------------- equations
def _gaussian_reference(module: GaussianLocalness, q, k, kpm, causal):
    """Yang et al. (2018) eq. 5-11 computed element by element in float64."""
    q, k = q.double(), k.double()
    bsz, heads, tq, dh = q.shape
    tk = k.size(2)
    W = {n: getattr(module, n).weight.double() if getattr(module, n) is not None else None
         for n in ("w_p", "u_p", "w_d", "u_d")}
    G = torch.zeros(bsz, heads, tq, tk, dtype=torch.float64)
    for b in range(bsz):
        real = [j for j in range(tk) if kpm is None or not kpm[b, j]]
        pos = {j: n for n, j in enumerate(real)}  # real 0-based positions
        for i in range(tq):
            qi = q[b, :, i].reshape(-1)  # C: all heads
            q_index = tk - tq + i
            visible = [j for j in real if not causal or j <= q_index]
            I = len(visible)
            hidden = torch.tanh(W["w_p"] @ qi) if W["w_p"] is not None else None
            for m in range(heads):
                if module.centre == "predicted":
                    P = I * torch.sigmoid(W["u_p"][m] @ hidden)  # eq. 6-7, 10
                else:
                    P = torch.tensor(float(pos.get(q_index, 0)), dtype=torch.float64)
                # eq. 6 and 11 with the differentiable floor F (F = 0: the paper's own)
                F = module.min_window
                if module.window == "fixed":
                    D = torch.tensor(module.fixed_window, dtype=torch.float64)
                elif module.window == "query":
                    D = F + (max(I, F) - F) * torch.sigmoid(W["u_d"][m] @ hidden)  # eq. 9
                elif module.window == "layer":
                    kbar = torch.stack([k[b, :, j].reshape(-1) for j in visible]).mean(0)
                    D = F + (max(I, F) - F) * torch.sigmoid(W["u_d"][m] @ torch.tanh(W["w_d"] @ kbar))  # eq. 8
                else:
                    D = F + (module.head_window_max - F) * torch.sigmoid(module.z_head[m].double())  # eq. 11
                sigma = D / 2
                for j in real:
                    G[b, m, i, j] = -((pos[j] - P) ** 2) / (2 * sigma**2)  # eq. 5
    return G


@pytest.mark.parametrize("at_once", [False, True], ids=["separate", "at_once"])
@pytest.mark.parametrize("floor", [0.0, 1.0])
@pytest.mark.parametrize("window", ["fixed", "layer", "query", "head"])
@pytest.mark.parametrize("causal", [False, True])
def test_bias_equals_paper_equations_float64(window, causal, floor, at_once, monkeypatch):
    """G of eq. 5 against a loop over the paper's equations; ``at_once``: P and D
    computed together as CUDA computes them (switched on for the CPU)."""
    from fairseq_localness.modules import projections

    if at_once:
        monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(0)
    C, H = 16, 4
    branch = GaussianLocalness(C, H, window=window, min_window=floor)
    if branch.z_head is not None:
        torch.nn.init.normal_(branch.z_head)
    core = AttentionCore(C, H, self_attention=True, causal=causal, branches=[branch]).double()
    x = torch.randn(5, 3, C, dtype=torch.float64)
    kpm = None if causal else torch.tensor([[False] * 5, [True, True] + [False] * 3, [True] + [False] * 4])
    q, k, v, kpm2 = core._project(x, x, x, kpm, None, False)
    ctx = core._context(x, q, k, kpm2)
    G = branch.bias(ctx).expand(3, H, 5, 5)
    ref = _gaussian_reference(branch, q, k, kpm, causal)
    keep = torch.ones_like(G, dtype=torch.bool) if kpm is None else ~kpm[:, None, None, :].expand_as(G)
    torch.testing.assert_close(G[keep], ref[keep], atol=1e-10, rtol=1e-9)


@pytest.mark.parametrize("window", ["head", "query"])
def test_window_floor_keeps_a_gradient_below_and_near_the_floor(window):
    """A window pushed towards the floor still learns (a clamp would give it zero
    gradient), never goes below the floor, and the floor can be 0 (Yang et al.'s
    eq. 6/11 exactly) without producing inf or NaN."""
    torch.manual_seed(0)
    C, H = 16, 4
    for floor in (1.0, 0.0):
        branch = GaussianLocalness(C, H, window=window, min_window=floor)
        core = AttentionCore(C, H, self_attention=True, branches=[branch])
        with torch.no_grad():  # push every window far down
            if window == "head":
                branch.z_head.fill_(-12.0)
            else:  # Q = 1, tanh(W_p Q) = tanh(5), z = U_d^T tanh(W_p Q) = -12
                core.q_proj.weight.zero_()
                core.q_proj.bias.fill_(1.0)
                branch.w_p.weight.copy_(5.0 * torch.eye(C))
                branch.u_d.weight.fill_(-12.0 / C / math.tanh(5.0))
        x = torch.randn(6, 2, C)
        q, k, _, kpm = core._project(x, x, x, None, None, False)
        ctx = core._context(x, q, k, kpm)
        _, D = branch.centre_and_window(ctx)
        assert bool((D >= floor).all()) and bool((D < floor + 0.05).all()), D
        G = branch.bias(ctx)
        assert bool(torch.isfinite(G).all())
        D.sum().backward()
        grad = branch.z_head.grad if window == "head" else branch.u_d.weight.grad
        assert bool(torch.isfinite(grad).all()) and grad.abs().sum() > 0


def test_window_floor_option_is_checked(capsys):
    with pytest.raises(ValueError, match="min_window"):
        GaussianLocalness(16, 4, window="head", min_window=60.0, head_window_max=50.0)
    with pytest.raises(ValueError, match="finite"):
        GaussianLocalness(16, 4, window="fixed", fixed_window=float("inf"))
    for extra, flag in (
        (["--localness-window", "head", "--localness-min-window", "60"], "--localness-min-window"),
        (["--localness-fixed-window", "inf", "--localness-window", "fixed"], "--localness-fixed-window"),
        (["--localness-min-window", "-1"], "--localness-min-window"),
    ):
        assert flag in command_line_error(ARCH, extra, capsys)


def test_neighbor_centre_is_the_query_position():
    torch.manual_seed(0)
    branch = GaussianLocalness(8, 2, window="head", centre="self")
    core = AttentionCore(8, 2, self_attention=True, branches=[branch])
    x = torch.randn(4, 1, 8)
    kpm = torch.tensor([[True, False, False, False]])
    q, k, _, kpm2 = core._project(x, x, x, kpm, None, False)
    P, D = branch.centre_and_window(core._context(x, q, k, kpm2))
    assert P[0, 0].tolist() == [0.0, 0.0, 1.0, 2.0]
    torch.testing.assert_close(D, torch.full_like(D, 25.5))  # F + (50 - F) * sigmoid(0), F = 1


def test_window_floor_keeps_bias_finite():
    branch = GaussianLocalness(8, 2, window="query", min_window=1.0)
    with torch.no_grad():
        branch.u_d.weight.fill_(-1e4)  # sigmoid(z) underflows to 0
    core = AttentionCore(8, 2, self_attention=True, branches=[branch])
    x = torch.randn(6, 2, 8)
    out, w = core(x, x, x, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()


# ---------------------------------------------------------------- parity
def test_all_options_off_equals_fairseq_transformer():
    off = ["--localness-encoder-layers", "none"]
    ours, task = build_model(ARCH, TINY + off)
    check_equals_fairseq_transformer(ours, task)


def _strip_gaussians(model):
    """Replace every Gaussian branch by a plain (global) branch."""
    for module in model.modules():
        if isinstance(module, AttentionCore):
            module.branches = torch.nn.ModuleList([AttentionBranch()])


def test_attention_core_in_every_sublayer_equals_fairseq_transformer():
    everywhere = ["--localness-encoder-layers", "all", "--localness-decoder-layers", "all",
                  "--localness-enc-dec-layers", "all"]
    ours, task = build_model(ARCH, TINY + everywhere)
    _strip_gaussians(ours)
    ref, _ = build_model("transformer", TINY)
    copy_shared_weights(ref, ours)
    src, lens, prev, _ = random_batch(task, [7, 4, 5])
    torch.testing.assert_close(ours(src, lens, prev)[0], ref(src, lens, prev)[0], atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- decoding
PLACEMENTS = {
    "encoder": [],
    "decoder_self": ["--localness-decoder-layers", "1-2"],
    "enc_dec": ["--localness-enc-dec-layers", "2-3"],
    "all_layer_window": ["--localness-decoder-layers", "all", "--localness-enc-dec-layers", "all",
                         "--localness-window", "layer"],
    "rel_pos": ["--localness-decoder-layers", "1", "--localness-rel-pos", "--localness-rel-pos-k", "2"],
}


@pytest.mark.parametrize("placement", ["encoder", "all_layer_window", "rel_pos"])
def test_sentence_does_not_change_when_batched_with_longer_ones(placement):
    model, task = build_model(ARCH, TINY + PLACEMENTS[placement])
    check_generation_batch_invariance(model, task)


# ---------------------------------------------------------------- fingerprints
@pytest.mark.parametrize(
    "preset,dim,expected_m",
    [("wmt_en_de", 512, 0.8), ("vaswani_wmt_en_de_big", 1024, 3.2)],
)
def test_parameter_fingerprint_query_specific_three_layers(preset, dim, expected_m):
    with torch.device("meta"):
        ours, _ = build_model(f"{ARCH}_{preset}")
        ref, _ = build_model(f"transformer_{preset}")
    delta = count_parameters(ours) - count_parameters(ref)
    heads = 8 if dim == 512 else 16
    assert delta == 3 * (dim * dim + 2 * dim * heads)  # W_p, U_p, U_d in layers 1-3
    assert abs(delta / 1e6 - expected_m) < 0.06  # the paper's Table 4: +0.8M base, +3.2M big
    assert abs(delta / (3 * dim * dim) - 1) < 0.05  # ~3 d^2


def test_relative_positions_add_two_tables_per_self_attention():
    ours, _ = build_model(ARCH, TINY + ["--localness-encoder-layers", "none", "--localness-rel-pos",
                                        "--localness-rel-pos-k", "16"])
    ref, _ = build_model("transformer", TINY)
    # 3 encoder + 3 decoder self-attentions, (2k+1) x Dh for keys and for values
    assert count_parameters(ours) - count_parameters(ref) == 6 * 2 * 33 * 8


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "args,message",
    [
        (["--localness-encoder-layers", "2-7"], "--localness-encoder-layers '2-7': layer 7 is out of range"),
        (["--localness-encoder-layers", "3-1"], "empty range"),
        (["--localness-decoder-layers", "x"], "--localness-decoder-layers 'x': cannot parse"),
        (["--localness-enc-dec-layers", "0"], "--localness-enc-dec-layers '0': layer 0 is out of range"),
        (["--localness-rel-pos-k", "-1"], "--localness-rel-pos-k must be >= 1"),
        (["--localness-min-window", "-0.5"], "--localness-min-window must be a finite number >= 0"),
    ],
)
def test_invalid_options_are_command_line_errors_naming_the_option(args, message, capsys):
    """On the command line: argparse-style, exit status 2, the message on stderr."""
    assert message in command_line_error(ARCH, args, capsys)


def test_unknown_window_strategy_is_an_argparse_error(capsys):
    assert "--localness-window" in command_line_error(ARCH, ["--localness-window", "banana"], capsys)


# ---------------------------------------------------------------- observability
def test_centre_and_window_are_recorded_per_token_head_and_layer():
    model, task = build_model(ARCH, TINY)
    src, lens, prev, _ = random_batch(task, [6, 3], seed=3)
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(src, lens, prev)
    names = sorted(n for n in rec.records if n.endswith("branches.0"))
    assert names == [f"encoder.layers.{i}.self_attn.branches.0" for i in range(3)]
    first = rec.records[names[0]][0]
    assert first["P"].shape == (2, 4, 6) and first["D"].shape == (2, 4, 6)
    assert (first["P"] >= 0).all() and (first["P"] <= first["I"][:, None, :]).all()


def test_centre_offset_and_window_are_logged_as_training_metrics():
    values = training_metrics(ARCH)
    for layer in (1, 2, 3):
        assert f"enc{layer}_centre_offset" in values
        assert 1.0 <= values[f"enc{layer}_window"] <= 6.0  # I * sigmoid(z), floored at 1


def test_default_layers_are_the_lowest_three_or_all_of_a_shallow_encoder():
    from fairseq_localness.modules.gaussian import GaussianLocalness as G

    def localized(model):
        return [i for i, layer in enumerate(model.encoder.layers)
                if any(isinstance(m, G) for m in layer.self_attn.modules())]

    deep, _ = build_model(ARCH, TINY + ["--encoder-layers", "5"])
    assert localized(deep) == [0, 1, 2]
    shallow, _ = build_model(f"{ARCH}_tiny")  # transformer_tiny: 2 encoder layers
    assert localized(shallow) == [0, 1]


@pytest.mark.parametrize("floor", [0.0, 1.0])
@pytest.mark.parametrize("causal", [False, True])
def test_centre_and_window_at_once_equal_the_separate_products_outputs_and_gradients(causal, floor, monkeypatch):
    """CUDA's computation of P and D together (one product by [U_p; U_d], one sigmoid,
    one addcmul; the scales shared by the layers of a pass) gives the outputs and
    every gradient of the separate one (float64), with padding, and launches fewer
    operators."""
    from model_utils import OperatorCalls

    from fairseq_localness.modules import projections

    torch.manual_seed(1)
    C, H = 16, 4
    core = AttentionCore(C, H, self_attention=True, causal=causal,
                         branches=[GaussianLocalness(C, H, window="query", min_window=floor)]).double()
    x = torch.randn(5, 3, C, dtype=torch.float64)
    kpm = None if causal else torch.tensor([[False] * 5, [True, True] + [False] * 3, [True] + [False] * 4])

    def run():
        inputs = x.clone().requires_grad_(True)
        core.zero_grad(set_to_none=True)
        ops = OperatorCalls()
        with ops:
            branch = core.branches[0]
            q, k, _, padding = core._project(inputs, inputs, inputs, kpm, None, False)
            centre, window = branch.centre_and_window(core._context(inputs, q, k, padding))
            (centre * torch.linspace(-1, 1, 5, dtype=centre.dtype) + window.square()).sum().backward()
        return [centre, window, inputs.grad] + [p.grad for p in core.parameters() if p.grad is not None], len(ops.names)

    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))  # as on CUDA
    with monkeypatch.context() as patch:
        patch.setattr(GaussianLocalness, "_at_once", lambda self, device: False)
        separate, separate_ops = run()
    at_once, at_once_ops = run()
    assert len(at_once) == len(separate)
    for a, b in zip(at_once, separate):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-10)
    assert at_once_ops <= separate_ops - 8, (at_once_ops, separate_ops)


def test_lengths_of_the_callers_own_are_not_served_from_the_shared_cache(monkeypatch):
    """What a pass shares per padding mask (the Gaussian's scales) is not used for a
    call given lengths of its own, nor made from them for later calls."""
    from fairseq_localness.modules import projections
    from fairseq_localness.modules.context import AttentionContext

    monkeypatch.setattr(projections, "STACKED_PROJECTION_DEVICES", ("cuda", "cpu"))
    torch.manual_seed(2)
    C, H = 16, 4
    branch = GaussianLocalness(C, H, window="query", min_window=1.0).double()
    pad = torch.tensor([[False] * 5, [True] + [False] * 4])
    q, k = torch.randn(2, H, 5, C // H, dtype=torch.float64), torch.randn(2, H, 5, C // H, dtype=torch.float64)

    def centre(**given):
        ctx = AttentionContext(query_input=None, q=q, k=k, key_padding_mask=pad, causal=False, self_attention=True,
                               **given)
        return branch.centre_and_window(ctx)[0]

    given = torch.full((2, 5), 3.0, dtype=torch.float64)
    first = centre(lengths=given)
    plain = centre()
    again = centre(lengths=given)
    monkeypatch.setattr(GaussianLocalness, "_at_once", lambda self, device: False)
    torch.testing.assert_close(first, centre(lengths=given))
    torch.testing.assert_close(again, first)
    torch.testing.assert_close(plain, centre())
    assert not torch.allclose(first, plain)


def test_calls_without_padding_share_what_they_derive_from_their_lengths():
    """Without a padding mask what a call derives from its positions and lengths (the
    Gaussian's key positions, scales and mean query position, the lengths) is made
    once per lengths, kind of attention and inference mode and shared by the calls
    after it (fairseq's length-sorted batches often have no padding); other lengths,
    causal attention, inference mode and positions given by the caller get their own,
    each equal to what the call alone makes."""
    from fairseq_localness.modules import context
    from fairseq_localness.modules.context import AttentionContext

    def ctx(T=5, causal=False, **given):
        q = torch.randn(2, 4, T, 4)
        return AttentionContext(query_input=None, q=q, k=q, key_padding_mask=None, causal=causal,
                                self_attention=True, **given)

    def make():
        made.append(1)
        return torch.arange(3.0)

    made = []
    first, second = ctx().shared("x", make), ctx().shared("x", make)
    assert first is second and len(made) == 1
    assert ctx(T=6).shared("x", make) is not first and ctx(causal=True).shared("x", make) is not first
    with torch.inference_mode():
        assert ctx().shared("x", make) is not first
    assert ctx(lengths=torch.full((1, 5), 5.0)).shared("x", make) is not first
    assert len(made) == 5
    assert ctx().lengths is ctx().lengths and ctx().lengths.tolist() == [[5.0] * 5]
    assert ctx().k_pos_as(torch.float32) is ctx().k_pos_as(torch.float32)
    context._UNPADDED.clear()
    assert ctx().shared("x", make) is not first  # (a cleared cache makes it again)
