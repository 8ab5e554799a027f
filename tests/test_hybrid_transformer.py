"""hybrid_transformer (Xu et al. 2019): gate limits, float64 rebuild of eq. 1-5, band
masks by hand, parity with fairseq's transformer, incremental decoding, batch
invariance, parameter fingerprints, option validation, observability, and the
Table 1 variants through the real CLI."""
import json
import math

import pytest
import torch

from fairseq_localness.models._locality import OptionError
from fairseq_localness.models.hybrid_transformer import HybridOptions
from fairseq_localness.analysis.gates import mean_gate_per_layer, sentence_gates
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.branches import global_branch, local_branch
from fairseq_localness.modules.fusion import ConcatFusion
from fairseq_localness.modules.gaussian import GaussianLocalness
from fairseq_localness.modules.hybrid import (
    VARIANTS,
    GateFusion,
    HybridSettings,
    hybrid_attention,
)
from fairseq_localness.modules.observe import AttentionRecorder
from model_utils import TINY, build_model, check_equals_fairseq_transformer, check_generation_batch_invariance, command_line_error
from model_utils import copy_shared_weights, count_parameters, parse_model_args, random_batch

ARCH = "hybrid_transformer"
C, H, B, T = 16, 4, 3, 6


def _left_padding(lengths, total):
    return torch.stack([torch.arange(total) < total - n for n in lengths])


def _core(variant="gate", causal=False, dtype=torch.float32, seed=0, **settings):
    torch.manual_seed(seed)
    core = hybrid_attention(variant, C, H, HybridSettings(**settings), self_attention=True, causal=causal)
    core.attention_impl = "eager"
    return core.to(dtype).eval()


def _single(branch, donor, causal=False):
    """A one-branch core with the projections of ``donor``."""
    core = AttentionCore(C, H, self_attention=True, causal=causal, branches=[branch]).eval()
    core.attention_impl = "eager"
    state = {k: v for k, v in donor.state_dict().items() if k.split(".")[0] in ("q_proj", "k_proj", "v_proj", "out_proj")}
    core.load_state_dict(state)
    return core


def _force_gate(core, value: float):
    with torch.no_grad():
        core.fusion.gate.weight.zero_()
        core.fusion.gate.bias.fill_(1e4 if value == 1 else -1e4)  # sigmoid is exactly 1 / 0


# ---------------------------------------------------------------- gate limits
@pytest.mark.parametrize("causal", [False, True])
def test_gate_forced_to_zero_gives_global_and_to_one_gives_local_exactly(causal):
    core = _core(causal=causal, window_m=1)
    x = torch.randn(T, B, C)
    kpm = None if causal else _left_padding([6, 4, 2], T)
    _force_gate(core, 0)
    out0, _ = core(x, x, x, key_padding_mask=kpm)
    ref0, _ = _single(global_branch(), core, causal)(x, x, x, key_padding_mask=kpm)
    assert torch.equal(out0, ref0)
    _force_gate(core, 1)
    out1, _ = core(x, x, x, key_padding_mask=kpm)
    ref1, _ = _single(local_branch(1, "local"), core, causal)(x, x, x, key_padding_mask=kpm)
    assert torch.equal(out1, ref1)
    assert not torch.allclose(out0, out1)  # the two branches do differ


def test_window_covering_the_sentence_makes_local_equal_global():
    core = _core(window_m=T)
    x = torch.randn(T, B, C)
    kpm = _left_padding([6, 4, 2], T)
    with AttentionRecorder(core) as rec:
        out, _ = core(x, x, x, key_padding_mask=kpm)
    probs = rec.records[""][0]
    assert torch.equal(probs["probs_local"], probs["probs_global"])
    ref, _ = _single(global_branch(), core)(x, x, x, key_padding_mask=kpm)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)  # whatever the gate


