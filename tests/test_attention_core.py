"""The attention core: parity with fairseq's MultiheadAttention, fast path == eager
path, safe softmax on empty rows, caching and reordering, masks, relative positions."""
import math

import pytest
import torch
from fairseq.modules import MultiheadAttention
from model_utils import OperatorCalls

from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.context import AttentionBranch, AttentionContext, causal_mask, real_positions
from fairseq_localness.modules.branches import (
    WindowBranch,
    backward_branch,
    forward_branch,
    global_branch,
    local_branch,
)
from fairseq_localness.modules.gaussian import GaussianLocalness
from fairseq_localness.modules.hybrid import GateFusion
from fairseq_localness.modules.hysan import ConcatFusion, GatedSumFusion, make_branch
from fairseq_localness.modules.relative_position import RelativePositions

C, H, B, T = 16, 4, 3, 6


def _pair(**kwargs):
    torch.manual_seed(0)
    ref = MultiheadAttention(C, H, **kwargs).eval()
    core = AttentionCore(C, H, **kwargs).eval()
    core.load_state_dict(ref.state_dict())
    return ref, core


def _left_padding(lengths, total):
    return torch.stack([torch.arange(total) < total - n for n in lengths])


@pytest.mark.parametrize("impl", ["auto", "eager"])
def test_self_attention_matches_fairseq(impl):
    ref, core = _pair(self_attention=True)
    core.attention_impl = impl
    x = torch.randn(T, B, C)
    kpm = _left_padding([6, 4, 2], T)
    a, _ = ref(x, x, x, key_padding_mask=kpm, need_weights=False)
    b, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_weights_match_fairseq():
    ref, core = _pair(self_attention=True)
    x = torch.randn(T, B, C)
    kpm = _left_padding([6, 4, 2], T)
    _, wa = ref(x, x, x, key_padding_mask=kpm, need_weights=True)  # B x Tq x Tk, head average
    _, wb = core(x, x, x, key_padding_mask=kpm, need_weights=True)
    _, heads = core(x, x, x, key_padding_mask=kpm, need_weights=True, need_head_weights=True)
    torch.testing.assert_close(wa, wb, atol=1e-6, rtol=1e-5)
    assert heads.shape == (H, B, T, T)
    torch.testing.assert_close(heads.mean(0), wb)


def test_encoder_decoder_attention_matches_fairseq_incrementally():
    ref, core = _pair(encoder_decoder_attention=True)
    enc = torch.randn(5, B, C)
    kpm = _left_padding([5, 3, 4], 5)
    state_a, state_b = {}, {}
    for _ in range(3):
        q = torch.randn(1, B, C)
        a, _ = ref(q, enc, enc, key_padding_mask=kpm, incremental_state=state_a, static_kv=True, need_weights=False)
        b, _ = core(q, enc, enc, key_padding_mask=kpm, incremental_state=state_b, static_kv=True, need_weights=False)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


class SharpBias(AttentionBranch):
    """A bias far below float16's range everywhere (``-1e7 (j - i - 1/4)^2``): the
    float32 reference still has a distribution (peaked at j = i), which float16's
    attention mask can only carry after the row shift of ``_half_safe_bias``."""

    name = "sharp"

    def bias(self, ctx):
        distance = (ctx.k_pos[:, None, None, :] - ctx.q_pos[:, None, :, None]).float()
        return -1e7 * (distance - 0.25) ** 2


def _gaussian():
    return GaussianLocalness(C, H, window="query")


# name -> () -> (branches, fusion, relative positions); every branch kind, one to four
# branches, masks and biases, and each fusion kind
BRANCH_SETS = {
    "global": lambda: ([AttentionBranch()], None, None),
    "local1": lambda: ([local_branch(1)], None, None),
    "forward": lambda: ([forward_branch()], None, None),
    "backward": lambda: ([backward_branch()], None, None),
    "causal_local2": lambda: ([WindowBranch(2, 0, "causal_local2")], None, None),
    "gaussian": lambda: ([_gaussian()], None, None),
    "sharp_bias": lambda: ([SharpBias()], None, None),
    "shaw_keys_only": lambda: ([local_branch(2)], None, RelativePositions(C // H, 2, values=False)),
    "hybrid_gate": lambda: ([global_branch(), local_branch(1, "local")], GateFusion(C, H), None),
    "hysan_gated": lambda: (
        [make_branch(n, "encoder") for n in ("global", "forward", "backward", "local2")],
        GatedSumFusion(C, ["global", "forward", "backward", "local2"], reduction=4), None,
    ),
    "gaussian+local_concat": lambda: ([_gaussian(), local_branch(1)], ConcatFusion(2), None),
    "sum_of_three": lambda: ([forward_branch(), local_branch(1), WindowBranch(2, 0, "causal_local2")], None, None),
}
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                reason="needs a CUDA GPU"))]
# outputs (atol = rtol) and gradients (max-abs over max(1, max |g|)) of one core fed the
# same inputs on both paths
CORE_TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def _padding(causal: bool, device) -> torch.Tensor:
    """Sentence 2 is all padding (every row of it empty); the encoder pads on the
    left as fairseq does, the decoder's targets are padded on the right."""
    lengths = [T, T - 3, 0]
    if causal:
        return torch.stack([torch.arange(T) >= n for n in lengths]).to(device)
    return _left_padding(lengths, T).to(device)


