"""The attention core: parity with fairseq's MultiheadAttention, fast path == eager
path, safe softmax on empty rows, caching and reordering, masks, relative positions."""
import math

import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_localness.modules.attention import (
    AttentionBranch,
    AttentionCore,
    causal_mask,
    real_positions,
)
from fairseq_localness.modules.branches import (
    WindowBranch,
    backward_branch,
    forward_branch,
    local_branch,
)
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


@pytest.mark.parametrize(
    "branch",
    [AttentionBranch(), local_branch(1), forward_branch(), backward_branch(), WindowBranch(2, 0, "causal_local2")],
    ids=lambda b: b.name,
)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_path_equals_eager_path(branch, causal):
    torch.manual_seed(1)
    core = AttentionCore(C, H, self_attention=True, causal=causal, branches=[branch]).eval()
    x = torch.randn(T, B, C)
    kpm = None if causal else _left_padding([6, 4, 2], T)
    core.attention_impl = "auto"
    fast, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    core.attention_impl = "eager"
    slow, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)


def test_sdpa_path_equals_eager_path_with_bias():
    class RandomBias(AttentionBranch):
        def bias(self, ctx):
            g = torch.Generator().manual_seed(3)
            return -torch.rand(ctx.bsz, ctx.num_heads, ctx.tgt_len, ctx.src_len, generator=g) * 5

    core = AttentionCore(C, H, self_attention=True, branches=[RandomBias()]).eval()
    x = torch.randn(T, B, C)
    kpm = _left_padding([6, 4, 2], T)
    core.attention_impl = "auto"
    fast, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    core.attention_impl = "eager"
    slow, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=1e-5)


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