# ---------------------------------------------------------------- equations
def _hybrid_reference(core, x, kpm, causal, variant, m):
    """Xu et al. (2019) eq. 1-5 (and the concatenation), element by element in float64,
    from real token positions. Returns ``T x B x C``; padding query rows are zero."""
    tq, bsz, c = x.shape
    dh = c // H
    q = core.q_proj(x).view(tq, bsz, H, dh)
    k = core.k_proj(x).view(tq, bsz, H, dh)
    v = core.v_proj(x).view(tq, bsz, H, dh)
    heads_out = torch.zeros(tq, bsz, H, dh, dtype=torch.float64)
    concat = torch.zeros(tq, bsz, 2 * c, dtype=torch.float64)
    for b in range(bsz):
        real = [j for j in range(tq) if kpm is None or not kpm[b, j]]
        pos = {j: n for n, j in enumerate(real)}
        for i in real:
            visible = [j for j in real if not causal or j <= i]
            band = [j for j in visible if abs(pos[j] - pos[i]) <= m]  # eq. 3
            if variant == "gate":
                w, bias = core.fusion.gate.weight.double(), core.fusion.gate.bias.double()
                g = torch.sigmoid(w @ x[i, b] + bias)  # eq. 5: 1 or H values
            for h in range(H):
                xi = torch.stack([q[i, b, h] @ k[j, b, h] for j in range(tq)]) / math.sqrt(dh)  # eq. 1

                def att(keys):
                    p = torch.softmax(xi[keys], 0)
                    return sum(p[n] * v[j, b, h] for n, j in enumerate(keys))

                glob, loc = att(visible), att(band)  # eq. 2 and softmax(B(xi)) V
                if variant == "gate":
                    gh = g[h] if g.numel() == H else g[0]
                    heads_out[i, b, h] = (1 - gh) * glob + gh * loc  # eq. 4
                elif variant == "local_pattern":
                    heads_out[i, b, h] = loc
                else:  # concat
                    concat[i, b, h * dh : (h + 1) * dh] = glob
                    concat[i, b, c + h * dh : c + (h + 1) * dh] = loc
    if variant == "concat":
        out = core.out_proj(concat)
    else:
        out = core.out_proj(heads_out.reshape(tq, bsz, c))
    if kpm is not None:
        out = out.masked_fill(kpm.t().unsqueeze(-1), 0.0)
    return out


@pytest.mark.parametrize(
    "variant,gate,causal,m",
    [
        ("gate", "token", False, 1),
        ("gate", "head", False, 2),
        ("gate", "token", True, 1),
        ("concat", "token", False, 1),
        ("local_pattern", "token", True, 0),
    ],
)
def test_hybrid_attention_equals_paper_equations_float64(variant, gate, causal, m):
    core = _core(variant, causal=causal, dtype=torch.float64, window_m=m, gate=gate)
    if isinstance(core.fusion, GateFusion):
        torch.nn.init.normal_(core.fusion.gate.bias)
    x = torch.randn(T, B, C, dtype=torch.float64)
    kpm = None if causal else _left_padding([6, 4, 2], T)
    out, _ = core(x, x, x, key_padding_mask=kpm)
    if kpm is not None:
        out = out.masked_fill(kpm.t().unsqueeze(-1), 0.0)
    with torch.no_grad():
        ref = _hybrid_reference(core, x, kpm, causal, variant, m)
    # the core runs its softmax in float32 whatever the input dtype
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- band masks by hand
def _support(core, x, kpm=None, **kwargs):
    """Where the local branch puts probability (1) in each recorded call, per sentence."""
    with AttentionRecorder(core) as rec, torch.no_grad():
        core(x, x, x, key_padding_mask=kpm, **kwargs)
    return rec


