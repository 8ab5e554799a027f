"""One query row on CUDA's paths (modules/kernels/step.py, ``row_attention``): each
beam-search step's attention as one call of SDPA's fused kernel, its mask or bias
given as data (the last keys' padding, the windows' rows, Shaw et al.'s key term with
the value term added to the values), against the CPU's own step kernels.

CI has no GPU: the CPU takes CUDA's paths here
(:func:`~fairseq_localness.modules.kernels.emulation.cuda_paths_on_cpu`), the fused
call computed by the CPU's SDPA; the CUDA twin runs the same on a GPU."""
import contextlib

import pytest
import torch

from fairseq_localness.modules import relative_position
from fairseq_localness.modules.kernels import emulation, step, windows
from fairseq_localness.modules.kernels.step import row_attention
from fairseq_localness.modules.kernels.windows import windows_attention
from fairseq_localness.modules.scores import Window
from model_utils import OperatorCalls
from test_flex_path import B, C, CUDA_TOL, KINDS, _module, _relative, _reorder

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# the kinds whose decoder self-attention step is one fused call on CUDA; the Gaussian's
# steps take SDPA with its bias already, Shaw et al.'s with the Gaussian the recomputed
# kernel (both unchanged)
FUSED_KINDS = ("shaw-key-value", "shaw-key", "hysan", "hybrid-gate", "dual-context")
STEPS_TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def _decode(module, x, padding, order, reorder_at=4):
    """``x`` (``T x B x C``) one token at a time, the padding of each token's key
    (``B x T``, True at padding) or None, a beam reorder of every cache after step
    ``reorder_at``; the steps' outputs, ``T x B x C`` in the final order."""
    state, outs = {}, []
    with torch.no_grad():
        for t in range(x.size(0)):
            token = x[t : t + 1]
            out, _ = module(token, token, token, key_padding_mask=None if padding is None else padding[:, t : t + 1],
                            incremental_state=state, need_weights=False)
            outs.append(out)
            if t == reorder_at:
                _reorder(module, state, order)
                x, outs = x[:, order], [o[:, order] for o in outs]
                padding = None if padding is None else padding[order]
    return torch.cat(outs)