def _run_core(core, x, kpm, impl, weight):
    from model_utils import attention_paths

    core.attention_impl = impl
    core.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(True)
    with attention_paths() as paths:
        out, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    (out.float() * weight).sum().backward()
    grads = {"input": x.grad}
    grads.update({name: p.grad for name, p in core.named_parameters() if p.grad is not None})
    return out, grads, paths


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", list(BRANCH_SETS))
def test_sdpa_path_equals_eager_path(kind, causal, dtype, device):
    """Every branch kind and count, in fp32, bf16 and fp16, on padded batches with
    empty rows: the fast path (which must be the one taken) gives the eager path's
    outputs and gradients (inputs and parameters); no NaN anywhere."""
    torch.manual_seed(1)
    branches, fusion, rel = BRANCH_SETS[kind]()
    core = AttentionCore(C, H, self_attention=True, causal=causal, branches=branches, fusion=fusion,
                         relative_positions=rel).to(device=device, dtype=dtype).train()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, B, C, generator=g).to(device=device, dtype=dtype)
    weight = torch.randn(T, B, C, generator=g).to(device)
    kpm = _padding(causal, device)
    slow, slow_grads, slow_paths = _run_core(core, x, kpm, "eager", weight)
    fast, fast_grads, fast_paths = _run_core(core, x, kpm, "sdpa", weight)
    assert fast_paths["sdpa"] and not fast_paths["eager"], "the fast path was not taken"
    assert slow_paths["eager"] and not slow_paths["sdpa"]
    assert fast.dtype == dtype and bool(torch.isfinite(fast).all())
    tol = CORE_TOL[dtype]
    torch.testing.assert_close(fast.float(), slow.float(), atol=tol, rtol=tol)
    assert set(fast_grads) == set(slow_grads)
    for name, ref in slow_grads.items():
        got = fast_grads[name]
        assert bool(torch.isfinite(got).all()), f"non-finite gradient of {name}"
        scale = max(1.0, ref.float().abs().max().item())
        torch.testing.assert_close(got.float() / scale, ref.float() / scale, atol=tol, rtol=tol, msg=name)
    # the all-padding sentence: no key anywhere, zero attention, only the output bias
    torch.testing.assert_close(fast[:, 2].float(), core.out_proj.bias.float().expand(T, C))