def test_band_mask_by_hand_in_a_left_padded_batch():
    core = _core(window_m=1)
    x = torch.randn(5, 2, C)
    kpm = _left_padding([5, 3], 5)
    rec = _support(core, x, kpm)
    local = (rec.records[""][0]["probs_local"] > 0).int()  # B x H x Tq x Tk
    glob = (rec.records[""][0]["probs_global"] > 0).int()
    assert (local == local[:, :1]).all()  # the same band in every head
    assert local[0, 0].tolist() == [
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 0, 1, 1],
    ]
    # sentence of 3 real tokens after 2 pads: the band follows real positions
    assert local[1, 0, 2:].tolist() == [
        [0, 0, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 0, 1, 1],
    ]
    assert glob[1, 0, 2:].tolist() == [[0, 0, 1, 1, 1]] * 3


def test_band_mask_by_hand_in_decoder_full_pass_and_incremental_steps():
    core = _core(causal=True, window_m=1)
    x = torch.randn(5, 1, C)
    full = (_support(core, x).records[""][0]["probs_local"][0, 0] > 0).int()
    assert full.tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 0, 0],
        [0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1],
    ]
    state = {}
    with AttentionRecorder(core) as rec, torch.no_grad():
        for t in range(5):
            core(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state)
    steps = [(call["probs_local"][0, 0, 0] > 0).int().tolist() for call in rec.records[""]]
    assert steps == [[1], [1, 1], [0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1, 1]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["gate", "concat", "local_pattern"])
def test_rows_whose_window_is_all_padding_give_zeros_not_nan(variant, dtype):
    core = _core(variant, window_m=0, dtype=dtype)
    x = torch.randn(T, B, C, dtype=dtype, requires_grad=True)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[2] = True  # every key of sentence 2 is padding: every window of it is empty
    kpm[1, :3] = True
    with AttentionRecorder(core) as rec:
        out, _ = core(x, x, x, key_padding_mask=kpm)
    assert torch.isfinite(out.float()).all()
    for name in ("probs_local",):
        assert (rec.records[""][0][name][2] == 0).all()
    out.float().sum().backward()
    assert torch.isfinite(x.grad.float()).all()
    assert all(torch.isfinite(p.grad.float()).all() for p in core.parameters() if p.grad is not None)


def test_unknown_variant_and_negative_window_rejected_by_the_module():
    with pytest.raises(ValueError, match="unknown hybrid variant 'banana'; allowed: gate, concat"):
        hybrid_attention("banana", C, H, self_attention=True)
    with pytest.raises(ValueError, match="m must be >= 0"):
        hybrid_attention("gate", C, H, HybridSettings(window_m=-1), self_attention=True)
    with pytest.raises(ValueError, match="unknown gate type"):
        hybrid_attention("gate", C, H, HybridSettings(gate="layer"), self_attention=True)


# ---------------------------------------------------------------- parity
def test_hybrid_layers_off_equals_fairseq_transformer():
    ours, task = build_model(ARCH, TINY + ["--hybrid-encoder-layers", "none"])
    check_equals_fairseq_transformer(ours, task)


def test_model_with_closed_gates_equals_fairseq_transformer_and_open_gates_local_pattern():
    layers = ["--hybrid-encoder-layers", "1-2", "--hybrid-decoder-layers", "1,3"]
    ours, task = build_model(ARCH, TINY + layers)
    ref, _ = build_model("transformer", TINY)
    local, _ = build_model(ARCH, TINY + layers + ["--hybrid-variant", "local_pattern"])
    copy_shared_weights(ref, ours)
    copy_shared_weights(ours, local)
    gated = [m for m in ours.modules() if isinstance(m, AttentionCore)]
    assert len(gated) == 4
    src, lens, prev, _ = random_batch(task, [7, 4, 5])
    with torch.no_grad():
        for core in gated:
            _force_gate(core, 0)
        torch.testing.assert_close(ours(src, lens, prev)[0], ref(src, lens, prev)[0], atol=1e-5, rtol=1e-4)
        for core in gated:
            _force_gate(core, 1)
        torch.testing.assert_close(ours(src, lens, prev)[0], local(src, lens, prev)[0], atol=1e-6, rtol=1e-5)


