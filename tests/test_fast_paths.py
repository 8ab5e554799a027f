"""The fast attention paths at lengths above 256 (tiny width and heads), each against
the eager reference: outputs and gradients, incremental decoding == the full pass,
batch and padding invariance, no NaN in rows without keys. The paths: the band
(:mod:`fairseq_localness.modules.kernels.banded`, ``O(T x W)``) for local branches,
the CPU flash kernel with ``is_causal`` for forward and (reversed) backward branches,
and the per-block recomputation of learned biases
(:mod:`fairseq_localness.modules.kernels.recompute`: Yang et al.'s Gaussian and
Shaw et al.'s relative positions, alone and together), and the one-row step of Shaw et
al.'s terms in incremental decoding."""
import itertools

import pytest
import torch

from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.hysan import build_fusion, make_branch
from fairseq_localness.modules.kernels import choice, sdpa
from fairseq_localness.modules.kernels.banded import band_slots_blocked, banded_attention

T = 300  # above 256, as the speed work targets
C, H = 8, 2


def _dense_reference(q, k, v, scale, left, right, key_padding_mask):
    """Masked softmax over all keys (the eager path's arithmetic), empty rows zero."""
    tq, tk = q.size(2), k.size(2)
    dist = torch.arange(tk)[None, :] - torch.arange(tk - tq, tk)[:, None]
    blocked = ((dist < -left) | (dist > right))[None, None]
    if key_padding_mask is not None:
        blocked = blocked | key_padding_mask[:, None, None, :]
    empty = blocked.all(-1, keepdim=True)
    scores = (q * scale) @ k.transpose(-1, -2)
    probs = torch.softmax(scores.masked_fill(blocked & ~empty, float("-inf")), -1)
    return (probs @ v).masked_fill(empty, 0.0)


def _qkv(bsz, tq, tk, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(bsz, H, n, 4, generator=g).requires_grad_(True) for n in (tq, tk, tk)]


def _left_padding(bsz, tk, pads):
    mask = torch.zeros(bsz, tk, dtype=torch.bool)
    for b, n in enumerate(pads):
        mask[b, :n] = True
    return mask


@pytest.mark.parametrize("left,right", [(1, 1), (3, 0), (0, 2), (5, 5)])
@pytest.mark.parametrize("tq", [T, 1, 37])
def test_band_equals_masked_dense_attention(left, right, tq):
    """Values and gradients of the band == a full masked softmax, with left padding
    (a sentence of one token, and one whose band around some queries is all padding),
    for full passes and bottom-right aligned queries (incremental steps)."""
    q, k, v = _qkv(3, tq, T)
    kpm = _left_padding(3, T, [0, 40, T - 1])
    out = banded_attention(q, k, v, 0.5, left, right, kpm)
    ref = _dense_reference(q, k, v, 0.5, left, right, kpm)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-4)
    grad = torch.randn_like(out)
    fast = torch.autograd.grad(out, (q, k, v), grad)
    slow = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(fast, slow):
        assert bool(torch.isfinite(a).all())
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_band_slots_outside_the_keys_and_at_padding_are_blocked():
    kpm = torch.tensor([[True, False, False, False]])
    blocked = band_slots_blocked(kpm, 4, 4, 1, 1, "cpu")[0, 0]
    # slot o of query i is key i - 1 + o
    expected = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [0, 0, 1]], dtype=torch.bool)
    assert torch.equal(blocked, expected)
    # a query of 1 at the end (incremental step) with a window (2, 0): keys 1, 2, 3
    assert torch.equal(band_slots_blocked(kpm, 1, 4, 2, 0, "cpu")[0, 0], torch.tensor([[False, False, False]]))


def _core(side, names, causal, seed=0):
    torch.manual_seed(seed)
    branches = [make_branch(n, side) for n in names]
    return AttentionCore(C, H, self_attention=True, causal=causal, branches=branches,
                         fusion=build_fusion("sum", C, names))


ENCODER = ("encoder", ["global", "forward", "backward", "local1", "local3"], False)
DECODER = ("decoder", ["forward", "local1", "local2"], True)


class _Spy:
    """Counts the band and causal-kernel calls of the core's fast path."""

    def __init__(self, monkeypatch):
        self.band = self.flash = 0
        band, flash = choice.banded_attention, sdpa.CPU_FLASH

        def spy_band(*a, **kw):
            self.band += 1
            return band(*a, **kw)

        def spy_flash(*a, **kw):
            self.flash += 1
            return flash(*a, **kw)

        monkeypatch.setattr(choice, "banded_attention", spy_band)
        if flash is not None:
            monkeypatch.setattr(sdpa, "CPU_FLASH", spy_flash)