def test_auto_takes_the_fast_path_except_for_several_branches_trained_on_a_cpu_with_dropout():
    """``"auto"``: the fast path for one branch, for several branches over more than
    EAGER_MAX_KEYS keys trained without attention dropout or run without gradients,
    and in half precision; the eager path for several float32 branches on a CPU
    trained with attention dropout or over at most EAGER_MAX_KEYS keys; run without
    gradients over at most EAGER_MAX_KEYS keys, windows alone take one product for
    all (other branches, or attention dropout, the eager path); ``"sdpa"`` forces the
    fast path there; an unknown setting is an error naming the allowed ones, from the
    core and from ``set_attention_impl``."""
    from model_utils import attention_paths

    from fairseq_localness.modules.attention import set_attention_impl
    from fairseq_localness.modules.kernels.choice import EAGER_MAX_KEYS

    def paths(core, dtype=torch.float32, grad=True, length=T, attn_mask=None):
        x = torch.randn(length, B, C, dtype=dtype)
        with attention_paths() as taken, torch.set_grad_enabled(grad):
            core.to(dtype)(x, x, x, need_weights=False, attn_mask=attn_mask)
        return {path for path, calls in taken.items() if calls}

    single = AttentionCore(C, H, self_attention=True, branches=[local_branch(1)], dropout=0.1)
    several = AttentionCore(C, H, self_attention=True, branches=[global_branch(), local_branch(1)], dropout=0.1)
    no_dropout = AttentionCore(C, H, self_attention=True, branches=[global_branch(), local_branch(1)])
    assert paths(single) == {"sdpa"}
    assert paths(no_dropout, length=EAGER_MAX_KEYS + 1) == {"sdpa"}
    assert paths(no_dropout, length=EAGER_MAX_KEYS) == {"eager"}
    assert paths(no_dropout, grad=False) == {"windows"}
    assert paths(no_dropout, grad=False, length=EAGER_MAX_KEYS + 1) == {"sdpa"}
    gaussian = AttentionCore(C, H, self_attention=True, branches=[global_branch(), GaussianLocalness(C, H, window="query")])
    assert paths(gaussian, grad=False) == {"eager"}  # a branch that is not a window alone
    # windows with something of the call's own (an attn_mask, Shaw et al.'s terms): eager
    assert paths(no_dropout, grad=False, attn_mask=torch.zeros(T, T, dtype=torch.bool)) == {"eager"}
    shaw = AttentionCore(C, H, self_attention=True, branches=[global_branch(), local_branch(1)],
                         relative_positions=RelativePositions(C // H, 2))
    assert paths(shaw, grad=False) == {"eager"}
    assert paths(no_dropout, torch.bfloat16, grad=False) == {"sdpa"}  # half precision: per branch
    no_dropout.float()
    assert paths(several) == {"eager"}
    assert paths(several, length=EAGER_MAX_KEYS + 1) == {"eager"}
    assert paths(several, torch.bfloat16) == {"sdpa"}
    several.float()
    assert paths(several, grad=False) == {"eager"}
    several.eval()  # no dropout drawn
    assert paths(several, length=EAGER_MAX_KEYS + 1) == {"sdpa"}
    assert paths(several) == {"eager"}  # few keys
    several.train()
    several.requires_grad_(False)  # frozen parameters: nothing to train
    assert paths(several) == {"sdpa"}
    several.requires_grad_(True)
    assert set_attention_impl(several, "sdpa") == 1
    assert paths(several, torch.float32) == {"sdpa"}
    several.attention_impl = "fast"
    with pytest.raises(ValueError, match="allowed: auto, sdpa, eager"):
        paths(several)
    with pytest.raises(ValueError, match="attention_impl 'fast': allowed: auto, sdpa, eager"):
        set_attention_impl(several, "fast")


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", ["hybrid_gate", "hysan_gated", "sum_of_three"])
def test_windows_without_gradients_take_one_product_equal_to_the_eager_path(kind, causal):
    """A full pass without gradients (beam search's encoder pass, validation) over few
    keys on a CPU, every branch a window: ``"auto"`` computes the windows in one
    product (:func:`~.kernels.windows.windows_attention`) and gives the eager path's
    output, on padded batches with empty rows (the all-padding sentence gives the
    output projection's bias alone)."""
    from model_utils import attention_paths

    torch.manual_seed(1)
    branches, fusion, _ = BRANCH_SETS[kind]()
    core = AttentionCore(C, H, self_attention=True, causal=causal, branches=branches, fusion=fusion).eval()
    x = torch.randn(T, B, C, generator=torch.Generator().manual_seed(2))
    kpm = _padding(causal, "cpu")
    out = {}
    for impl in ("eager", "auto"):
        core.attention_impl = impl
        with attention_paths() as paths, torch.no_grad():
            out[impl], _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
        taken = {path for path, calls in paths.items() if calls}
        assert taken == ({"eager"} if impl == "eager" else {"windows"}), (impl, taken)
    assert bool(torch.isfinite(out["auto"]).all())
    torch.testing.assert_close(out["auto"], out["eager"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["auto"][:, 2], core.out_proj.bias.expand(T, C))


def test_windows_of_fewer_queries_than_keys_equal_one_masked_softmax_per_window():
    """:func:`~.kernels.windows.windows_attention` with the queries at the last keys
    (Tq < Tk, bottom-right aligned), windows bounded on either side or not at all and
    left padding (a row without keys gives 0) == a softmax per window over its
    mask, in float64."""
    from fairseq_localness.modules.kernels.windows import windows_attention
    from fairseq_localness.modules.scores import Window

    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, 2, n, 4, dtype=torch.float64, generator=g) for n in (5, 9, 9))
    kpm = _left_padding([9, 6, 2], 9)
    windows = [Window(None, None), Window(1, 1), Window(None, 0), Window(0, None), Window(2, 0)]
    out = windows_attention(q, k, v, 0.5, kpm, windows)
    assert out.shape == (3, 2, len(windows), 5, 4)
    distance = torch.arange(9)[None, :] - torch.arange(4, 9)[:, None]  # j - i, query i at key 4 + i
    for b, window in enumerate(windows):
        blocked = kpm[:, None, None, :] | (window.blocked(distance) if window.bounded else False)
        scores = (q @ k.transpose(-1, -2) * 0.5).masked_fill(blocked, float("-inf"))
        want = (torch.softmax(scores, -1).nan_to_num(0.0)) @ v
        torch.testing.assert_close(out[:, :, b], want, atol=1e-12, rtol=0)
    assert bool((out[2, :, 4, :3] == 0).all())  # window (2, 0): the first three queries of sentence 2 see padding alone


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_dropout_is_drawn_independently_per_branch(impl):
    """Two identical branches whose outputs are kept apart (concatenation, no output
    projection): without dropout they are equal, with dropout they differ, on both
    paths."""
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, branches=[AttentionBranch(), AttentionBranch()],
                         fusion=ConcatFusion(2), output_projection=False, dropout=0.5).train()
    core.attention_impl = impl
    x = torch.randn(T, B, C)
    out, _ = core(x, x, x, need_weights=False)
    first, second = out[..., :C], out[..., C:]
    assert not torch.allclose(first, second)
    core.eval()
    out, _ = core(x, x, x, need_weights=False)
    torch.testing.assert_close(out[..., :C], out[..., C:])