# ---------------------------------------------------------------- decoding
DECODER = ["--hybrid-decoder-layers", "1-2"]
SETTINGS = {
    "gate": [],
    "gate_head_m2": ["--hybrid-gate", "head", "--hybrid-window-m", "2"],
    "concat": ["--hybrid-variant", "concat"],
    "local_pattern": ["--hybrid-variant", "local_pattern"],
    "neighbor": ["--hybrid-variant", "neighbor"],
    "neighbor_layer": ["--hybrid-variant", "neighbor", "--hybrid-neighbor-window", "layer"],
    "local_h": ["--hybrid-variant", "local_h"],
    "local_s": ["--hybrid-variant", "local_s"],
}


@pytest.mark.parametrize("setting", ["gate", "concat", "local_s"])
def test_sentence_does_not_change_when_batched_with_longer_ones(setting):
    model, task = build_model(ARCH, TINY + DECODER + SETTINGS[setting])
    check_generation_batch_invariance(model, task)


# ---------------------------------------------------------------- fingerprints
def _delta(arch_suffix, extra, ref_arch):
    with torch.device("meta"):
        ours, _ = build_model(ARCH + arch_suffix, extra)
        ref, _ = build_model(ref_arch)
    return count_parameters(ours) - count_parameters(ref)


def _expected(variant, d, h, layers, gate="token"):
    """Parameters a variant adds per the module docstrings (W_p: d x d; U_p, U_d: d x h)."""
    per_layer = {
        "gate": d + 1 if gate == "token" else h * (d + 1),
        "concat": d * d,  # out_proj becomes Linear(2d, d)
        "local_pattern": 0,
        "neighbor": d * d + d * h,  # W_p, U_d
        "local_h": d * d + d * h,  # W_p, U_p
        "local_s": d * d + 2 * d * h,  # W_p, U_p, U_d
    }[variant]
    return layers * per_layer


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_parameter_fingerprint_of_every_variant_tiny(variant):
    ours, _ = build_model(ARCH, TINY + ["--hybrid-variant", variant])
    ref, _ = build_model("transformer", TINY)
    assert count_parameters(ours) - count_parameters(ref) == _expected(variant, 32, 4, layers=2)


def test_parameter_fingerprint_gate_adds_d_plus_one_per_layer_at_base_and_big():
    assert _delta("_wmt_en_de", [], "transformer_wmt_en_de") == 2 * 513  # the paper's "+0.0M"
    assert _delta("_vaswani_wmt_en_de_big", [], "transformer_vaswani_wmt_en_de_big") == 2 * 1025
    assert _delta("_wmt_en_de", ["--hybrid-encoder-layers", "1-6", "--hybrid-decoder-layers", "all"],
                  "transformer_wmt_en_de") == 12 * 513
    assert _delta("_wmt_en_de", ["--hybrid-gate", "head"], "transformer_wmt_en_de") == 2 * 8 * 513


def test_parameter_fingerprint_baselines_at_base_size():
    base = lambda variant, layers="1-2": _delta(  # noqa: E731
        "_wmt_en_de", ["--hybrid-variant", variant, "--hybrid-encoder-layers", layers], "transformer_wmt_en_de"
    )
    for variant in ("concat", "neighbor", "local_h", "local_s"):
        assert base(variant) == _expected(variant, 512, 8, layers=2)
    # LOCAL_S in Yang et al.'s own setting (layers 1-3) is the paper's "+0.8M"
    assert abs(base("local_s", "1-3") / 1e6 - 0.8) < 0.02


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "args,message",
    [
        (["--hybrid-window-m", "-1"], "--hybrid-window-m must be an integer >= 0 (got -1)"),
        (["--hybrid-encoder-layers", "1-7"], "--hybrid-encoder-layers '1-7': layer 7 is out of range"),
        (["--hybrid-decoder-layers", "2-1"], "--hybrid-decoder-layers '2-1': empty range"),
        (["--hybrid-encoder-layers", "first"], "--hybrid-encoder-layers 'first': cannot parse"),
        (["--hybrid-variant", "concat", "--hybrid-gate", "head"],
         "--hybrid-gate head applies to --hybrid-variant gate only"),
        (["--hybrid-fixed-window", "0"], "--hybrid-fixed-window must be a finite number > 0"),
        (["--hybrid-min-window", "-1"], "--hybrid-min-window must be a finite number >= 0"),
    ],
)
def test_invalid_options_are_command_line_errors_naming_the_option(args, message, capsys):
    """On the command line: argparse-style, exit status 2, the message on stderr."""
    assert message in command_line_error(ARCH, args, capsys)