def _masks_in_the_querys_dtype(monkeypatch) -> list:
    """Wrap ``F.scaled_dot_product_attention`` so that each call checks its mask: None,
    or a float mask in the query's dtype (SDPA converts a boolean one for cuDNN's
    kernel with a finite minimum; some kernels take no other float dtype). Returns the
    list that each call appends to."""
    calls, original = [], torch.nn.functional.scaled_dot_product_attention

    def checked(q, k, v, attn_mask=None, *args, **kwargs):
        assert attn_mask is None or attn_mask.dtype == q.dtype, (attn_mask.dtype, q.dtype)
        calls.append(1)
        return original(q, k, v, attn_mask, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", checked)
    return calls


def _check_fused_steps(kind, dtype, padded, device, monkeypatch):
    module = _module(kind, True, dtype=dtype, device=device).eval()
    T = 9
    torch.manual_seed(2)
    x = torch.randn(T, B, C, device=device, dtype=dtype)
    # a left-padded target (the last sentence a single real token: its first rows
    # have no key at all)
    padding = (torch.arange(T, device=device) < torch.tensor([[0], [4], [T - 1]], device=device)) if padded else None
    order = torch.tensor([1, 2, 0], device=device)
    calls = []
    original = step.row_attention

    def spy(*args, **kwargs):
        calls.append(args[0].shape)
        return original(*args, **kwargs)

    for module_of in (step, windows, relative_position):  # (the last two import it by name)
        monkeypatch.setattr(module_of, "row_attention", spy)
    if device == "cpu":
        reference = _decode(module, x, padding, order)
        assert not calls  # the CPU's own step kernels
        sdpa_calls = _masks_in_the_querys_dtype(monkeypatch)
        with emulation.cuda_paths_on_cpu():
            fused = _decode(module, x, padding, order)
        assert len(sdpa_calls) >= len(calls)
    else:
        fused = _decode(module, x, padding, order)
        reference = _decode(module.cpu().float(), x.cpu().float(), None if padding is None else padding.cpu(),
                            order.cpu())
    if kind in FUSED_KINDS:
        assert len(calls) == T  # one fused call per step
    assert torch.isfinite(fused).all()
    tolerance = STEPS_TOL[dtype] if device == "cpu" else CUDA_TOL[dtype]
    assert _relative(fused.float().cpu(), reference.float()) < tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_steps_on_cudas_paths_equal_the_cpus_step_kernels(kind, padded, dtype, monkeypatch):
    """Incremental decoding with a beam reorder mid-way, every branch kind of the four
    models, with and without a left-padded target: the steps on CUDA's paths (one
    fused call per step where the kind's step has its own kernels on the CPU) give the
    CPU's steps' outputs, rows without any key included (0, not NaN)."""
    _check_fused_steps(kind, dtype, padded, "cpu", monkeypatch)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_cuda_steps_equal_the_cpus_step_kernels(kind, padded, dtype, monkeypatch):
    """The test above on a GPU: CUDA's fused steps in each dtype against the CPU's
    steps in float32."""
    _check_fused_steps(kind, dtype, padded, "cuda", monkeypatch)


@pytest.mark.parametrize("kind", ["shaw-key-value", "hysan", "dual-context"])
def test_a_step_of_the_self_attention_is_one_fused_call_and_no_softmax(kind):
    """On CUDA's paths a beam-search step's attention makes one SDPA call and no
    product, softmax or cast of its own: the operators left are the projections, the
    caches' writes, and the terms that are data (Shaw et al.'s key term and values,
    the Local Context Unit)."""
    module = _module(kind, True, dtype=torch.bfloat16).eval()
    x = torch.randn(6, B, C, dtype=torch.bfloat16)
    state = {}
    with torch.no_grad(), emulation.cuda_paths_on_cpu():
        for t in range(6):
            token = x[t : t + 1]
            ops = OperatorCalls()
            with ops:  # (the last step's)
                module(token, token, token, incremental_state=state, need_weights=False)
    names = ops.names
    assert sum("scaled_dot_product" in n for n in names) == 1, names
    assert not {"_softmax", "softmax", "bmm", "baddbmm", "_to_copy", "index_add_"} & set(names), names


def _math_attention(q, k, v, attn_mask=None, scale=None):
    """SDPA as a GPU's kernels may compute it: NaN in a row whose float mask is all
    ``-inf``, and a boolean mask converted with the dtype's lowest finite value, as
    SDPA converts one for cuDNN's kernel (a row of padding alone then gets a
    distribution over its padding). The CPU's fused kernel gives 0 for both."""
    scores = q @ k.transpose(-1, -2) * scale
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, torch.finfo(scores.dtype).min)
    elif attn_mask is not None:
        scores = scores + attn_mask
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("kernel", ["sdpa", "math"])
def test_a_row_without_keys_gives_zeros(kernel, monkeypatch):
    """``row_attention``: a row whose keys are all padding, or that its window leaves
    without keys, gives 0, also where the fused kernel gives NaN or would convert a
    boolean mask with a finite minimum."""
    if kernel == "math":
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", _math_attention)
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 1, 8), torch.randn(2, 3, 5, 8), torch.randn(2, 3, 5, 8)
    padding = torch.tensor([[True] * 5, [False, False, True, False, False]])
    out = row_attention(q, k, v, 0.3, padding)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    keep = ~padding[1]
    probs = torch.softmax(q[1] @ k[1, :, keep].transpose(-1, -2) * 0.3, -1)
    torch.testing.assert_close(out[1], probs @ v[1, :, keep])
    bounds = [Window(None, 0), Window(None, -1)]  # the second keeps no key at distance 0
    with emulation.cuda_paths_on_cpu():
        fused = windows_attention(q, k[:, :, :1], v[:, :, :1], 0.3, None, bounds)  # one key: the row's own
    reference = windows_attention(q, k[:, :, :1], v[:, :, :1], 0.3, None, bounds)
    assert torch.equal(fused[:, :, 1], torch.zeros_like(fused[:, :, 1]))
    torch.testing.assert_close(fused, reference)