@pytest.mark.parametrize("side,names,causal", [ENCODER, DECODER], ids=["encoder", "decoder"])
def test_fast_path_equals_eager_at_300(side, names, causal, monkeypatch):
    """Several hard-window branches (global, forward, backward, local k) on the fast
    path == the eager reference, outputs and gradients, with left padding (a
    sentence of one real token included), and the band and the causal kernel are the
    paths taken."""
    core = _core(side, names, causal)
    x = torch.randn(T, 3, C, requires_grad=True)
    kpm = _left_padding(3, T, [0, 57, T - 1]) if side == "encoder" else None
    keep = torch.ones(T, 3, 1) if kpm is None else (~kpm).t().unsqueeze(-1).float()
    results = {}
    spy = _Spy(monkeypatch)
    for impl in ("eager", "sdpa"):
        core.attention_impl = impl
        core.zero_grad()
        x.grad = None
        y, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
        (y * keep).pow(2).sum().backward()
        assert bool(torch.isfinite(y).all()) and bool(torch.isfinite(x.grad).all())
        results[impl] = [y * keep, x.grad.clone()] + [p.grad.clone() for p in core.parameters()]
    locals_ = sum(1 for n in names if n.startswith("local"))
    assert spy.band == locals_
    directions = sum(1 for n in names if n in ("forward", "backward"))
    assert spy.flash == (directions if sdpa.CPU_FLASH is not None else 0)
    # gradients are sums over T x B tokens: compared relative to the largest one (the
    # key bias's gradient is zero up to rounding, softmax being shift invariant)
    scale = max(1.0, max(b.abs().max().item() for b in results["eager"]))
    for a, b in zip(results["sdpa"], results["eager"]):
        torch.testing.assert_close(a / scale, b / scale, atol=1e-5, rtol=1e-4)



def _check_steps_equal_full(core, length=T):
    """``length`` self-attention steps through the cache == one pass over the tokens."""
    x = torch.randn(length, 2, C)
    with torch.no_grad():
        full, _ = core(x, x, x, need_weights=False)
        state, steps = {}, []
        for t in range(length):
            step, _ = core(x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=state, need_weights=False)
            steps.append(step)
    torch.testing.assert_close(torch.cat(steps, 0), full, atol=1e-5, rtol=1e-4)

def test_incremental_decoding_equals_the_full_pass_at_300():
    """A causal core with band branches, step by step (each step's band reads the
    cache) == one teacher-forced pass on the fast path."""
    core = _core(*DECODER).eval()
    _check_steps_equal_full(core)


def test_a_sentence_alone_equals_it_inside_a_padded_batch_at_300():
    """Left padding does not move what the band, forward and backward branches see."""
    core = _core(*ENCODER).eval()
    lengths = [T, 180, 7]
    x = torch.randn(T, 3, C)
    kpm = _left_padding(3, T, [T - n for n in lengths])
    with torch.no_grad():
        batch, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
        for b, n in enumerate(lengths):
            alone_x = x[T - n :, b : b + 1]
            alone, _ = core(alone_x, alone_x, alone_x, need_weights=False)
            torch.testing.assert_close(batch[T - n :, b : b + 1], alone, atol=1e-5, rtol=1e-4)