@pytest.mark.parametrize("flag", ["--hybrid-variant", "--hybrid-gate", "--hybrid-neighbor-window"])
def test_unknown_choice_is_an_argparse_error_naming_the_flag(flag, capsys):
    err = command_line_error(ARCH, [flag, "banana"], capsys)
    assert flag in err and "banana" in err


def test_unknown_variant_in_a_programmatic_config_fails_validation():
    args = parse_model_args(ARCH, TINY)
    options = HybridOptions.from_args(args)
    options.hybrid_variant = "hybrid"
    with pytest.raises(OptionError, match="--hybrid-variant 'hybrid': unknown value; allowed: gate, concat, "
                                          "local_pattern, neighbor, local_h, local_s"):
        options.validate(args)


# ---------------------------------------------------------------- observability
def test_gates_recorded_per_token_and_layer_and_stripped_of_padding():
    model, task = build_model(ARCH, TINY + DECODER)
    src, lens, prev, _ = random_batch(task, [6, 3], seed=3)
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(src, lens, prev)
    names = sorted(n for n in rec.records if n.endswith("fusion"))
    assert names == [f"{side}.layers.{i}.self_attn.fusion" for side in ("decoder", "encoder") for i in (0, 1)]
    call = rec.records["encoder.layers.0.self_attn.fusion"][0]
    assert call["gate"].shape == (2, 6) and call["real"].tolist() == [[1] * 6, [0, 0, 0, 1, 1, 1]]
    per_sentence = sentence_gates(call)
    assert [g.shape[0] for g in per_sentence] == [6, 3]
    # the recorded gate is eq. 5 applied to the layer input
    layer = model.encoder.layers[0]
    x = model.encoder.forward_embedding(src)[0].transpose(0, 1)  # T x B x C
    g = torch.sigmoid(layer.self_attn.fusion.gate(x)).squeeze(-1).t()  # B x T
    torch.testing.assert_close(per_sentence[1], g[1, 3:].detach())
    means = mean_gate_per_layer(rec.records)
    expected = torch.cat([p.flatten() for p in per_sentence]).mean().item()
    assert math.isclose(means["encoder.layers.0.self_attn.fusion"], expected, rel_tol=1e-6)
    assert set(means) == set(names)


def test_per_head_gate_is_recorded_per_head():
    model, task = build_model(ARCH, TINY + ["--hybrid-gate", "head"])
    src, lens, prev, _ = random_batch(task, [5, 2], seed=3)
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(src, lens, prev)
    call = rec.records["encoder.layers.1.self_attn.fusion"][0]
    assert call["gate"].shape == (2, 4, 5)
    assert [g.shape for g in sentence_gates(call)] == [(4, 5), (4, 2)]


def test_mean_gate_logged_in_training_and_validation_not_in_inference():
    from fairseq.logging import metrics

    model, task = build_model(ARCH, TINY)
    src, lens, prev, _ = random_batch(task, [6, 3], seed=3)
    model.train()
    with metrics.aggregate(new_root=True) as agg:
        model(src, lens, prev)
    values = agg.get_smoothed_values()
    assert {k for k in values if k.endswith("gate")} == {"enc1_gate", "enc2_gate"}
    assert all(0.0 < values[k] < 1.0 for k in ("enc1_gate", "enc2_gate"))

    model.eval()
    with torch.no_grad(), metrics.aggregate(new_root=True) as agg:
        model(src, lens, prev)  # inference (e.g. fairseq-generate): nothing logged
    assert "enc1_gate" not in agg.get_smoothed_values()
    with torch.no_grad(), metrics.aggregate(new_root=True) as agg, metrics.aggregate("valid"):
        model(src, lens, prev)  # fairseq's validation: the paper's Fig. 3 over the valid set
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(src, lens, prev)
    means = mean_gate_per_layer(rec.records)
    valid = agg.get_smoothed_values()
    # the logged value is the padding-free mean of the batch
    assert math.isclose(valid["enc1_gate"], means["encoder.layers.0.self_attn.fusion"], abs_tol=1e-3)