def _aligned(t: torch.Tensor, bias: bool) -> bool:
    """What SDPA on CUDA checks of its inputs and bias: the first element at a multiple
    of 16 bytes (the memory-efficient kernel refuses another) and the last stride 1;
    of the queries, keys and values every stride but the last (of a dimension longer
    than one) a multiple of 16 bytes and not 0 (a broadcast query row: not every
    kernel takes one), of a bias every stride but the last, size-1 dimensions
    included, a multiple of 8 elements (``preprocess_mask``'s ``aligned_tensor<8>``:
    SDPA copies a bias that is not)."""
    pairs = list(zip(t.stride()[:-1], t.shape[:-1]))
    strides_ok = (all(s % 8 == 0 for s, _ in pairs) if bias
                  else all(s != 0 and s * t.element_size() % 16 == 0 for s, n in pairs if n > 1))
    return t.data_ptr() % 16 == 0 and strides_ok and t.stride(-1) == 1


@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_the_fused_steps_inputs_and_bias_are_aligned_as_cudas_kernel_wants(kind, monkeypatch):
    """At every step length (1 to 11 keys: every remainder modulo 8) the queries, keys,
    values and bias that a step hands to the fused kernel start at multiples of 16
    bytes, their rows too (SDPA's memory-efficient kernel on CUDA refuses a bias that
    does not, with an error; a bias whose rows are not would be copied per call): the
    windows' rows come from the cached table's copy whose row starts aligned, Shaw et
    al.'s key terms from rows padded to a multiple of 8."""
    module = _module(kind, True, dtype=torch.bfloat16).eval()
    seen = []
    original = step.row_attention

    def spy(q, k, v, scale, key_padding_mask, bias=None, *rest):
        seen.append((q, k, v, bias))
        return original(q, k, v, scale, key_padding_mask, bias, *rest)

    for module_of in (step, windows, relative_position):
        monkeypatch.setattr(module_of, "row_attention", spy)
    x = torch.randn(11, B, C, dtype=torch.bfloat16)
    with emulation.cuda_paths_on_cpu():
        _decode(module, x, None, torch.tensor([1, 2, 0]))
    assert len(seen) == 11
    for q, k, v, bias in seen:
        for t in (q, k, v):
            assert _aligned(t, False), (kind, t.shape, t.stride(), t.data_ptr() % 16)
        assert bias is None or _aligned(bias, True), (kind, bias.shape, bias.stride(), bias.data_ptr() % 16)


def _check_encoder_decoder_steps(device, dtype, monkeypatch):
    from fairseq_localness.modules.attention import AttentionCore

    torch.manual_seed(4)
    core = AttentionCore(C, 4, encoder_decoder_attention=True).eval()
    source = torch.randn(7, B, C)
    padding = torch.arange(7) < torch.tensor([[0], [3], [6]])  # sentence lengths 7, 4 and 1
    x = torch.randn(5, B, C)
    masks = []
    original = step.padding_bias
    monkeypatch.setattr(step, "padding_bias", lambda *args: masks.append(original(*args)) or masks[-1])

    def decode(core, source, x, padding):
        state, outs = {}, []
        with torch.no_grad():
            for t in range(x.size(0)):
                out, _ = core(x[t : t + 1], source, source, key_padding_mask=padding, incremental_state=state,
                              static_kv=True, need_weights=False)
                outs.append(out)
        return torch.cat(outs)

    reference = decode(core, source, x, padding)
    assert not masks  # the CPU's own step kernels
    on = dict(device=device, dtype=dtype)
    with emulation.cuda_paths_on_cpu() if device == "cpu" else contextlib.nullcontext():
        fused = decode(core.to(**on), source.to(**on), x.to(**on), padding.to(device))
    assert len(masks) == x.size(0) and len({m.data_ptr() for m in masks}) == 1  # a fused call per step, one mask
    assert _relative(fused.float().cpu(), reference) < (STEPS_TOL[dtype] if device == "cpu" else CUDA_TOL[dtype])