def test_window_masks_are_cached_views():
    """A window mask is built once per (left, right, device) and handed out as views:
    no computation per call, and one row for an incremental step."""
    branch = local_branch(2)

    def ctx(tq, tk):
        q = torch.zeros(1, H, tq, C // H)
        return AttentionContext(query_input=None, q=q, k=torch.zeros(1, H, tk, C // H), key_padding_mask=None,
                                q_pos=None, k_pos=None, lengths=None, causal=False, self_attention=True)

    full, step = branch.mask(ctx(5, 5)), branch.mask(ctx(1, 7))
    assert full.shape == (1, 1, 5, 5) and step.shape == (1, 1, 1, 7)
    assert full.untyped_storage().data_ptr() == step.untyped_storage().data_ptr()
    assert full[0, 0].tolist() == branch.materialize(5).tolist()
    assert step[0, 0].tolist() == branch.materialize(1, 7).tolist()
    assert causal_mask(2, 4, "cpu").untyped_storage().data_ptr() == causal_mask(3, 9, "cpu").untyped_storage().data_ptr()


def test_index_distances_equal_real_distances_on_real_tokens():
    """Masks from index distances agree with masks from real positions on every real
    query row of a left- or right-padded batch (distance_table's docstring)."""
    for left in (True, False):
        kpm = torch.zeros(2, 7, dtype=torch.bool)
        if left:
            kpm[1, :3] = True
        else:
            kpm[1, 4:] = True
        k_pos = real_positions(kpm, 7, "cpu")
        real_distance = (k_pos.unsqueeze(1) - k_pos.unsqueeze(2)).unsqueeze(1)  # B x 1 x Tq x Tk
        for branch in (local_branch(1), forward_branch(), backward_branch(), WindowBranch(2, 0, "c")):
            index_mask = branch.materialize(7)[None, None].expand(2, 1, 7, 7)
            real_mask = branch.blocked_by_distance(real_distance)
            rows = ~kpm[:, None, :, None] & ~kpm[:, None, None, :]  # real query, real key
            assert torch.equal(index_mask[rows], real_mask[rows])


def test_real_positions_and_causal_mask_by_hand():
    kpm = torch.tensor([[True, True, False, False, False], [False] * 5])
    assert real_positions(kpm, 5, "cpu").tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert causal_mask(2, 4, "cpu").int().tolist() == [[0, 0, 0, 1], [0, 0, 0, 0]]
    assert causal_mask(3, 3, "cpu").int().tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]


def test_window_masks_by_hand():
    assert local_branch(1).materialize(4).int().tolist() == [
        [0, 0, 1, 1],
        [0, 0, 0, 1],
        [1, 0, 0, 0],
        [1, 1, 0, 0],
    ]
    assert forward_branch().materialize(3).int().tolist() == [[0, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert backward_branch().materialize(3).int().tolist() == [[0, 0, 0], [1, 0, 0], [1, 1, 0]]
    # a decoder step: one query at the end of four keys
    assert local_branch(1).materialize(1, 4).int().tolist() == [[1, 1, 0, 0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_left_empty_by_masks_give_zeros_not_nan(dtype):
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, branches=[forward_branch()]).to(dtype)
    core.attention_impl = "eager"
    x = torch.randn(T, B, C, dtype=dtype, requires_grad=True)
    # every key of sentence 2 is padding: every row of it is empty
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[2] = True
    out, w = core(x, x, x, key_padding_mask=kpm, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert (w[2] == 0).all()
    out.float().sum().backward()
    assert torch.isfinite(x.grad.float()).all()
    assert all(torch.isfinite(p.grad.float()).all() for p in core.parameters() if p.grad is not None)


@pytest.mark.parametrize("tlen", [5, 12], ids=["keys_at_most_Dh", "keys_above_Dh"])
def test_eager_rows_without_keys_equal_a_masked_softmax_with_those_rows_zero(tlen):
    """The eager path zeroes the rows without keys in the smaller of the distribution
    (Tk wide) and the output (Dh wide): either way the output, the weights and the
    gradients equal a plain masked softmax whose empty rows are zero (float64; left
    padding empties the first rows of one sentence and every row of another)."""
    from fairseq_localness.modules.fusion import merge_heads, split_heads

    torch.manual_seed(0)
    dim, heads = 16, 2  # Dh = 8
    core = AttentionCore(dim, heads, self_attention=True, branches=[forward_branch()]).double()
    core.attention_impl = "eager"
    kpm = torch.zeros(3, tlen, dtype=torch.bool)
    kpm[1, :2] = True  # sentence 1's first two rows see padding only
    kpm[2] = True  # sentence 2 is all padding
    x = torch.randn(tlen, 3, dim, dtype=torch.float64, requires_grad=True)

    def reference(x):
        q, k, v = (split_heads(proj(x), heads) for proj in (core.q_proj, core.k_proj, core.v_proj))
        blocked = forward_branch().materialize(tlen)[None, None] | kpm[:, None, None, :]
        empty = blocked.all(-1, keepdim=True)
        scores = (q * core.scaling) @ k.transpose(-1, -2)
        probs = torch.softmax(scores.masked_fill(blocked & ~empty, float("-inf")), -1).masked_fill(empty, 0.0)
        return core.out_proj(merge_heads(probs @ v)), probs.mean(1)

    out, weights = core(x, x, x, key_padding_mask=kpm, need_weights=True)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, [x, *core.parameters()], grad)
    ref_out, ref_weights = reference(x)
    want = torch.autograd.grad(ref_out, [x, *core.parameters()], grad)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(weights, ref_weights)
    assert (weights[2] == 0).all() and (weights[1, :2] == 0).all()
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("tlen", [5, 12], ids=["keys_at_most_Dh", "keys_above_Dh"])
def test_eager_rows_without_keys_give_nothing_with_shaws_values_and_dropout(tlen):
    """Trained with dropout and Shaw et al.'s value term, on either side of the rule
    (Tk <= Dh: the distribution zeroed; above: the output): a row without keys
    outputs out_proj's bias alone, and a loss over the empty rows reaches no input and
    no parameter but that bias."""
    torch.manual_seed(0)
    dim, heads = 16, 2  # Dh = 8
    core = AttentionCore(dim, heads, self_attention=True, dropout=0.3, branches=[forward_branch()],
                         relative_positions=RelativePositions(dim // heads, 3)).double().train()
    core.attention_impl = "eager"
    kpm = torch.zeros(3, tlen, dtype=torch.bool)
    kpm[1, :2] = True
    kpm[2] = True
    empty = torch.zeros(tlen, 3, dtype=torch.bool)
    empty[:2, 1] = True
    empty[:, 2] = True
    x = torch.randn(tlen, 3, dim, dtype=torch.float64, requires_grad=True)
    out, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[empty], core.out_proj.bias.detach().expand(int(empty.sum()), dim))
    # the others attend (dropout may leave a row of one key without it)
    assert (out[~empty] != core.out_proj.bias.detach()).any(-1).sum() >= (~empty).sum() // 2
    out[empty].sum().backward()
    assert (x.grad == 0).all()
    for name, p in core.named_parameters():
        if name != "out_proj.bias":
            assert p.grad is None or (p.grad == 0).all(), name


def test_sdpa_rows_left_empty_give_zeros_not_nan():
    core = AttentionCore(C, H, self_attention=True).eval()
    x = torch.randn(T, B, C)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1] = True
    out, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    assert torch.isfinite(out).all()


def test_incremental_self_attention_equals_full_with_reordering():
    torch.manual_seed(0)
    core = AttentionCore(
        C, H, self_attention=True, causal=True, branches=[local_branch(2)], relative_positions=RelativePositions(C // H, 3)
    ).eval()
    x = torch.randn(T, B, C)
    full, _ = core(x, x, x, need_weights=False)
    state = {}
    steps = []
    for t in range(T):
        step, _ = core(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)
        steps.append(step)
        if t == 2:  # beam search reorders the batch: cache must follow
            order = torch.tensor([2, 0, 1])
            core.reorder_incremental_state(state, order)
            x = x[:, order]
            full = full[:, order]
            steps = [s[:, order] for s in steps]
    torch.testing.assert_close(torch.cat(steps, 0), full, atol=1e-5, rtol=1e-4)


# decoder self-attention cores of every kind a beam search steps through
STEP_KINDS = {
    "global": lambda: dict(),
    "shaw_local": lambda: dict(branches=[local_branch(2)], relative_positions=RelativePositions(C // H, 3)),
    "hysan_decoder": lambda: dict(
        branches=[make_branch(n, "decoder") for n in ("forward", "local2")],
        fusion=GatedSumFusion(C, ["forward", "local2"], reduction=4)),
    "hybrid_gate": lambda: dict(branches=[global_branch(), local_branch(1, "local")], fusion=GateFusion(C, H)),
}


def _steps(core, x, state) -> list:
    """``x`` (``T x B x C``) fed to a self-attention ``core`` one step at a time, with
    the search's ``state``; the steps' outputs."""
    return [core(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)[0]
            for t in range(x.size(0))]


def _reorder_core(core, state, order):
    for module in core.modules():
        if hasattr(module, "reorder_incremental_state"):
            module.reorder_incremental_state(state, order)


@pytest.mark.parametrize("kind,dtype", [(kind, torch.float32) for kind in STEP_KINDS]
                         + [("global", torch.bfloat16), ("shaw_local", torch.float16)])
@pytest.mark.parametrize("start", ["step", "chunk"])
def test_beam_search_steps_and_the_other_path_take_over_each_others_steps(kind, dtype, start, step_route,
                                                                           monkeypatch):
    """Beam-search steps (no gradients: the keys and values in the step store, by either
    route of ``step_route``), chunks of several steps and a step with gradients (the other
    path's cache), in any order, with reorders (one dropping a finished sentence, one
    while the store is past its first room), a beam-search step straight after a step
    of the other path (no reorder between: the store is there, but stale), and padding
    given to some passes (a uint8 one too), give the full pass, and what the same
    passes give without the step store."""
    from fairseq_localness.modules.incremental import MIN_STEPS

    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True, **STEP_KINDS[kind]()).eval().to(dtype)
    steps = MIN_STEPS + 3
    plan = [(t, t + 1, False) for t in range(steps)]
    plan[3:6] = [(3, 5, False), (5, 6, True)]  # a chunk and a step with gradients
    if start == "chunk":
        plan[:2] = [(0, 2, False)]
    reorders = {2: torch.tensor([3, 0, 1, 2]), 7: torch.tensor([1, 1, 2, 0]), 8: torch.tensor([0, 2, 1]),
                MIN_STEPS + 1: torch.tensor([2, 0, 1])}  # at 8 a sentence finishes: 3 rows go on
    x0 = torch.randn(steps, 4, C).to(dtype)
    pad0 = torch.zeros(4, steps, dtype=torch.bool)
    pad0[1, 1] = pad0[1, 3] = pad0[2, 7] = True  # keys that no later step may see

    def decode():
        x, pad, state, outs = x0, pad0, {}, []
        for i, (first, end, grad) in enumerate(plan):
            mask = pad[:, first:end]
            mask = mask.to(torch.uint8) if i == 0 else mask
            with torch.set_grad_enabled(grad):
                out, _ = core(x[first:end], x[first:end], x[first:end], key_padding_mask=mask,
                              incremental_state=state, need_weights=False)
            outs.append(out.detach())
            if end in reorders:
                order = reorders[end]
                _reorder_core(core, state, order)
                x, pad, outs = x[:, order], pad[order], [o[:, order] for o in outs]
        return torch.cat(outs), x, pad

    out, x, pad = decode()
    with torch.no_grad():
        full, _ = core(x, x, x, key_padding_mask=pad, need_weights=False)
    tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}[dtype]
    torch.testing.assert_close(out, full, atol=tol, rtol=tol)
    monkeypatch.setattr(AttentionCore, "_beam_step_applies", lambda self, *args: False)
    without, _, _ = decode()
    torch.testing.assert_close(out, without, atol=tol / 10, rtol=tol / 10)


@pytest.fixture(params=["into_store", "stacked"])
def step_route(request, monkeypatch):
    """A beam-search step's two routes (``STACKED_STEP_DEVICES``): the CPU's, where the
    keys' and values' products write into the step store, and CUDA's, one product with
    the weights stacked per search, taken here on the CPU."""
    import fairseq_localness.modules.attention as attention

    if request.param == "stacked":
        monkeypatch.setattr(attention, "STACKED_STEP_DEVICES", ("cuda", "cpu"))
    return request.param


def test_a_model_moved_to_another_dtype_during_a_search_steps_on(step_route):
    """The step follows the parameters' dtype: a search whose model goes to bfloat16
    between two steps restacks the weights (stacked route) and its cache is taken over."""
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    x, state = torch.randn(4, 2, C), {}
    with torch.no_grad():
        _steps(core, x[:2], state)
        core.to(torch.bfloat16)
        xb = x.to(torch.bfloat16)
        out = _steps(core, xb[2:], state)
        full, _ = core(xb, xb, xb, need_weights=False)
    torch.testing.assert_close(torch.cat(out), full[2:], atol=3e-2, rtol=3e-2)


def test_a_hooked_or_replaced_projection_is_called_in_a_beam_search_step(step_route):
    """A forward hook on a projection, or a projection replaced by another module, is
    called as itself: the step takes the other path (the stacked product would skip it)."""
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    calls = []
    core.k_proj.register_forward_hook(lambda module, args, out: calls.append(1))
    with torch.no_grad():
        _steps(core, torch.randn(3, 2, C), {})
    assert len(calls) == 3


def test_a_beam_search_step_projects_once_and_writes_its_keys_and_values_once(step_route):
    """One self-attention step without gradients writes its keys and values into the
    store once (fairseq's MultiheadAttention: three products and two concatenations):
    on the CPU their products write there themselves (four products with q's and the
    output's, no copy); on CUDA's route q, k and v are one product (the stacked weights
    built at the search's first step, not again) and the keys and values one copy. A
    reorder index-selects the store once."""
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    x, state = torch.randn(6, 5, C), {}
    with torch.no_grad():
        _steps(core, x[:5], state)
        with OperatorCalls() as step:
            _steps(core, x[5:], state)
        with OperatorCalls() as reorder:
            core.reorder_incremental_state(state, torch.tensor([4, 3, 2, 1, 0]))
    products, copies = (4, 0) if step_route == "into_store" else (2, 1)
    assert step.names.count("addmm") == products and step.names.count("copy_") == copies
    assert "cat" not in step.names
    assert reorder.names.count("index_select") == 1


def test_a_beam_search_step_under_autocast_takes_the_stacked_product():
    """Under autocast the step's products are cast (the products into the store, with
    ``out=``, would not be): bfloat16 steps on the CPU give what the path without the
    step store gives there."""
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    x = torch.randn(5, 3, C)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with OperatorCalls() as calls:
            out = torch.cat(_steps(core, x, {}))
        core._beam_step_applies = lambda *args: False
        without = torch.cat(_steps(core, x, {}))
    assert out.dtype == without.dtype == torch.bfloat16
    assert calls.names.count("copy_") >= 5  # the keys and values copied into the store, one copy a step
    torch.testing.assert_close(out, without, atol=2e-2, rtol=2e-2)


def test_a_beam_search_step_on_a_device_without_autocast():
    """A device type that autocast does not know (``meta``: shapes only) takes the
    step's products into the store, as the CPU does, without asking autocast."""
    core = AttentionCore(C, H, self_attention=True, causal=True).eval().to("meta")
    x = torch.randn(3, 2, C, device="meta")
    with torch.no_grad():
        out = _steps(core, x, {})
    assert [o.shape for o in out] == [(1, 2, C)] * 3


def test_each_search_steps_with_the_parameters_it_starts_with(step_route):
    """The stacked weights live in the search's incremental state: a new search uses
    the parameters as they are then, however they were changed (in place, through
    ``.data``, or replaced)."""
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    x = torch.randn(4, 2, C)

    def check():
        with torch.no_grad():
            out = torch.cat(_steps(core, x, {}))
            full, _ = core(x, x, x, need_weights=False)
        torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-4)
        return out

    first = check()
    with torch.no_grad():
        core.k_proj.weight.mul_(2.0)
    core.q_proj.bias.data.add_(1.0)
    core.v_proj.weight = torch.nn.Parameter(torch.randn_like(core.v_proj.weight))
    assert not torch.allclose(check(), first)


def test_several_steps_at_once_stay_causal():
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True).eval()
    x = torch.randn(T, B, C)
    full, _ = core(x, x, x, need_weights=False)
    state = {}
    first, _ = core(x[:2], x[:2], x[:2], incremental_state=state, need_weights=False)
    rest, _ = core(x[2:], x[2:], x[2:], incremental_state=state, need_weights=False)
    torch.testing.assert_close(torch.cat([first, rest], 0), full, atol=1e-5, rtol=1e-4)


def test_relative_positions_equal_naive_float64():
    """Shaw et al. (2018) eq. 2-4 rebuilt with an explicit Tq x Tk x Dh tensor."""
    torch.manual_seed(0)
    k_clip = 2
    core = AttentionCore(C, H, self_attention=True, relative_positions=RelativePositions(C // H, k_clip)).double().eval()
    x = torch.randn(T, 1, C, dtype=torch.float64)
    out, _ = core(x, x, x, need_weights=False)

    dh = C // H
    q = core.q_proj(x[:, 0]).view(T, H, dh).transpose(0, 1)  # H x T x Dh
    k = core.k_proj(x[:, 0]).view(T, H, dh).transpose(0, 1)
    v = core.v_proj(x[:, 0]).view(T, H, dh).transpose(0, 1)
    rel = torch.arange(T)[None, :] - torch.arange(T)[:, None]  # j - i
    idx = rel.clamp(-k_clip, k_clip) + k_clip
    a_k = core.relative_positions.key_embeddings[idx]  # T x T x Dh
    a_v = core.relative_positions.value_embeddings[idx]
    e = (torch.einsum("hid,hjd->hij", q, k) + torch.einsum("hid,ijd->hij", q, a_k)) / math.sqrt(dh)
    alpha = torch.softmax(e, -1)
    z = torch.einsum("hij,hjd->hid", alpha, v) + torch.einsum("hij,ijd->hid", alpha, a_v)
    expected = core.out_proj(z.transpose(0, 1).reshape(T, C))
    torch.testing.assert_close(out[:, 0], expected, atol=1e-10, rtol=1e-8)


def test_relative_positions_see_real_positions_under_left_padding():
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, relative_positions=RelativePositions(C // H, 2)).eval()
    x = torch.randn(4, 1, C)
    alone, _ = core(x, x, x, need_weights=False)
    padded = torch.cat([torch.randn(2, 1, C), x], 0)
    kpm = torch.tensor([[True, True, False, False, False, False]])
    out, _ = core(padded, padded, padded, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(out[2:], alone, atol=1e-6, rtol=1e-5)


def test_invalid_construction_errors():
    with pytest.raises(ValueError, match="divisible"):
        AttentionCore(10, 3, self_attention=True)
    with pytest.raises(ValueError, match="self-attention only"):
        AttentionCore(C, H, encoder_decoder_attention=True, relative_positions=RelativePositions(C // H, 2))
    with pytest.raises(ValueError, match=">= 1"):
        RelativePositions(4, 0)
    with pytest.raises(ValueError, match=">= 0"):
        WindowBranch(-1, 0, "bad")


@pytest.mark.parametrize("keys", [1, 2, 7, 8, 9, 15, 16, 17, 33])
def test_softmax_last_equals_torchs_softmax(keys):
    """``context.softmax_last`` (four whole-tensor operations for rows shorter than one
    vector on a CPU without gradients) == ``torch.softmax`` over the last dimension, with
    blocked keys, a row of ``-inf`` alone (NaN both ways) and float64; with gradients it
    is torch's (its backward pass)."""
    from fairseq_localness.modules import context

    g = torch.Generator().manual_seed(keys)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, 4, 2, keys, generator=g).to(dtype)
        x[0, 0, 0, : keys // 2] = float("-inf")
        x[1, 2, 1] = float("-inf")
        got, want = context.softmax_last(x), torch.softmax(x, -1)
        torch.testing.assert_close(got, want, atol=1e-6 if dtype == torch.float32 else 1e-12, rtol=0,
                                   equal_nan=True)
        assert bool(got[1, 2, 1].isnan().all())
    leaf = torch.randn(2, keys, requires_grad=True)
    assert type(context.softmax_last(leaf).grad_fn).__name__ == "SoftmaxBackward0"
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        context.softmax_last(torch.randn(2, keys))
    four = 1 < keys < context._CPU_SOFTMAX_VECTOR
    assert ("exp_.default" in ops.names) == four and ("_softmax.default" in ops.names) != four
