"""The seams between the tiers (README "Architecture"): the fusion interface, the
query keep-mask of the attention context, the core's ``self_positions`` flag, the one
metrics policy of ``Observable``, the record keys shared by modules and analysis, and
the shared model machinery (default layer plans, the small preset, the layer specs
handed to fairseq's layer builders)."""
import pytest
import torch

from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.context import real_positions
from fairseq_localness.modules.branches import global_branch, local_branch
from fairseq_localness.modules.fusion import ConcatFusion, Fusion, MergeHeads, SumFusion, merge_heads
from fairseq_localness.modules.observe import (
    GATE_PREFIX,
    PROBS_PREFIX,
    TRAIN,
    VALID,
    AttentionRecorder,
    Observable,
    branch_of,
    gate_key,
    masked_mean,
    probs_key,
)
from model_utils import TINY, build_model, parse_model_args, random_batch

C, H, B, T = 16, 4, 3, 6


def _left_padding(lengths, total):
    return torch.stack([torch.arange(total) < total - n for n in lengths])


# ------------------------------------------------------------------ fusions
@pytest.mark.parametrize("num_branches", [1, 2, 3, 4])
def test_one_concat_fusion_for_any_number_of_branches(num_branches):
    fusion = ConcatFusion(num_branches)
    assert isinstance(fusion, Fusion) and fusion.output_dim(C) == num_branches * C
    assert list(fusion.parameters()) == []  # the core's Linear(L*C, C) is the paper's H
    outputs = [torch.randn(B, H, T, C // H) for _ in range(num_branches)]
    fused = fusion(outputs, None)
    assert fused.shape == (T, B, num_branches * C)
    for b, out in enumerate(outputs):
        torch.testing.assert_close(fused[..., b * C:(b + 1) * C], merge_heads(out))
    core = AttentionCore(C, H, self_attention=True, branches=[local_branch(k) for k in range(num_branches)],
                         fusion=fusion)
    assert core.out_proj.weight.shape == (C, num_branches * C)


def test_merge_heads_and_sum_are_the_defaults():
    one = AttentionCore(C, H, self_attention=True)
    two = AttentionCore(C, H, self_attention=True, branches=[global_branch(), local_branch(1)])
    assert type(one.fusion) is MergeHeads and type(two.fusion) is SumFusion
    outputs = [torch.randn(B, H, T, C // H) for _ in range(3)]
    torch.testing.assert_close(SumFusion()(outputs, None), merge_heads(sum(outputs)))
    with pytest.raises(AssertionError):
        MergeHeads()(outputs, None)
    with pytest.raises(ValueError, match="at least one branch"):
        ConcatFusion(0)


def test_hybrid_and_hysan_concatenations_are_the_one_fusion():
    model, _ = build_model("hybrid_transformer", TINY + ["--hybrid-variant", "concat"])
    assert type(model.encoder.layers[0].self_attn.fusion) is ConcatFusion
    assert model.encoder.layers[0].self_attn.fusion.num_branches == 2
    model, _ = build_model("hysan_transformer", TINY + ["--hysan-fusion", "concat"])
    assert type(model.encoder.layers[0].self_attn.fusion) is ConcatFusion
    assert model.encoder.layers[0].self_attn.fusion.num_branches == 4
    assert model.decoder.layers[0].self_attn.fusion.num_branches == 2


# ------------------------------------------------------------------ the context
class _Capture(Fusion):
    def forward(self, outputs, ctx):
        self.ctx = ctx
        return merge_heads(outputs[0])


@pytest.mark.parametrize("tgt_len", [T, 2])
def test_query_keep_marks_the_real_queries(tgt_len):
    """Queries are the last Tq key positions (bottom-right aligned), so a decoding step
    sees the same keep-mask as the full pass at its position."""
    fusion = _Capture()
    core = AttentionCore(C, H, self_attention=True, fusion=fusion)
    x = torch.randn(T, B, C)
    kpm = torch.tensor([[False] * T, [True] * 2 + [False] * 4, [False] * 4 + [True] * 2])
    core(x[T - tgt_len:], x[T - tgt_len:], x[T - tgt_len:], key_padding_mask=kpm[:, T - tgt_len:])
    assert fusion.ctx.query_keep().tolist() == (~kpm[:, T - tgt_len:]).tolist()
    core(x, x, x)  # no padding: every query is real
    assert fusion.ctx.query_keep() is None
    cross = AttentionCore(C, H, encoder_decoder_attention=True, fusion=_Capture())
    cross(x[:2], x, x, key_padding_mask=kpm)
    assert cross.fusion.ctx.query_keep() is None  # queries are not key positions


def test_self_positions_is_self_attention_with_keys_from_their_own_input():
    """With the key input equal to the query input, a ``self_positions`` core computes
    what a self-attention core computes with the same weights (full pass, padding,
    causal and incremental), and its context reports self-attention positions."""
    torch.manual_seed(0)
    for causal in (False, True):
        ref = AttentionCore(C, H, self_attention=True, causal=causal, branches=[local_branch(1)]).eval()
        fusion = _Capture()
        core = AttentionCore(C, H, self_positions=True, causal=causal, branches=[local_branch(1)],
                             fusion=fusion).eval()
        core.load_state_dict(ref.state_dict())
        x = torch.randn(T, B, C)
        kpm = None if causal else _left_padding([6, 4, 2], T)
        a, _ = ref(x, x, x, key_padding_mask=kpm)
        b, _ = core(x, x, x, key_padding_mask=kpm)
        torch.testing.assert_close(a, b)
        assert fusion.ctx.self_attention
        assert fusion.ctx.q_pos.tolist() == real_positions(kpm, T, "cpu").tolist()
        if causal:
            state_a, state_b = {}, {}
            for t in range(T):
                step = x[t:t + 1]
                sa, _ = ref(step, step, step, incremental_state=state_a)
                sb, _ = core(step, step, step, incremental_state=state_b)
                torch.testing.assert_close(sa, a[t:t + 1], atol=1e-6, rtol=1e-5)
                torch.testing.assert_close(sb, a[t:t + 1], atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="self_positions"):
        AttentionCore(C, H, self_attention=True, self_positions=True)


# ------------------------------------------------------------------ observability
class _Metric(torch.nn.Module, Observable):
    def forward(self, x):
        if self.logging_metrics:
            self.log_metric("value", x.mean())
        return x


@pytest.mark.parametrize("passes,train,inference,valid", [
    ((TRAIN,), True, False, False),
    ((TRAIN, VALID), True, False, True),
    ((VALID,), False, False, True),
    ((), False, False, False),
])
def test_one_metrics_policy(passes, train, inference, valid):
    from fairseq.logging import metrics

    module = _Metric()
    module.metric_passes = passes
    x = torch.ones(2)
    with metrics.aggregate(new_root=True) as agg:
        module.train()(x)
    assert ("value" in agg.get_smoothed_values()) is False  # unlabelled modules never log
    module.metric_prefix = "enc1"
    for mode, context, expected in (("train", None, train), ("eval", None, inference), ("eval", "valid", valid)):
        getattr(module, mode)()
        with metrics.aggregate(new_root=True) as agg:
            if context is None:
                module(x)
            else:
                with metrics.aggregate(context):
                    module(x)
        assert ("enc1_value" in agg.get_smoothed_values()) is expected, (mode, context)


@pytest.mark.parametrize("value_shape,keep_shape", [
    ((T, B, C), (T, B, 1)),  # a gate over the real tokens (HySAN, the hybrid)
    ((B, H, T), (B, 1, T)),  # per-head centres over the real queries (Yang et al.)
    ((B, H, T), (H, T)),  # a mask of fewer dimensions
    ((T, B, C), (T, B, C)),  # a mask of the value's own shape
])
def test_masked_mean_is_the_mean_over_the_kept_positions(value_shape, keep_shape):
    """The logged means: the mean over the positions ``keep`` broadcasts to, as the
    mean of the selected elements; in float32 for a bfloat16 value; 0 with nothing kept."""
    g = torch.Generator().manual_seed(0)
    value = torch.randn(*value_shape, generator=g)
    keep = torch.rand(*keep_shape, generator=g) > 0.3
    expected = value[keep.expand(value_shape)].mean()
    torch.testing.assert_close(masked_mean(value, keep), expected)
    half = masked_mean(value.bfloat16(), keep)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, value.bfloat16().float()[keep.expand(value_shape)].mean())
    assert masked_mean(value, torch.zeros(keep_shape, dtype=torch.bool)).item() == 0.0
    torch.testing.assert_close(masked_mean(value, None), value.mean())


def test_the_models_declare_their_metric_passes():
    model, _ = build_model("hybrid_transformer", TINY)
    assert model.encoder.layers[0].self_attn.fusion.metric_passes == (TRAIN, VALID)  # Xu Fig. 3 in validation
    model, _ = build_model("localness_transformer", TINY)
    assert model.encoder.layers[0].self_attn.branches[0].metric_passes == (TRAIN,)
    model, _ = build_model("hysan_transformer", TINY)
    assert model.encoder.layers[0].self_attn.fusion.metric_passes == (TRAIN,)
    model, _ = build_model("dc_transformer", TINY + ["--dc-log-divergence"])
    assert model.encoder.layers[0].self_attn.metric_passes == (VALID,)
    model, _ = build_model("dc_transformer", TINY)
    assert model.encoder.layers[0].self_attn.metric_passes == ()


def test_record_keys_are_shared_by_modules_and_analysis():
    assert probs_key("backward") == "probs_backward" and gate_key("local1") == "gate_local1"
    assert branch_of("probs_local2", PROBS_PREFIX) == "local2" and branch_of("gate_forward", GATE_PREFIX) == "forward"
    assert branch_of("gate", GATE_PREFIX) is None and branch_of("P", PROBS_PREFIX) is None
    model, task = build_model("hysan_transformer", TINY)
    src, lens, prev, _ = random_batch(task, [5, 3], seed=1)
    with AttentionRecorder(model) as rec, torch.no_grad():
        model(src, lens, prev)
    attn = model.encoder.layers[0].self_attn
    assert attn.record_name == "encoder.layers.0.self_attn"
    assert set(rec.calls(attn)[0]) == {probs_key(b) for b in ("global", "forward", "backward", "local1")}
    assert set(rec.calls(attn.fusion)[0]) == {gate_key(b) for b in ("global", "forward", "backward", "local1")}


# ------------------------------------------------------------------ models
def test_the_small_preset_is_shared_and_differs_in_the_layers_only():
    hysan = parse_model_args("hysan_transformer_iwslt_small")
    dc = parse_model_args("dc_transformer_iwslt_small")
    for args, layers in ((hysan, 2), (dc, 4)):
        for side in ("encoder", "decoder"):
            assert getattr(args, f"{side}_embed_dim") == 256
            assert getattr(args, f"{side}_ffn_embed_dim") == 1024
            assert getattr(args, f"{side}_attention_heads") == 4
            assert getattr(args, f"{side}_layers") == layers
    assert parse_model_args("dc_transformer_iwslt_small", ["--encoder-layers", "3"]).encoder_layers == 3


@pytest.mark.parametrize("arch,extra,encoder,decoder", [
    ("hybrid_transformer", [], [0, 1], []),
    ("hybrid_transformer", ["--hybrid-decoder-layers", "2-3"], [0, 1], [1, 2]),
    ("hysan_transformer", ["--hysan-encoder-layers", "1,3"], [0, 2], [0, 1, 2]),
    ("dc_transformer", ["--dc-mode", "dec", "--dc-decoder-layers", "2"], [], [1]),
    ("localness_transformer", [], [0, 1, 2], []),
])
def test_default_layer_plans_follow_the_layer_options(arch, extra, encoder, decoder):
    from fairseq_localness.modules.dual_context import DualContextModule

    model, _ = build_model(arch, TINY + extra)
    ours = (AttentionCore, DualContextModule)
    for side, expected in (("encoder", encoder), ("decoder", decoder)):
        layers = getattr(model, side).layers
        assert [i for i, layer in enumerate(layers) if isinstance(layer.self_attn, ours)] == expected, side


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_concat_projection_keeps_the_branch_outputs_not_their_concatenation(dtype):
    """ConcatFusion.project (the fusion and the output projection together) equals
    Linear(cat(x_b)) in its output and in every gradient, and what its backward pass
    keeps is the branch outputs and the weight, not the Tq x B x L*C concatenation."""
    from fairseq_localness.modules.fusion import ConcatFusion, merge_heads

    torch.manual_seed(0)
    fusion, proj = ConcatFusion(3), torch.nn.Linear(3 * 16, 16).to(dtype)
    outs = [torch.randn(2, 4, 5, 4, dtype=dtype, requires_grad=True) for _ in range(3)]
    weight = torch.randn(5, 2, 16, dtype=dtype)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fusion.project(outs, None, proj)
    (y * weight).sum().backward()
    got = [t.grad.clone() for t in outs + [proj.weight, proj.bias]]
    assert {t.data_ptr() for t in saved} == {t.data_ptr() for t in outs + [proj.weight]}
    for t in outs + [proj.weight, proj.bias]:
        t.grad = None
    ref = proj(torch.cat([merge_heads(x) for x in outs], dim=-1))
    (ref * weight).sum().backward()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(y, ref, **tol)
    for a, t in zip(got, outs + [proj.weight, proj.bias]):
        assert a.dtype == t.grad.dtype == dtype
        torch.testing.assert_close(a.float(), t.grad.float(), **tol)


def test_layer_specs_are_plain_attributes_and_no_build_state_is_left():
    """Each layer keeps its spec as a plain attribute; the queue that hands the specs
    to fairseq's build_*_layer (which gets no layer index) is gone after the build."""
    import glob
    import os

    model, _ = build_model("hybrid_transformer", TINY + ["--hybrid-decoder-layers", "2"])
    assert [layer.layer_spec.label for layer in model.encoder.layers] == ["enc1", "enc2", "enc3"]
    assert [layer.layer_spec.self_attention is not None for layer in model.decoder.layers] == [False, True, False]
    assert "layer_spec" in vars(model.encoder.layers[0])
    assert not hasattr(model.encoder, "layer_queue") and not hasattr(model.decoder, "layer_queue")
    models_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "fairseq_localness", "models")
    for path in glob.glob(os.path.join(models_dir, "*.py")):
        with open(path, encoding="utf-8") as f:
            assert "__dict__[" not in f.read(), path


def test_a_plan_that_does_not_match_the_layer_count_is_an_error():
    from fairseq.models.transformer import TransformerConfig

    from fairseq_localness.models._locality import LayerSpec, LocalityTransformerEncoder

    model, task = build_model("hybrid_transformer", TINY)
    cfg = TransformerConfig.from_namespace(parse_model_args("hybrid_transformer", TINY))
    for count, message in ((2, "fairseq built more encoder layers than the plan has [(]2[)]"),
                           (4, "the plan has 4 encoder layers but fairseq built 3")):
        specs = [LayerSpec("encoder", i) for i in range(count)]  # the encoder has 3 layers
        with pytest.raises(RuntimeError, match=message):
            LocalityTransformerEncoder(cfg, task.source_dictionary, model.encoder.embed_tokens, specs)


# ------------------------------------------------------------------ beam search's reorder
@pytest.mark.parametrize("arch", ["localness_transformer", "hybrid_transformer", "hysan_transformer", "dc_transformer"])
def test_the_decoders_reorder_the_modules_fairseqs_walk_finds(arch):
    """Beam search's reorder (``reorder_incremental_state_scripting``) calls the modules
    that fairseq's walk over ``modules()`` with ``hasattr`` finds, in its order, each
    once: also a module shared by two layers, and one whose instance alone has the
    method; and it reorders what they keep."""
    from fairseq_localness.models._locality.layers import stateful_modules

    extra = ["--hybrid-decoder-layers", "1-2"] if arch == "hybrid_transformer" else []
    model, task = build_model(arch, extra)
    decoder = model.decoder
    shared = AttentionCore(C, H, self_attention=True)
    decoder.layers[0].add_module("extra", shared)
    decoder.layers[1].add_module("extra", shared)  # visited once
    own = torch.nn.Linear(2, 2)
    calls = []
    own.reorder_incremental_state = lambda state, order: calls.append(order)
    decoder.layers[1].add_module("own", own)
    fairseq_walk = [m for m in decoder.modules() if hasattr(m, "reorder_incremental_state")]
    found = stateful_modules(decoder)
    assert [id(m) for m in found] == [id(m) for m in fairseq_walk]
    assert sum(m is shared for m in found) == 1 and any(m is own for m in found)
    state = {}
    key = torch.randn(3, H, 2, C // H)
    shared._set_input_buffer(state, {"prev_key": key})
    order = torch.tensor([2, 0, 1])
    decoder.reorder_incremental_state_scripting(state, order)
    assert len(calls) == 1 and calls[0] is order
    torch.testing.assert_close(shared._get_input_buffer(state)["prev_key"], key[order])