def test_gaussian_baselines_use_the_gaussian_machinery_alone():
    expected = {"neighbor": ("self", "query"), "local_h": ("predicted", "fixed"), "local_s": ("predicted", "query")}
    for variant, (centre, window) in expected.items():
        model, _ = build_model(ARCH, TINY + ["--hybrid-variant", variant])
        attn = model.encoder.layers[0].self_attn
        assert len(attn.branches) == 1 and isinstance(attn.branches[0], GaussianLocalness)
        assert (attn.branches[0].centre, attn.branches[0].window) == (centre, window)
        assert model.encoder.layers[2].self_attn.__class__.__name__ == "MultiheadAttention"
    model, _ = build_model(ARCH, TINY + ["--hybrid-variant", "local_h", "--hybrid-fixed-window", "6"])
    assert model.encoder.layers[1].self_attn.branches[0].fixed_window == 6
    model, _ = build_model(ARCH, TINY + ["--hybrid-variant", "concat"])
    assert isinstance(model.encoder.layers[0].self_attn.fusion, ConcatFusion)


# ---------------------------------------------------------------- the real command lines
CLI_VARIANTS = {
    "gate": ["--hybrid-decoder-layers", "1"],
    "concat": [],
    "local_pattern": ["--hybrid-window-m", "2"],
    "neighbor": ["--hybrid-decoder-layers", "1-2"],
    "local_h": [],
    "local_s": ["--hybrid-decoder-layers", "all"],
}


@pytest.mark.parametrize("variant", list(CLI_VARIANTS))
def test_train_and_generate_each_table1_variant(variant, tmp_path):
    from conftest import train_and_generate

    run = train_and_generate(ARCH + "_tiny", ["--hybrid-variant", variant, *CLI_VARIANTS[variant]], tmp_path)
    valid = [line for line in run.train_log.splitlines() if "valid on 'valid' subset" in line]
    assert valid, "no validation line in the training log"
    if variant == "gate":  # the mean gate per layer: training and validation metrics
        for name in ("enc1_gate", "enc2_gate", "dec1_self_gate"):
            assert f"| {name} " in run.train_log
            assert f"| {name} " in valid[-1]
        assert "enc3_gate" not in run.train_log
        _check_gate_dump(run.checkpoint, tmp_path)
    elif variant in ("neighbor", "local_h", "local_s"):
        assert "| enc1_window " in run.train_log and "| enc3_window " not in run.train_log


def _check_gate_dump(checkpoint, tmp_path):
    """fairseq-localness-dump writes the gate of every real token, per gated layer."""
    from conftest import get_tiny_data, run_fairseq

    data = get_tiny_data()
    out = tmp_path / "gates.jsonl"
    run_fairseq("fairseq-localness-dump", [data.data_bin, "--path", checkpoint, "--split", "valid",
                                           "--max-sentences", "4", "--output", out])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    gated = [r for r in rows if r["module"].endswith("fusion")]
    assert {r["module"] for r in gated} == {
        "encoder.layers.0.self_attn.fusion", "encoder.layers.1.self_attn.fusion", "decoder.layers.0.self_attn.fusion"
    }
    assert len(gated) == 12
    for r in gated:
        gate, real = r["stats"]["gate"], r["stats"]["real"]
        assert len(gate) == len(real) > 0 and all(v == 1 for v in real)  # padding removed
        assert all(0 < g < 1 for g in gate)