def test_encoder_decoder_attention_steps_with_a_padded_source_equal_the_cpus(monkeypatch):
    """Encoder-decoder attention's steps (keys and values of the source, projected once
    and kept) over a left-padded source: one fused call per step on CUDA's paths, the
    source's padding one float mask made once for all steps (the mask is the same),
    the outputs the CPU step kernels' (float32)."""
    _check_encoder_decoder_steps("cpu", torch.float32, monkeypatch)


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_cuda_encoder_decoder_attention_steps_with_a_padded_source_equal_the_cpus(dtype, monkeypatch):
    """The test above on a GPU, in each dtype, against the CPU's steps in float32."""
    _check_encoder_decoder_steps("cuda", dtype, monkeypatch)


def test_a_padding_mask_gives_one_float_mask_per_dtype():
    """``sdpa.padding_bias``: one mask per padding mask and dtype, -inf at padding in
    that dtype, its rows a multiple of 8 elements apart; a new padding mask (a beam
    reorder makes one) gets its own."""
    from fairseq_localness.modules.kernels.sdpa import padding_bias

    padding = torch.arange(11) < torch.tensor([[0], [4]])
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        bias = padding_bias(padding, dtype)
        assert bias.dtype == dtype and bias.shape == (2, 1, 1, 11) and bias.stride()[:3] == (16, 16, 16)
        assert torch.equal(bias[:, 0, 0] == float("-inf"), padding)
        assert bias.data_ptr() == padding_bias(padding, dtype).data_ptr()  # made once
        assert torch.equal(padding_bias(padding, dtype, padded=True)[..., 11:], torch.zeros(2, 1, 1, 5, dtype=dtype))
    assert padding_bias(padding, torch.float32).data_ptr() != padding_bias(padding, torch.bfloat16).data_ptr()
    reordered = padding[[1, 0]]
    assert padding_bias(reordered, torch.float32).data_ptr() != padding_bias(padding, torch.float32).data_ptr()


@pytest.mark.parametrize("kind", ["shaw-key-value", "hysan", "dual-context"])
def test_a_step_that_sdpa_refuses_takes_the_step_kernels(kind, monkeypatch, caplog):
    """Where SDPA refuses a fused step (a kernel that does not take its inputs on some
    GPU or torch), the step is computed by the step kernels, with one warning, and the
    device's later steps take them without trying again; the beam search's outputs are
    the CPU kernels'. The GPU's memory running out is raised."""
    import logging

    module = _module(kind, True).eval()
    torch.manual_seed(5)
    x = torch.randn(6, B, C)
    order = torch.tensor([1, 2, 0])
    reference = _decode(module, x, None, order)
    tries = []

    def refusing(*args, **kwargs):
        tries.append(1)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(step, "_REFUSED", set())
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", refusing)
    with emulation.cuda_paths_on_cpu(), caplog.at_level(logging.WARNING, logger=step.__name__):
        got = _decode(module, x, None, order)
    assert len(tries) == 1 and step._REFUSED == {"cpu"}
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "one-row steps: scaled_dot_product_attention refused a step on cpu"]
    torch.testing.assert_close(got, reference)

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(step, "_REFUSED", set())
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", out_of_memory)
    with emulation.cuda_paths_on_cpu(), pytest.raises(torch.cuda.OutOfMemoryError):
        _decode(module, x, None, order)