# --------------------------------------------------------------------------- learned biases
def _biased_core(kind, causal=False, seed=0):
    from fairseq_localness.modules.gaussian import GaussianLocalness
    from fairseq_localness.modules.relative_position import RelativePositions

    torch.manual_seed(seed)
    branches = [GaussianLocalness(C, H)] if "gaussian" in kind else None
    rel = RelativePositions(C // H, 3) if "rel_pos" in kind else None
    return AttentionCore(C, H, self_attention=True, causal=causal, branches=branches, relative_positions=rel)


KINDS = ["gaussian", "rel_pos", "gaussian+rel_pos"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_recomputed_bias_equals_eager_at_300(kind, causal, monkeypatch):
    """Yang et al.'s Gaussian bias and Shaw et al.'s key and value terms on the fast
    path (recomputed per block of queries, several blocks here) == the eager
    reference, outputs and every gradient, with left padding and a row of one real
    key; nothing of size Tq x Tk is kept for the backward pass."""
    from fairseq_localness.modules.kernels import recompute

    monkeypatch.setattr(recompute, "BLOCK_ELEMENTS", 3 * H * T * 64)  # blocks of 64 query rows
    core = _biased_core(kind, causal)
    x = torch.randn(T, 3, C, requires_grad=True)
    kpm = None if causal else _left_padding(3, T, [0, 57, T - 1])
    keep = torch.ones(T, 3, 1) if kpm is None else (~kpm).t().unsqueeze(-1).float()
    results = {}
    for impl in ("eager", "sdpa"):
        core.attention_impl = impl
        core.zero_grad()
        x.grad = None
        saved = []
        # float tensors (the causal mask and Shaw et al.'s buckets are views of tables
        # cached once per device, see distance_table)
        pack = lambda t: saved.append(t.numel() if t.is_floating_point() else 0) or t  # noqa: E731
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
        (y * keep).pow(2).sum().backward()
        results[impl] = [y * keep, x.grad.clone()] + [p.grad.clone() for p in core.parameters()]
        if impl == "sdpa":
            assert max(saved) < T * T, "a Tq x Tk float tensor was kept for the backward pass"
    scale = max(1.0, max(b.abs().max().item() for b in results["eager"]))
    for a, b in zip(results["sdpa"], results["eager"]):
        assert bool(torch.isfinite(a).all())
        torch.testing.assert_close(a / scale, b / scale, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_recomputed_bias_incremental_equals_full_at_300(kind):
    core = _biased_core(kind, causal=True).eval()
    core.attention_impl = "sdpa"
    _check_steps_equal_full(core)


@pytest.mark.parametrize("kind", KINDS)
def test_recomputed_bias_batch_invariance_at_300(kind):
    core = _biased_core(kind).train()  # training mode: the recomputed path (no dropout)
    core.attention_impl = "sdpa"
    lengths = [T, 180, 7]
    x = torch.randn(T, 3, C)
    kpm = _left_padding(3, T, [T - n for n in lengths])
    batch, _ = core(x, x, x, key_padding_mask=kpm, need_weights=False)
    for b, n in enumerate(lengths):
        alone_x = x[T - n :, b : b + 1]
        alone, _ = core(alone_x, alone_x, alone_x, need_weights=False)
        torch.testing.assert_close(batch[T - n :, b : b + 1], alone, atol=1e-5, rtol=1e-4)


def _shaw_reference(q, k, v, scale, key_emb, value_emb, causal, kpm):
    """Shaw et al. (2018), eq. 3-4, over all T x T pairs: gathered key terms,
    scattered value terms, a masked softmax (rows without keys: 0)."""
    bsz, heads, t, _ = q.shape
    k_clip = (key_emb.size(0) - 1) // 2
    dist = torch.arange(t)[None, :] - torch.arange(t)[:, None]
    bucket = (dist.clamp(-k_clip, k_clip) + k_clip).expand(bsz, heads, t, t)
    energies = (q @ k.transpose(-1, -2)) * scale + ((q @ key_emb.t()) * scale).gather(-1, bucket)
    blocked = torch.zeros(bsz, 1, t, t, dtype=torch.bool)
    if kpm is not None:
        blocked = blocked | kpm[:, None, None, :]
    if causal:
        blocked = blocked | (dist > 0)
    probs = torch.softmax(energies.masked_fill(blocked, float("-inf")), -1).nan_to_num(0.0)
    per_bucket = torch.zeros(bsz, heads, t, key_emb.size(0), dtype=probs.dtype).scatter_add_(-1, bucket, probs)
    return probs @ v + per_bucket @ value_emb


def test_shaw_step_equals_the_last_row_of_the_dense_equation():
    """An incremental step (the query at the last position) == the last row of Shaw et
    al.'s equations over all pairs, with padding and prefixes shorter and longer than
    the clipping distance."""
    from fairseq_localness.modules.relative_position import RelativePositions

    g = torch.Generator().manual_seed(1)
    for t, k_clip in itertools.product([1, 2, 4, 9], [1, 3]):
        q, k, v = (torch.randn(2, 2, t, 4, dtype=torch.float64, generator=g) for _ in range(3))
        key_emb, value_emb = (torch.randn(2 * k_clip + 1, 4, dtype=torch.float64, generator=g) for _ in range(2))
        kpm = torch.zeros(2, t, dtype=torch.bool)
        kpm[1, : t // 2] = True
        ref = _shaw_reference(q, k, v, 0.5, key_emb, value_emb, True, kpm)[:, :, -1:]
        for values in (True, False):
            rel = RelativePositions(4, k_clip, values=values).double()
            with torch.no_grad():
                rel.key_embeddings.copy_(key_emb)
                if values:
                    rel.value_embeddings.copy_(value_emb)
            out = rel.step_attention(q[:, :, -1:], k, v, 0.5, kpm)
            expected = ref if values else _shaw_reference(
                q, k, v, 0.5, key_emb, torch.zeros_like(value_emb), True, kpm)[:, :, -1:]
            torch.testing.assert_close(out, expected, atol=1e-10, rtol=1e-9)


def test_shaw_step_makes_the_same_calls_at_every_prefix_length():
    """A step's operator calls do not depend on where the prefix stands against the
    clipping distance K: the key term is picked per key from the row's R bucket terms
    and the value term sums the probabilities per bucket, for 2 keys (all within K =
    2) as for 3 and 6 (some in the clipped bucket), with padding or without. (Rows this
    short take the same softmax on every CPU: :func:`~.context.softmax_last`.)"""
    from model_utils import OperatorCalls

    from fairseq_localness.modules.relative_position import RelativePositions

    rel = RelativePositions(8, 2)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # the bucket table, built once (and cached) for 6 keys
        rel.step_attention(torch.randn(3, 2, 1, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8), 0.5)
    calls = {}
    for t, padded in itertools.product([2, 3, 6], [False, True]):
        q, k, v = torch.randn(3, 2, 1, 8, generator=g), torch.randn(3, 2, t, 8, generator=g), torch.randn(3, 2, t, 8)
        kpm = _left_padding(3, t, [0, 1, 0]) if padded else None
        with torch.no_grad(), OperatorCalls() as recorder:
            rel.step_attention(q, k, v, 0.5, kpm)
        calls[t, padded] = recorder.names
    for padded in (False, True):
        assert calls[2, padded] == calls[3, padded] == calls[6, padded]
    assert "cat" not in calls[6, True] and "index_add_" in calls[6, True]


def test_one_row_windows_equal_one_step_per_window():
    """Several windows of one query row in one product (:func:`~.windows.windows_attention`)
    == one :func:`~.step.last_keys_attention` per window, with padding (a window over
    padding alone gives 0) and windows wider than the keys."""
    from fairseq_localness.modules.kernels.step import last_keys_attention
    from fairseq_localness.modules.kernels.windows import windows_attention
    from fairseq_localness.modules.scores import Window

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, 2, n, 4, dtype=torch.float64, generator=g) for n in (1, 9, 9))
    kpm = _left_padding(3, 9, [0, 4, 8])
    kpm[2] = False
    kpm[2, 7:] = True  # the last two keys padding: the window of 1 and 2 keys sees none
    lefts = [None, 0, 1, 3, 20]
    out = windows_attention(q, k, v, 0.5, kpm, [Window(left, 0) for left in lefts])
    assert out.shape == (3, 2, len(lefts), 1, 4)
    for row, left in enumerate(lefts):
        torch.testing.assert_close(out[:, :, row], last_keys_attention(q, k, v, 0.5, kpm, left), atol=1e-12, rtol=0)
    assert bool((out[2, :, 1:3] == 0).all())


def test_one_row_windows_hold_as_the_cached_rows_grow():
    """The windows' rows of -inf come from a table cached per windows and device and
    grown by doubling: steps over 9, 150 (past the first table) and again 9 keys,
    with the same windows, each equal one step per window."""
    from fairseq_localness.modules.kernels.step import last_keys_attention
    from fairseq_localness.modules.kernels.windows import windows_attention
    from fairseq_localness.modules.scores import Window

    g = torch.Generator().manual_seed(4)
    lefts = [2, None, 0]
    for src_len in (9, 150, 9):
        q, k, v = (torch.randn(2, 2, n, 4, dtype=torch.float64, generator=g) for n in (1, src_len, src_len))
        out = windows_attention(q, k, v, 0.5, None, [Window(left, 0) for left in lefts])
        for row, left in enumerate(lefts):
            want = last_keys_attention(q, k, v, 0.5, None, left)
            torch.testing.assert_close(out[:, :, row], want, atol=1e-12, rtol=0)


def test_gated_decoder_steps_take_one_product_for_all_windows(monkeypatch):
    """A HySAN decoder core with the squeeze gate (Song et al. 2019, eq. 13-14) over
    forward, local1 and local2: every incremental step computes its three windows in one
    call of :func:`~.windows.windows_attention` (none per branch), and so does the full
    pass (no gradients, 20 keys on a CPU); the steps == the full pass."""
    names = ["forward", "local1", "local2"]
    torch.manual_seed(0)
    core = AttentionCore(C, H, self_attention=True, causal=True, branches=[make_branch(n, "decoder") for n in names],
                         fusion=build_fusion("gated", C, names, reduction=2)).eval()
    calls = {"windows": 0, "one": 0}
    windows, one = choice.windows_attention, choice.last_keys_attention

    def spy_windows(*a, **kw):
        calls["windows"] += 1
        return windows(*a, **kw)

    def spy_one(*a, **kw):
        calls["one"] += 1
        return one(*a, **kw)

    monkeypatch.setattr(choice, "windows_attention", spy_windows)
    monkeypatch.setattr(choice, "last_keys_attention", spy_one)
    _check_steps_equal_full(core, length=20)
    assert calls == {"windows": 20 + 1, "one": 0}
