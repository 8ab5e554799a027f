"""The branch descriptions (modules/scores.py) and the fused FlexAttention path
(modules/kernels/flex.py) against the eager reference.

On a CPU, torch runs a flex call's forward pass only (no backward): the cores run it
with ``attention_impl="flex"`` without gradients, for every branch kind, in float32
and bfloat16. The CUDA tests (skipped without a GPU) run the fused path that
``"auto"`` takes there, outputs and gradients, in float32, float16 and bfloat16; their
twins here take CUDA's paths on the CPU (:mod:`~fairseq_localness.modules.kernels.
emulation`: torch's reference implementation of the fused calls, whose backward pass
the CPU then runs too), outputs and gradients in float32.
"""
import contextlib

import pytest
import torch

from fairseq_localness.modules.attention import AttentionCore, set_attention_impl
from fairseq_localness.modules.branches import WindowBranch
from fairseq_localness.modules.context import build_context
from fairseq_localness.modules.dual_context import DualContextModule
from fairseq_localness.modules.gaussian import GaussianLocalness
from fairseq_localness.modules.hybrid import hybrid_attention
from fairseq_localness.modules.hysan import build_fusion, make_branch
from fairseq_localness.modules.kernels import choice, emulation, flex
from fairseq_localness.modules.relative_position import RelativePositions
from fairseq_localness.modules.scores import gaussian_rows

pytestmark = [
    pytest.mark.skipif(not flex.available(), reason="this torch has no FlexAttention"),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # torch: flex_attention called without torch.compile
]

C, H, B = 64, 4, 3  # Dh = 16: the least head dimension the CUDA kernels take (flex.MIN_HEAD_DIM)


def _hysan(side):
    names = ("global", "forward", "backward", "local3") if side == "encoder" else ("forward", "local2")
    return [make_branch(n, side) for n in names], build_fusion("gated", C, names, reduction=4)


# kind -> (causal) -> the module; every branch kind of the four models
KINDS = {
    "gaussian-query": lambda c: AttentionCore(C, H, self_attention=True, causal=c, branches=[GaussianLocalness(C, H)]),
    "gaussian-layer": lambda c: AttentionCore(C, H, self_attention=True, causal=c,
                                              branches=[GaussianLocalness(C, H, window="layer")]),
    "gaussian-head": lambda c: AttentionCore(C, H, self_attention=True, causal=c,
                                             branches=[GaussianLocalness(C, H, window="head")]),
    "gaussian-fixed-self": lambda c: AttentionCore(C, H, self_attention=True, causal=c,
                                                   branches=[GaussianLocalness(C, H, window="fixed", centre="self")]),
    "shaw-key-value": lambda c: AttentionCore(C, H, self_attention=True, causal=c,
                                              relative_positions=RelativePositions(C // H, 3)),
    "shaw-key": lambda c: AttentionCore(C, H, self_attention=True, causal=c,
                                        relative_positions=RelativePositions(C // H, 3, values=False)),
    "gaussian+shaw": lambda c: AttentionCore(C, H, self_attention=True, causal=c, branches=[GaussianLocalness(C, H)],
                                             relative_positions=RelativePositions(C // H, 3)),
    "hysan": lambda c: AttentionCore(C, H, self_attention=True, causal=c,
                                     **dict(zip(("branches", "fusion"), _hysan("decoder" if c else "encoder")))),
    "hybrid-gate": lambda c: hybrid_attention("gate", C, H, self_attention=True, causal=c),
    "dual-context": lambda c: DualContextModule(C, H, kernel_size=3 if not c else 2, causal=c),
}


def _module(kind, causal, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    return KINDS[kind](causal).to(device=device, dtype=dtype)


def _padding(side, bsz, total, lengths, device="cpu"):
    """``B x T``, True at padding: on the left (fairseq's sources) or the right."""
    idx = torch.arange(total, device=device)
    rows = [idx < total - n if side == "left" else idx >= n for n in lengths]
    return torch.stack(rows)


class _FlexCalls:
    """Counts the calls of the fused kernel: one branch (``flex_branch``), or several
    windows at once (``flex_windows``, counted in ``windows``)."""

    def __init__(self, monkeypatch):
        self.count = self.windows = 0
        for name in ("flex_branch", "flex_windows"):
            monkeypatch.setattr(flex, name, self._spy(getattr(flex, name), name == "flex_windows"))

    def _spy(self, original, windows):
        def spy(*args, **kwargs):
            self.count += 1
            self.windows += windows
            return original(*args, **kwargs)

        return spy


def _reorder(module, state, order):
    """Beam search's reorder of every cache in ``module`` (the cores' keys and values,
    the Local Context Unit's window, the DC module's joint cache), as fairseq's
    decoder does it: every submodule with a ``reorder_incremental_state``."""
    for m in module.modules():
        if hasattr(m, "reorder_incremental_state"):
            m.reorder_incremental_state(state, order)


def _run(module, x, impl, padding):
    set_attention_impl(module, impl)
    out, _ = module(x, x, x, key_padding_mask=padding, need_weights=False)
    return out


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_flex_forward_on_a_cpu_equals_the_eager_reference(kind, causal, monkeypatch):
    """Every branch kind through the fused kernel's forward pass == the eager
    reference, with left padding (one sentence of a single real token) in the
    encoder; float32 tightly, bfloat16 within its rounding. HySAN's L branches and
    the hybrid's two are windows alone: one fused call computes them all (grouped
    query heads, a block mask per branch), not one call per branch."""
    module = _module(kind, causal).eval()
    T = 13
    x = torch.randn(T, B, C)
    padding = None if causal else _padding("left", B, T, [T, 7, 1])
    keep = torch.ones(T, B, 1) if padding is None else (~padding).t().unsqueeze(-1).float()
    calls = _FlexCalls(monkeypatch)
    with torch.no_grad():
        ref = _run(module, x, "eager", padding)
        out = _run(module, x, "flex", padding)
        assert calls.count >= 1
        if kind in ("hysan", "hybrid-gate"):
            assert (calls.count, calls.windows) == (1, 1)
        torch.testing.assert_close(out * keep, ref * keep, atol=2e-6, rtol=1e-5)
        half = _run(module.to(torch.bfloat16), x.bfloat16(), "flex", padding).float()
    assert (((half - ref) * keep).abs().max() / ref.abs().max()).item() < 0.03


@pytest.mark.parametrize("kind", ["gaussian-query", "hysan", "hybrid-gate", "shaw-key-value"])
def test_kernel_options_reach_every_kind_of_fused_call(kind, monkeypatch):
    """``flex.KERNEL_OPTIONS`` (the probe's ``blocks`` variant) is what every fused call
    without options of its own takes: a Gaussian branch, HySAN's and the hybrid's
    windows; Shaw et al.'s table keeps its own, on CUDA. The output does not change."""
    module = _module(kind, False).eval()
    x = torch.randn(9, B, C)
    seen = []
    original = flex._call_kind

    def spy(function, q, key_of, args_of, options):
        seen.append(options)
        return original(function, q, key_of, args_of, options)

    monkeypatch.setattr(flex, "_call_kind", spy)
    with torch.no_grad():
        ref = _run(module, x, "flex", None)
        assert seen and set(map(str, seen)) == {"None"}
        seen.clear()
        monkeypatch.setattr(flex, "KERNEL_OPTIONS", flex.SMALL_BLOCKS)
        out = _run(module, x, "flex", None)
    assert seen and all(options == flex.SMALL_BLOCKS for options in seen)
    torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("kind", ["gaussian-query", "shaw-key-value", "hysan", "dual-context"])
def test_flex_continues_a_prefix_in_incremental_decoding(kind):
    """Several target tokens fed at once after a cached prefix (``Tq < Tk``: the
    bottom-right alignment of the block mask, the bucket table and the value term's
    band) == the full pass, also after a beam reorder of the cache."""
    module = _module(kind, True).eval()
    set_attention_impl(module, "flex")
    T = 11
    x = torch.randn(T, B, C)
    order = torch.tensor([2, 0, 1])
    with torch.no_grad():
        full, _ = module(x, x, x, need_weights=False)
        state = {}
        prefix = x[:5]
        module(prefix, prefix, prefix, incremental_state=state, need_weights=False)
        _reorder(module, state, order)  # a beam reorder, then the permuted sentences go on
        rest = x[5:, order]
        step, _ = module(rest, rest, rest, incremental_state=state, need_weights=False)
    torch.testing.assert_close(step, full[5:, order], atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_one_squeeze_gate_over_stacked_branches_equals_the_gate_per_branch(dtype):
    """HySAN's gated sum (Song et al. 2019, eq. 13-14) over the stacked outputs of one
    fused call == the loop over branches: the output, the gradients of the outputs and
    of the gate's weights, and the gate values logged per branch."""
    from fairseq_localness.modules.fusion import BranchOutputs
    from fairseq_localness.modules.hysan import GatedSumFusion

    torch.manual_seed(0)
    names = ["global", "forward", "backward", "local2"]
    fusion = GatedSumFusion(C, names, reduction=4, bias=True).to(dtype)
    fusion.metric_prefix = "enc1"
    fusion.train()
    padding = _padding("left", B, 6, [6, 4, 2])
    ctx = build_context(torch.zeros(6, B, C, dtype=dtype), torch.zeros(B, H, 6, C // H, dtype=dtype),
                        torch.zeros(B, H, 6, C // H, dtype=dtype), padding, causal=False, same_positions=True)
    stacked = torch.randn(B, H, len(names), 6, C // H, dtype=dtype)

    def run(make):
        x = stacked.clone().requires_grad_(True)
        fusion.zero_grad()
        logged = {}
        fusion.log_metrics = lambda names, values, *a, **k: logged.update(zip(names, values.float().tolist()))
        out = fusion(make(x), ctx)
        (out.float() * torch.linspace(-1, 1, C)).sum().backward()
        return out.float(), x.grad.float(), [p.grad.float() for p in fusion.parameters()], logged

    got, want = run(BranchOutputs), run(lambda x: list(x.unbind(2)))
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0.05, rtol=0.02)
    for a, b in zip(got[:2] + tuple(got[2]), want[:2] + tuple(want[2])):
        torch.testing.assert_close(a, b, **tol)
    assert len(got[2]) == 4  # both weights and both biases of the gate
    assert set(got[3]) == set(want[3]) == {f"gate_{n}" for n in names}
    for name, value in want[3].items():
        assert abs(got[3][name] - value) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_flex_is_not_taken_on_a_cpu_with_gradients(monkeypatch):
    """torch has no backward pass for the fused kernel on a CPU: with gradients a CPU
    keeps its own kernels whatever ``attention_impl`` says."""
    module = _module("gaussian-query", False).train()
    calls = _FlexCalls(monkeypatch)
    x = torch.randn(9, B, C, requires_grad=True)
    _run(module, x, "flex", None).sum().backward()
    assert calls.count == 0 and x.grad is not None


@pytest.mark.parametrize("head_dim", [8, 16], ids=lambda d: f"Dh={d}")
def test_a_head_dimension_under_16_stays_off_the_compiled_kernel(head_dim, monkeypatch):
    """Inductor's kernels of the fused call (CUDA) need a head dimension of at least 16
    (its lowering raises below that): on such a device a core with ``Dh = 8`` takes the
    other kernels, one with ``Dh = 16`` the fused call. The CPU stands in for that
    device here; the outputs equal the eager reference either way."""
    monkeypatch.setattr(flex, "TRITON_DEVICES", ("cpu",))
    torch.manual_seed(0)
    dim = H * head_dim
    module = AttentionCore(dim, H, self_attention=True, branches=[GaussianLocalness(dim, H)]).eval()
    x = torch.randn(9, B, dim)
    calls = _FlexCalls(monkeypatch)
    with torch.no_grad():
        out = _run(module, x, "flex", None)
        ref = _run(module, x, "eager", None)
    assert calls.count == (0 if head_dim < flex.MIN_HEAD_DIM else 1)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def test_descriptions_evaluate_to_the_eager_bias_and_mask():
    """A description evaluated densely is what the eager reference adds and masks:
    the Gaussian's block rows equal its dense bias, Shaw et al.'s bucket table equals
    the key scores, a window blocks what ``materialize`` shows."""
    torch.manual_seed(0)
    T = 9
    q = torch.randn(2, H, T, C // H)
    padding = _padding("left", 2, T, [T, 5])
    ctx = build_context(torch.randn(T, 2, C), q, q, padding, causal=False, same_positions=True)
    score = GaussianLocalness(C, H).describe(ctx).scores[0]
    torch.testing.assert_close(gaussian_rows((score.centre, score.sigma, score.k_pos), 2, 7), score.dense()[:, :, 2:7])
    rel = RelativePositions(C // H, 3)
    key, value = rel.describe(q, 0.5)
    torch.testing.assert_close(key.dense(T), rel.key_scores(q * 0.5, ctx))
    assert value.k == 3 and value.embeddings is rel.value_embeddings
    window = WindowBranch(2, 1, "w")
    assert torch.equal(window.mask(ctx)[0, 0], window.materialize(T))
    assert window.describe(ctx).window == flex.Window(2, 1)


def _trained(module, x, impl, padding, keep=1.0):
    """``module``'s output on ``x`` (``T x B x C``) by path ``impl``, times ``keep``, the
    gradient of the input and those of the parameters, after a backward pass of the
    output's squares."""
    inputs = x.clone().requires_grad_(True)
    module.zero_grad()
    out = _run(module, inputs, impl, padding) * keep
    out.pow(2).sum().backward()
    return [out, inputs.grad] + [p.grad for p in module.parameters() if p.grad is not None]


def _traced_on_the_cpu(monkeypatch, backend="eager", as_compiled=True):
    """Compile the fused call on the CPU as CUDA does (one code object per kind of call,
    ``fullgraph=True``, dynamic shapes), traced by dynamo and run by torch's reference
    (``backend="eager"``: the CPU has no compiled kernel with a log-sum-exp; or the
    ``backend`` given), which gives captured tensors their gradients as a compiled
    kernel does where ``as_compiled`` (:func:`_buffer_gradients_as_compiled`); returns
    the dynamo counters, cleared."""
    import torch._dynamo

    monkeypatch.setitem(flex.COMPILE_BACKENDS, "cpu", backend)
    monkeypatch.setattr(flex, "COMPILED", {})
    monkeypatch.setattr(flex, "_PROLOGUE_CHECKED", set())
    monkeypatch.setattr(flex, "_PROLOGUE_OUTSIDE", set())
    if as_compiled:
        _buffer_gradients_as_compiled(monkeypatch)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    return torch._dynamo.utils.counters


def _buffer_gradients_as_compiled(monkeypatch, dropped=None):
    """torch's reference implementation of the fused backward pass (what a CPU runs
    for a traced graph) gives a score function's captured tensor a gradient where that
    tensor requires one at run time; a compiled kernel (Inductor's) where the traced
    joint graph of the score function gives one. For a tensor computed within the
    compiled call (a prologue's P and sigma) the two differ: in the backward graph it
    is a saved activation, which requires none. Here the reference decides as the
    compiled kernel does, from the joint graph; where ``dropped()`` is true, it gives
    such tensors zeros instead (a compiler that dropped their gradients without a
    word)."""
    import sys

    import torch._higher_order_ops.flex_attention  # noqa: F401 - the module, below by name
    from torch._C import DispatchKey

    hop = sys.modules["torch._higher_order_ops.flex_attention"].flex_attention_backward
    reference = hop.py_kernels[DispatchKey.CompositeExplicitAutograd]

    def backward(*args):
        args = list(args)
        outputs = next(node for node in args[8].graph.nodes if node.op == "output").args[0]  # the joint graph's
        made = [isinstance(b, torch.Tensor) and g is not None and not b.requires_grad
                for b, g in zip(args[12], outputs[5:])]  # the captured tensors computed within the call
        args[12] = tuple(b.detach().requires_grad_(True) if m else b for b, m in zip(args[12], made))
        grad_q, grad_k, grad_v, grad_buffers = reference(*args)
        if dropped is not None and dropped():
            grad_buffers = tuple(torch.zeros_like(g) if m else g for g, m in zip(grad_buffers, made))
        return grad_q, grad_k, grad_v, grad_buffers

    monkeypatch.setitem(hop.py_kernels, DispatchKey.CompositeExplicitAutograd, backward)
    monkeypatch.setattr(hop, "_dispatch_cache", {})


def _graphs_per_kind():
    """How many graphs dynamo holds for each kind of call compiled so far."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return {key: len(_debug_get_cache_entry_list(fn._torchdynamo_orig_callable.__code__))
            for key, fn in flex.COMPILED.items()}


def _flex_equals_eager_at_lengths(module, lengths, counters):
    """``module``'s fused path (``"flex"``) equals its eager path at each length (left
    padding), without gradients; returns dynamo's count of graphs after each."""
    graphs = []
    with torch.no_grad():
        for T in lengths:
            x = torch.randn(T, B, C)
            padding = _padding("left", B, T, [T, 5, 2])
            keep = (~padding).t().unsqueeze(-1).float()
            out = _run(module, x, "flex", padding)
            torch.testing.assert_close(out * keep, _run(module, x, "eager", padding) * keep, atol=2e-6, rtol=1e-5)
            graphs.append(counters["stats"]["unique_graphs"])
    return graphs


def test_the_fused_call_traces_whole_and_compiles_once_for_every_length(monkeypatch):
    """The function CUDA compiles for a call with Shaw et al.'s value term
    (``flex._attend_with_value_term``: the call, the far-left call and the value
    term, one compiled call) traces without a graph break (``fullgraph=True``), every
    term present, and new lengths with new tensors reuse it: one graph at the first
    length, none after."""
    counters = _traced_on_the_cpu(monkeypatch)
    module = _module("gaussian+shaw", False).eval()
    try:
        graphs = _flex_equals_eager_at_lengths(module, (9, 12, 15), counters)
        kinds = sorted(name for name, *_ in flex.COMPILED)
    finally:
        torch._dynamo.reset()
    assert kinds == ["_attend_with_value_term"]  # the call, the far-left call and the value term in one
    assert graphs[1:] == [graphs[0]] * 2 and graphs[0] <= 2 * len(kinds), graphs


def test_static_shapes_compile_a_graph_per_length_under_kinds_of_their_own(monkeypatch):
    """``flex.DYNAMIC_SHAPES = False`` (what the GPU probe measures against dynamic
    shapes): each kind compiles under a code object of its own, named ``..._static``,
    a graph per length, with the same outputs; switching back takes the dynamic
    kinds again."""
    counters = _traced_on_the_cpu(monkeypatch)
    module = _module("gaussian+shaw", False).eval()
    monkeypatch.setattr(flex, "DYNAMIC_SHAPES", False)
    try:
        graphs = _flex_equals_eager_at_lengths(module, (9, 12), counters)
        static = dict(flex.COMPILED)
        monkeypatch.setattr(flex, "DYNAMIC_SHAPES", True)
        with torch.no_grad():
            _run(module, torch.randn(9, B, C), "flex", None)
    finally:
        torch._dynamo.reset()
    assert {dynamic for _, _, _, dynamic, _ in static} == {False} and len(static) == 1
    assert all(fn._torchdynamo_orig_callable.__name__.endswith("_static") for fn in static.values())
    assert graphs[1] > graphs[0]  # the second length compiled again
    assert {dynamic for _, _, _, dynamic, _ in flex.COMPILED} == {False, True}


# Every model's attention kinds: the systems of the benchmark at the tiny size.
MODELS = [
    ("localness_transformer_tiny", ["--localness-rel-pos"]),
    ("localness_transformer_tiny", ["--localness-window", "head"]),
    ("hysan_transformer_tiny", []),
    ("hybrid_transformer_tiny", ["--hybrid-decoder-layers", "1"]),
    ("dc_transformer_tiny", ["--dc-mode", "full"]),
]


def test_every_model_in_one_process_compiles_each_kind_of_call_a_few_times_and_no_more(monkeypatch):
    """The benchmark holds every model in one process, and fairseq changes B and T at
    every step. Every kind of fused call (:func:`flex.variant`) has its own code object
    and so its own dynamo budget (``recompile_limit``, 8: with ``fullgraph=True`` a
    call past it raises); here every kind compiles one graph (dynamic shapes from the
    first call, inputs without view tracking, no duck sizing: ``flex._call_compiled``),
    whatever layers, batches and lengths call it, and after two batches of each model
    no batch of new B and T compiles anything."""
    import random

    import torch._dynamo

    from model_utils import build_model, random_batch

    counters = _traced_on_the_cpu(monkeypatch)
    rng = random.Random(0)
    try:
        for arch, extra in MODELS:
            model, task = build_model(arch, extra)
            assert set_attention_impl(model, "flex") > 0
            with torch.no_grad():
                for step in range(4):
                    lengths = [rng.randint(3, 12) for _ in range(rng.randint(2, 5))]
                    src, src_lengths, prev, _ = random_batch(task, lengths, seed=step)
                    model(src, src_lengths, prev)
                    if step == 1:
                        warm = counters["stats"]["unique_graphs"]
            assert counters["stats"]["unique_graphs"] == warm, (arch, extra)
        per_kind = _graphs_per_kind()
    finally:
        torch._dynamo.reset()
    assert len(per_kind) >= 5, per_kind
    assert set(per_kind.values()) == {1}, per_kind


def _recording_constants(monkeypatch):
    """Trace the fused calls through AOTAutograd as Inductor receives them
    (:func:`_traced_on_the_cpu` with a backend that records, in every forward and
    backward graph and their score and mask subgraphs, each tensor held as a constant);
    returns ``(constants, graphs)``: the constants found and the graphs seen."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    constants, graphs = [], []

    def record(gm, example_inputs):
        graphs.append(gm)
        for module in gm.modules():
            for node in module.graph.nodes if isinstance(module, torch.fx.GraphModule) else ():
                if node.op == "get_attr" and isinstance(getattr(module, node.target), torch.Tensor):
                    constants.append((node.target, getattr(module, node.target)))
        return make_boxed_func(gm.forward)

    _traced_on_the_cpu(monkeypatch, aot_autograd(fw_compiler=record, bw_compiler=record))
    return constants, graphs


def _subgraph_ops(graphs):
    """The operators called in the score and mask subgraphs of ``graphs``."""
    return {str(node.target) for gm in graphs for module in gm.modules() if module is not gm
            and isinstance(module, torch.fx.GraphModule) for node in module.graph.nodes if node.op == "call_function"}


def test_the_compiled_graphs_hold_no_tensor_constants(monkeypatch):
    """Every kind of fused call of every model (and Shaw et al.'s value term around it),
    traced through AOTAutograd as Inductor receives it, holds no tensor constant: the
    score and mask functions read their numbers (the window bounds, ``Tk - Tq``,
    Shaw et al.'s K) as 0-d tensors instead of indexing one vector, which traced into
    an index tensor per entry. On a GPU such a constant is a CUDA tensor that
    AOTAutograd's cache cannot write to disk ("unable to serialize", logged for every
    graph on an H200), so every new process compiled each kind again."""
    import torch._dynamo

    from model_utils import build_model, random_batch

    constants, graphs = _recording_constants(monkeypatch)
    try:
        for arch, extra in MODELS:
            model, task = build_model(arch, extra)
            assert set_attention_impl(model, "flex") > 0
            with torch.no_grad():
                src, src_lengths, prev, _ = random_batch(task, [9, 6, 4], seed=0)
                model(src, src_lengths, prev)
        kinds = sorted(name for name, *_ in flex.COMPILED)
    finally:
        torch._dynamo.reset()
    assert "_attend_with_value_term" in kinds and kinds.count("_attend") >= 3, kinds
    assert kinds.count("_attend_windows") >= 3, kinds  # HySAN's encoder and decoder, the hybrid's
    assert len(graphs) >= len(kinds) and "aten.index.Tensor" in _subgraph_ops(graphs)  # the score functions seen
    assert constants == []


def test_the_compiled_training_graphs_hold_no_tensor_constants(monkeypatch):
    """The same in training, forward and backward graphs: a call with every score term
    and a window, and HySAN's windows as one call. The CPU has no backward pass of the
    call, so torch's refusal of one is lifted for the trace (the graphs are the ones
    CUDA compiles; only their execution differs)."""
    import torch._dynamo
    import torch.nn.attention.flex_attention as torch_flex

    if not hasattr(torch_flex, "_validate_device"):
        pytest.skip("this torch checks devices elsewhere")
    monkeypatch.setattr(torch_flex, "_validate_device", lambda *tensors: None)
    constants, graphs = _recording_constants(monkeypatch)
    torch.manual_seed(0)
    T, Dh = 32, 16
    q, k, v = (torch.randn(B, H, T, Dh, requires_grad=True) for _ in range(3))
    centre = (torch.rand(B, H, T) * T).requires_grad_()
    coeff = (-torch.rand(B, H, T)).requires_grad_()
    table = torch.randn(B, H, T, 7, requires_grad=True)
    k_pos = torch.arange(T, dtype=torch.float32).expand(B, T)
    padding = _padding("left", B, T, [T, 20, 9])
    try:
        out = flex._fused_call(q, k, v, 0.25, flex._block_mask(4, 2, T, T, q.device), padding, centre, coeff, k_pos,
                               table, flex._geometry(4, 2, 0, 3, q.device), None, False, None)
        windows = [flex.Window(None, None), flex.Window(0, None), flex.Window(None, 0), flex.Window(3, 3)]
        grouped = q.repeat_interleave(len(windows), dim=1)
        block_mask = flex._windows_block_mask(tuple((w.left, w.right) for w in windows), H, T, T, q.device)
        out2 = flex._fused_call(grouped, k, v, 0.25, block_mask, padding, None, None, None, None,
                                flex._geometry(None, None, 0, 0, q.device), None, False, None, gqa=True)
        (out.sum() + out2.sum()).backward()
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 4 and q.grad is not None and table.grad is not None  # two forward, two backward graphs
    assert "aten.index.Tensor" in _subgraph_ops(graphs)
    assert constants == []


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", ["gaussian+shaw", "gaussian-query", "shaw-key-value"])
def test_a_sublayer_with_learned_terms_is_one_compiled_call_forward_and_one_backward(kind, causal, monkeypatch):
    """Shaw et al.'s call in training as CUDA makes it (the CPU taking CUDA's paths,
    traced through AOTAutograd as Inductor receives it): Yang et al.'s P and sigma
    (their prologue: eq. 6-9), Shaw et al.'s key term (its table, eq. 4), the fused
    call, the far-left call (encoder) and the value term are one compiled function, so
    one forward and one backward graph per sublayer, holding no tensor constant; its
    outputs and gradients equal the eager reference's. The same for the Gaussian
    alone and for Shaw et al.'s terms alone."""
    import torch._dynamo

    constants, graphs = _recording_constants(monkeypatch)
    module = _module(kind, causal)
    T = 11
    padding = None if causal else _padding("left", B, T, [T, 6, 1])
    keep = torch.ones(T, B, 1) if padding is None else (~padding).t().unsqueeze(-1).float()
    torch.manual_seed(2)
    x = torch.randn(T, B, C)

    def run(impl):
        return _trained(module, x, impl, padding, keep)

    try:
        want = run("eager")
        with emulation.cuda_paths_on_cpu():
            got = run("auto")
        kinds = [name for name, *_ in flex.COMPILED]
    finally:
        torch._dynamo.reset()
    assert kinds == ["_attend_after_prologue"] and len(graphs) == 2, (kinds, len(graphs))
    assert not flex._PROLOGUE_OUTSIDE and len(flex._PROLOGUE_CHECKED) == 1
    within = {"gaussian+shaw": ["predicted_gaussian", "key_term"], "gaussian-query": ["predicted_gaussian"],
              "shaw-key-value": ["key_term"]}[kind]
    assert [named[0] for named in next(iter(flex.COMPILED))[1][-1]] == within
    forward_ops = {str(node.target) for node in graphs[0].graph.nodes if node.op == "call_function"}
    # the Gaussian's prologue within the call: its tanh and sigmoid (the key term's is named above)
    assert ({"aten.tanh.default", "aten.sigmoid.default"} <= forward_ops) == ("predicted_gaussian" in within)
    assert constants == []
    assert len(got) == len(want)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_sublayers_with_other_branch_counts_and_one_sentence_batches_keep_within_the_budget(monkeypatch):
    """dynamo compiles a graph of its own per number of query heads (H L with grouped
    heads) and for a batch of one sentence, whatever ``dynamic=True`` says: HySAN
    sublayers of 2 to 9 branches in one process (the benchmark's several systems), each
    with a batch of 3 sentences and of 1, compile without reaching dynamo's limit of 8
    graphs on any code object (with ``fullgraph=True`` that is an error), one graph per
    kind of call."""
    import torch._dynamo

    counters = _traced_on_the_cpu(monkeypatch)
    names = ["global", "forward", "backward"] + [f"local{k}" for k in range(1, 7)]
    try:
        for count in range(2, len(names) + 1):
            torch.manual_seed(count)
            core = AttentionCore(C, H, self_attention=True, branches=[make_branch(n, "encoder") for n in names[:count]],
                                 fusion=build_fusion("sum", C, names[:count])).eval()
            for bsz in (3, 1):
                x = torch.randn(7, bsz, C)
                padding = _padding("left", bsz, 7, [7, 4, 2][:bsz])
                with torch.no_grad():
                    out = _run(core, x, "flex", padding)
                    ref = _run(core, x, "eager", padding)
                keep = (~padding).t().unsqueeze(-1).float()
                torch.testing.assert_close(out * keep, ref * keep, atol=2e-6, rtol=1e-5)
        per_kind = _graphs_per_kind()
        graphs = counters["stats"]["unique_graphs"]
    finally:
        torch._dynamo.reset()
    assert len(per_kind) == 2 * (len(names) - 1) and max(per_kind.values()) == 1, per_kind
    assert graphs == len(per_kind)


def test_the_value_terms_bookkeeping_compiles_into_a_few_kernels(monkeypatch):
    """Shaw et al.'s value term around the fused call (the band's masses recomputed from
    the log-sum-exp, the far buckets, the product with a^V) is about a hundred small
    operations forward and backward; CUDA compiles it (``flex._value_term``, within
    ``flex._attend_with_value_term``) so that they become a few fused kernels. Compiled here by Inductor for the CPU: outputs and the gradients
    of every input (``out``, q, k, the log-sum-exps, the centres and coefficients, the
    bucket table, a^V) equal the uncompiled function's, in under 30 generated kernels
    (22 with torch 2.13) against over 30 operations (96)."""
    from torch._inductor import metrics
    from torch.utils._python_dispatch import TorchDispatchMode

    captured = {}
    original = flex._value_term

    def spy(*args):
        captured["args"] = args
        return original(*args)

    monkeypatch.setattr(flex, "_value_term", spy)
    module = _module("gaussian+shaw", False).eval()
    T = 13
    with torch.no_grad():
        _run(module, torch.randn(T, B, C), "flex", _padding("left", B, T, [T, 7, 1]))
    args = list(captured["args"])
    assert args[5] is not None and args[8] is not None and args[11] is not None  # far-left lse, Gaussian, table
    differentiable = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.is_floating_point()]
    assert len(differentiable) == 10

    def run(function):
        # float64: the far right's mass is clamped at 0, where float32 rounding in another
        # order can flip which side of the clamp an empty bucket's mass falls on
        inputs = [a.detach().double().requires_grad_(True) if i in differentiable else a
                  for i, a in enumerate(args)]
        out = function(*inputs)
        (out * torch.linspace(-1, 1, out.size(-1), dtype=out.dtype)).sum().backward()
        return [out] + [inputs[i].grad for i in differentiable]

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += not func.is_view  # views launch nothing
            return func(*args, **(kwargs or {}))

    with Count():
        want = run(original)
    metrics.reset()
    got = run(torch.compile(original, backend="inductor", dynamic=True, fullgraph=True))
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-7)
    assert metrics.generated_kernel_count < 30 < Count.calls, (metrics.generated_kernel_count, Count.calls)


class _FailsInBackward(torch.autograd.Function):
    """The identity, whose backward pass fails as Inductor passes on Triton's error
    (or ``message`` of another error)."""

    message = None

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        if _FailsInBackward.message is not None:
            raise RuntimeError(_FailsInBackward.message)
        try:
            raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448")
        except RuntimeError as cause:
            raise RuntimeError("backend='inductor' raised: see above") from cause


def _stand_in_kernel(calls):
    """A stand-in for the compiled call: SDPA, whose backward pass fails with the default
    blocks (``kernel_options`` None); records the options of every call."""

    def kernel(device, key, function=None):
        def run(q, k, v, scale, block_mask, padding, centre, coeff, k_pos, table, geometry, bias, return_lse,
                options, gqa=False):
            calls.append(options)
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)
            return _FailsInBackward.apply(out) if options is None else out

        return run

    return kernel


def _stand_in_gpu(monkeypatch):
    """The CPU in CUDA's place, the stand-in kernel in the compiled call's; returns the
    list of the options of every call."""
    calls = []
    monkeypatch.setattr(flex, "TRITON_DEVICES", ("cpu",))
    monkeypatch.setitem(flex.COMPILE_BACKENDS, "cpu", "eager")
    monkeypatch.setattr(flex, "_kernel", _stand_in_kernel(calls))
    monkeypatch.setattr(flex, "_CHECKED", set())
    monkeypatch.setattr(flex, "_NEED_SMALL_BLOCKS", set())
    return calls


def test_a_kind_of_call_out_of_shared_memory_takes_small_blocks_from_then_on(monkeypatch):
    """The first call of a kind with gradients on a GPU runs once more, forward and
    backward: where Triton runs out of shared memory there (as Shaw et al.'s table did
    with the default blocks on an H200), the call and every later one of its kind take
    the small blocks instead of failing in the training step's backward pass. The CPU
    stands in for CUDA, a stand-in kernel for the compiled call."""
    calls = _stand_in_gpu(monkeypatch)
    monkeypatch.setattr(_FailsInBackward, "message", None)
    q, k, v = (torch.randn(2, 4, 6, 16, requires_grad=True) for _ in range(3))
    args = (0.25, None, None, None, None, None, None, None, None, False, None)
    for _ in range(2):
        out = flex._fused_call(q, k, v, *args)
        out.sum().backward()
    assert calls == [None, flex.SMALL_BLOCKS, flex.SMALL_BLOCKS]  # checked once, then small blocks
    with torch.no_grad():  # without gradients: another kind, not checked (no backward pass)
        flex._fused_call(q, k, v, *args)
    assert calls[-1] is None and len(flex._NEED_SMALL_BLOCKS) == 1


@pytest.mark.parametrize("logged", [False, True], ids=["unlogged", "logged"])
def test_the_shared_memory_check_runs_hysans_call_with_its_gate_whether_logged_or_not(logged, monkeypatch):
    """The first call of a kind with gradients on a GPU runs once more to check its
    shared memory (``flex._fits``); HySAN's call with its gate within returns the
    gated sum and the gates' means, None where nothing logs them (a module without a
    metric name, as in a test or a script outside fairseq): the check runs either way
    (the CPU taking CUDA's place and paths, the call traced by dynamo) and the call
    then equals the eager path."""
    import torch._dynamo

    monkeypatch.setattr(flex, "TRITON_DEVICES", ("cpu",))
    monkeypatch.setitem(flex.COMPILE_BACKENDS, "cpu", "eager")
    monkeypatch.setattr(flex, "COMPILED", {})
    monkeypatch.setattr(flex, "_CHECKED", set())
    monkeypatch.setattr(flex, "_NEED_SMALL_BLOCKS", set())
    module = _module("hysan", False)
    if logged:
        module.fusion.metric_prefix = "enc1"
    T = 9
    padding = _padding("left", B, T, [T, 5, 2])
    x = torch.randn(T, B, C)
    want = _run(module, x, "eager", padding)
    torch._dynamo.reset()
    try:
        with emulation.cuda_paths_on_cpu():
            got = _run(module, x.clone().requires_grad_(True), "auto", padding)
            got.sum().backward()
        graphs = _graphs_per_kind()
    finally:
        torch._dynamo.reset()
    assert [name for name, _ in flex._CHECKED] == ["_attend_windows"] and not flex._NEED_SMALL_BLOCKS
    # the check's copies of the gate's parameters are parameters: the kind compiled once
    assert [count for (name, *_), count in graphs.items() if name == "_attend_windows"] == [1], graphs
    keep = (~padding).t().unsqueeze(-1).float()
    torch.testing.assert_close(got * keep, want * keep, atol=2e-6, rtol=1e-5)


def test_hysans_compiled_call_keeps_nothing_of_its_gate_for_the_backward_pass(monkeypatch):
    """HySAN's call with its squeeze gate within, traced in training through
    AOTAutograd with the partitioner Inductor uses: the forward graph keeps for the
    backward pass what the fused call itself needs (the queries' copy per group, k, v,
    its output and log-sum-exp) and the gate's weights, but nothing of the gate's own
    of a token's width (the merged heads ``Tq x L*B x C``, the gates, the bottleneck
    ``C/r``): those are recomputed in the backward pass from the call's output. The
    graph holds no tensor constant."""
    import torch._dynamo
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    kept, constants = [], []

    def forward_compiler(gm, example_inputs):
        outputs = [node for node in gm.graph.nodes if node.op == "output"][0].args[0]
        kept.extend(node.meta.get("val") for node in outputs if node is not None and hasattr(node, "meta"))
        for module in gm.modules():
            for node in module.graph.nodes if isinstance(module, torch.fx.GraphModule) else ():
                if node.op == "get_attr" and isinstance(getattr(module, node.target), torch.Tensor):
                    constants.append(node.target)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                           partition_fn=min_cut_rematerialization_partition)
    _traced_on_the_cpu(monkeypatch, backend)
    module = _module("hysan", False)
    module.fusion.metric_prefix = "enc1"
    T = 9
    padding = _padding("left", B, T, [T, 5, 2])
    try:
        with emulation.cuda_paths_on_cpu():
            _run(module, torch.randn(T, B, C, requires_grad=True), "auto", padding).sum().backward()
    finally:
        torch._dynamo.reset()
    tensors = [t for t in kept if isinstance(t, torch.Tensor) and t.is_floating_point()]
    assert tensors, kept
    assert constants == []  # (as every other kind of call: see the tests of tensor constants above)
    count = len(module.fusion.names)
    gate_rows = (T, count * B)  # the merged heads', the gates' and the bottleneck's leading sizes
    assert not [tuple(t.shape) for t in tensors if tuple(t.shape[:2]) == gate_rows], [tuple(t.shape) for t in tensors]


def test_any_other_error_of_the_check_is_raised(monkeypatch):
    _stand_in_gpu(monkeypatch)
    monkeypatch.setattr(_FailsInBackward, "message", "CUDA error: an illegal memory access was encountered")
    q, k, v = (torch.randn(2, 4, 6, 16, requires_grad=True) for _ in range(3))
    with pytest.raises(RuntimeError, match="illegal memory access"):
        flex._fused_call(q, k, v, 0.25, None, None, None, None, None, None, None, None, False, None)
    assert not flex._NEED_SMALL_BLOCKS


def test_training_and_inference_are_different_kinds_of_call():
    """The grad mode is one of dynamo's guards: a training step and the validation
    after it are two kinds of call with a budget each (so a model's kinds are not
    counted twice against one budget)."""
    q = torch.randn(2, 4, 5, 8)
    args = (None, None, None, None, None, True, None)
    with torch.no_grad():
        inference = flex.variant(q, *args)
    assert flex.variant(q, *args) != inference
    assert flex.variant(q.half(), *args) != flex.variant(q, *args)
    assert flex.variant(q, None, torch.ones(2, 5, dtype=torch.bool), None, None, None, True, None) != flex.variant(q, *args)


def test_an_empty_far_bucket_window_is_known_empty():
    """The value term's far-left call is skipped where no query has such a key."""
    assert flex._empty(flex.Window(2, -3), 5, 5)
    assert flex._empty(flex.Window(None, -5), 5, 5)
    assert not flex._empty(flex.Window(None, -4), 5, 5)
    assert flex._empty(flex.Window(None, -3), 1, 3)


# ------------------------------------------------------------------------------ CUDA
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
# ||fast - eager|| / ||eager|| per tensor: float32 to rounding (no TF32 on either
# side), half precision within its rounding of q, k, v and the output.
CUDA_TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}
CUDA_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _relative(a, b, floor=1e-6):
    """``||a - b|| / max(||b||, floor)``."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=floor)).item()


@cuda
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_fused_path_equals_eager_outputs_and_gradients(kind, causal, dtype, side, monkeypatch):
    """On CUDA ``"auto"`` takes the fused kernels; their outputs and the gradients of
    the input (through q, k, v) and of every parameter (centres' and widths'
    projections, z of the head strategy, a^K, a^V, gates, the convolution) == the
    eager reference's in float32 (the reference itself runs in float32 from the same
    weights), with padding on either side."""
    _check_fused_against_eager(kind, causal, dtype, side, "cuda", monkeypatch)


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["gaussian-query", "gaussian+shaw", "shaw-key-value"])
def test_cuda_prologues_stay_within_the_compiled_call(kind, dtype, monkeypatch):
    """On CUDA the score terms given by a prologue (Yang et al.'s centre and window,
    Shaw et al.'s key term) are computed within the compiled call: Inductor gives the
    captured tensors computed there their gradients, so every kind of call passes its
    check (none computes its prologues before the call), in training and without
    gradients, and the outputs and gradients equal the eager reference's (the test
    above). A failure here, with the other CUDA tests passing, means the fallback took
    the calls: the log's warning says why."""
    monkeypatch.setattr(flex, "_PROLOGUE_CHECKED", set())
    monkeypatch.setattr(flex, "_PROLOGUE_OUTSIDE", set())
    _check_fused_against_eager(kind, False, dtype, "left", "cuda", monkeypatch)
    module = _module(kind, True, dtype=dtype, device="cuda")
    with torch.no_grad():
        _run(module, torch.randn(9, B, C, device="cuda", dtype=dtype), "auto", None)
    assert len(flex._PROLOGUE_CHECKED) == 2 and not flex._PROLOGUE_OUTSIDE


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_paths_taken_on_the_cpu_equal_eager_outputs_and_gradients(kind, causal, side, monkeypatch):
    """The test above's twin, which CI runs: the CPU takes CUDA's paths
    (:func:`~fairseq_localness.modules.kernels.emulation.cuda_paths_on_cpu`: every
    branch with anything of its own in one FlexAttention call, in training; HySAN's
    and the hybrid's windows in one call with one squeeze gate over the stacked
    branches; the stacked projections; the Dual Contextual module's joint pass),
    the fused calls by torch's reference implementation, forward and backward: the
    outputs and every gradient == the eager reference's, float32."""
    with emulation.cuda_paths_on_cpu():
        _check_fused_against_eager(kind, causal, torch.float32, side, "cpu", monkeypatch)


@pytest.mark.parametrize("causal,side", [(False, "left"), (True, None), (True, "right")],
                         ids=["encoder", "decoder", "decoder-padded"])
def test_hysans_gate_runs_within_the_fused_call_and_logs_what_the_eager_path_logs(causal, side, monkeypatch):
    """On CUDA's paths HySAN's squeeze gate (eq. 13-14) runs within the one fused call
    of its branches (``GatedSumFusion.epilogue``): the call computes the gated sum and
    the gates' means over the real queries, which the fusion logs; in training the
    logged mean gate of every branch equals the eager path's (to float32 rounding),
    with padding on the left in the encoder and on the right in the decoder."""
    from fairseq.logging import metrics

    from fairseq_localness.modules import hysan

    module = _module("hysan", causal)
    module.fusion.metric_prefix = "enc1"
    T = 10
    padding = None if side is None else _padding(side, B, T, [T, 6, 1])
    torch.manual_seed(3)
    x = torch.randn(T, B, C, requires_grad=True)
    epilogues = []
    original = hysan._gated_sum_epilogue

    def spy(*args):
        epilogues.append(args[-1])  # whether it computes the means
        return original(*args)

    monkeypatch.setattr(hysan, "_gated_sum_epilogue", spy)
    logged = {}
    for impl in ("eager", "auto"):
        with metrics.aggregate(new_root=True) as agg, emulation.cuda_paths_on_cpu():
            _run(module, x, impl, padding).sum().backward()
        logged[impl] = {key: agg[key].avg for key in agg.keys() if key.startswith("enc1_gate_")}
    assert epilogues == [True, True]  # the fused path only, with the means; recomputed in the backward pass
    assert sorted(logged["auto"]) == sorted(logged["eager"]) == sorted(f"enc1_gate_{n}" for n in module.fusion.names)
    for key, value in logged["eager"].items():
        assert logged["auto"][key] == pytest.approx(value, rel=1e-5), key


@pytest.mark.parametrize("causal,side", [(False, "left"), (True, None), (True, "right")],
                         ids=["encoder", "decoder", "decoder-padded"])
def test_the_gaussians_prologue_runs_within_the_fused_call_and_logs_what_the_eager_path_logs(causal, side,
                                                                                             monkeypatch):
    """On CUDA's paths Yang et al.'s P and sigma (eq. 6-9) are computed within the
    fused call that reads them (``flex._attend_after_prologue``), with the means the
    branch logs: in training the logged mean centre offset and window equal the eager
    path's (to float32 rounding), with padding on the left in the encoder and on the
    right in the decoder; the prologue runs once per pass."""
    from fairseq.logging import metrics

    from fairseq_localness.modules import gaussian

    module = _module("gaussian-query", causal)
    branch = module.branches[0]
    branch.metric_prefix = "enc1"
    T = 10
    padding = None if side is None else _padding(side, B, T, [T, 6, 1])
    torch.manual_seed(3)
    x = torch.randn(T, B, C, requires_grad=True)
    prologues, within = [], []
    original, call = gaussian.predicted_gaussian, flex._attend_after_prologue

    def spy(*args):
        prologues.append(args[-1])  # whether it computes the means
        return original(*args)

    def spy_call(*args):
        within.extend(spec[0].__name__ for spec in args[2])  # the prologues of the call
        return call(*args)

    monkeypatch.setattr(gaussian, "predicted_gaussian", spy)
    monkeypatch.setattr(flex, "_attend_after_prologue", spy_call)
    logged = {}
    for impl in ("eager", "auto"):  # the eager reference on the CPU's own paths, without the prologue
        with metrics.aggregate(new_root=True) as agg, \
                emulation.cuda_paths_on_cpu() if impl == "auto" else contextlib.nullcontext():
            _run(module, x, impl, padding).sum().backward()
        logged[impl] = {key: agg[key].avg for key in agg.keys() if key.startswith("enc1_")}
        assert {agg[key]._totals()[1] for key in logged[impl]} == {1.0}, impl  # logged once, weight 1
    assert prologues == [True] and within == ["spy"]  # the fused path only, within its call
    assert sorted(logged["auto"]) == sorted(logged["eager"]) == ["enc1_centre_offset", "enc1_window"]
    for key, value in logged["eager"].items():
        assert logged["auto"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("kind", ["gaussian-query", "gaussian+shaw"])
def test_a_call_whose_prologue_gets_no_gradient_computes_it_before_the_call(kind, monkeypatch, caplog):
    """The first call of a kind with a prologue within runs once more, forward and
    backward, compiled and not, where it is compiled: where the prologues' tensors get
    no gradient (as torch's reference implementation of the backward pass gives none to
    a captured tensor computed within a traced call), the kind computes its prologues
    before the call from then on, with a warning, and its outputs and gradients still
    equal the eager reference's; the check runs once per kind."""
    import logging

    import torch._dynamo

    _traced_on_the_cpu(monkeypatch, "aot_eager", as_compiled=False)  # torch's reference: no gradient there
    module = _module(kind, False)
    T = 9
    padding = _padding("left", B, T, [T, 5, 2])
    keep = (~padding).t().unsqueeze(-1).float()
    x = torch.randn(T, B, C)

    def run(impl):
        return _trained(module, x, impl, padding, keep)

    want = run("eager")
    torch._dynamo.reset()
    try:
        with emulation.cuda_paths_on_cpu(), caplog.at_level(logging.WARNING, logger=flex.__name__):
            got = [run("auto") for _ in range(2)]
    finally:
        torch._dynamo.reset()
    assert len(flex._PROLOGUE_CHECKED) == 1 and flex._PROLOGUE_OUTSIDE == flex._PROLOGUE_CHECKED
    assert sum("failed its check (RuntimeError" in r.getMessage() for r in caplog.records) == 1
    inner = "_attend" if kind == "gaussian-query" else "_attend_with_value_term"
    assert sorted(name for name, *_ in flex.COMPILED) == sorted([inner, "_attend_after_prologue"])
    try:  # without gradients (validation, beam search) the kind computes its prologues before the call too
        with emulation.cuda_paths_on_cpu(), torch.no_grad():
            out = _run(module, x, "auto", padding) * keep
    finally:
        torch._dynamo.reset()
    assert sorted(name for name, *_ in flex.COMPILED) == sorted([inner, inner, "_attend_after_prologue"])
    torch.testing.assert_close(out, want[0], atol=2e-5, rtol=1e-4)
    for each in got:
        assert len(each) == len(want)
        for a, b in zip(each, want):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_a_call_without_gradients_is_checked_too(monkeypatch, caplog):
    """A process that only evaluates (fairseq-generate) checks its kinds without
    gradients, their outputs: a prologue that does not compile within the call (here
    one with a graph break, which ``fullgraph=True`` refuses) is computed before it,
    with a warning, and the outputs equal the eager reference's."""
    import logging

    import torch._dynamo

    from fairseq_localness.modules import gaussian

    original = gaussian.predicted_gaussian

    def breaks(*args):
        torch._dynamo.graph_break()
        return original(*args)

    _traced_on_the_cpu(monkeypatch, "aot_eager")
    monkeypatch.setattr(gaussian, "predicted_gaussian", breaks)
    module = _module("gaussian-query", False).eval()
    x = torch.randn(9, B, C)
    want = _run(module, x, "eager", None)
    try:
        with emulation.cuda_paths_on_cpu(), torch.no_grad(), \
                caplog.at_level(logging.WARNING, logger=flex.__name__):
            got = [_run(module, x, "auto", None) for _ in range(2)]
    finally:
        torch._dynamo.reset()
    assert len(flex._PROLOGUE_CHECKED) == 1 and len(flex._PROLOGUE_OUTSIDE) == 1
    assert sum("failed its check" in r.getMessage() for r in caplog.records) == 1
    for out in got:
        torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)


def test_a_gradient_that_is_rightly_zero_passes_the_prologues_check(monkeypatch):
    """A window held at its floor (F above every real length: D = F whatever U_d
    gives) gives U_d a gradient of zero, in the compiled call and in the reference
    alike: the kind keeps its prologue within the call (the check compares with the
    reference, not with zero)."""
    import torch._dynamo

    _traced_on_the_cpu(monkeypatch, "aot_eager")
    module = AttentionCore(C, H, self_attention=True, branches=[GaussianLocalness(C, H, min_window=64.0)])
    x = torch.randn(9, B, C, requires_grad=True)
    try:
        with emulation.cuda_paths_on_cpu():
            _run(module, x, "auto", None).sum().backward()
    finally:
        torch._dynamo.reset()
    assert len(flex._PROLOGUE_CHECKED) == 1 and not flex._PROLOGUE_OUTSIDE
    u_d = module.branches[0].u_d.weight.grad
    assert u_d is not None and not u_d.any() and module.branches[0].u_p.weight.grad.any()


def test_a_compiled_call_that_drops_the_prologues_gradients_is_told_apart(monkeypatch, caplog):
    """Where the compiled backward pass gives the captured P and coefficient zeros
    instead of their gradients (without an error), the check's comparison with the
    reference tells it: the kind computes its prologue before the call, and the
    training step's gradients equal the eager reference's."""
    import logging

    import torch._dynamo

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    compiled_backward = []  # non-empty while a compiled backward graph runs

    def backward_compiler(gm, _):
        def run(*args):
            compiled_backward.append(True)
            try:
                return gm.forward(*args)
            finally:
                compiled_backward.pop()

        return make_boxed_func(run)

    _traced_on_the_cpu(monkeypatch, aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm.forward),
                                                 bw_compiler=backward_compiler))
    _buffer_gradients_as_compiled(monkeypatch, dropped=lambda: bool(compiled_backward))
    module = _module("gaussian-query", False)
    x = torch.randn(9, B, C)

    def run(impl):
        return _trained(module, x, impl, None)

    want = run("eager")
    try:
        with emulation.cuda_paths_on_cpu(), caplog.at_level(logging.WARNING, logger=flex.__name__):
            got = run("auto")
    finally:
        torch._dynamo.reset()
    assert flex._PROLOGUE_OUTSIDE == flex._PROLOGUE_CHECKED and len(flex._PROLOGUE_CHECKED) == 1
    assert any("differs from the reference's" in r.getMessage() for r in caplog.records)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_a_term_given_by_its_prologue_is_computed_once_when_read():
    """A score term given by a prologue (a Gaussian's P and sigma, Shaw et al.'s table)
    computes its tensors when first read, and reports the prologue's stats then, once;
    a term given neither its tensors nor a prologue is refused."""
    from fairseq_localness.modules.scores import BucketScore, GaussianScore, Prologue

    runs, reports = [], []
    q = torch.randn(2, 3, 4, 8)

    def prologue(q, offset, flag):
        runs.append(flag)
        centre = q.sum(-1) + offset
        return (centre, centre.abs() + 1), torch.stack([centre.mean(), offset])

    term = GaussianScore.predicted(Prologue(prologue, q, (torch.tensor(0.5),), ("flag",), reports.append),
                                   torch.arange(4.0).expand(2, 4))
    assert not term.computed and runs == []
    torch.testing.assert_close(term.centre, q.sum(-1) + 0.5)
    dense = term.dense()
    torch.testing.assert_close(term.sigma, (q.sum(-1) + 0.5).abs() + 1)
    torch.testing.assert_close(term.coefficient(), -0.5 / term.sigma ** 2)
    assert term.computed and runs == ["flag"] and len(reports) == 1 and dense.shape == (2, 3, 4, 4)
    table = BucketScore(None, 1, Prologue(lambda q, w: ((q @ w,), None), q, (torch.randn(8, 3),), ()))
    assert not table.computed and table.dense(4).shape == (2, 3, 4, 4) and table.table.shape == (2, 3, 4, 3)
    with pytest.raises(ValueError, match="GaussianScore needs its tensors, or a prologue"):
        GaussianScore(None, torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match="BucketScore needs its tensors, or a prologue"):
        BucketScore(None, 2)


def test_the_cpu_takes_its_own_paths_again_after_cudas(monkeypatch):
    """Leaving :func:`~fairseq_localness.modules.kernels.emulation.cuda_paths_on_cpu`
    (also by an error) restores every switch: a trained call on the CPU takes the
    fused kernel inside and not after, and torch refuses a CPU flex call that needs
    gradients again."""
    import torch.nn.attention.flex_attention as torch_flex

    from fairseq_localness.modules import dual_context, hysan, projections

    before = (choice.FUSED_DEVICES, projections.STACKED_PROJECTION_DEVICES, dual_context.JOINT_PASS_DEVICES,
              hysan.BRANCH_LOOP_DEVICES, flex.EPILOGUE_DEVICES, torch_flex._validate_device)
    module = _module("gaussian-query", False)
    x = torch.randn(9, B, C, requires_grad=True)
    calls = _FlexCalls(monkeypatch)
    with pytest.raises(RuntimeError, match="inside"):
        with emulation.cuda_paths_on_cpu():
            assert "cpu" in choice.FUSED_DEVICES and "cpu" not in hysan.BRANCH_LOOP_DEVICES
            _run(module, x, "auto", None).sum().backward()
            assert calls.count == 1
            raise RuntimeError("inside")
    assert (choice.FUSED_DEVICES, projections.STACKED_PROJECTION_DEVICES, dual_context.JOINT_PASS_DEVICES,
            hysan.BRANCH_LOOP_DEVICES, flex.EPILOGUE_DEVICES, torch_flex._validate_device) == before
    _run(module, x, "auto", None).sum().backward()
    assert calls.count == 1  # the CPU's own kernels took the trained call
    q = torch.randn(1, 1, 4, 16, requires_grad=True)
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        torch_flex.flex_attention(q, q, q)


def _check_fused_against_eager(kind, causal, dtype, side, device, monkeypatch):
    T = 37
    module = _module(kind, causal, device=device)
    torch.manual_seed(1)
    x32 = torch.randn(T, B, C, device=device)
    padding = _padding(side, B, T, [T, 20, 1], device=device) if not causal or side == "right" else None
    keep = torch.ones(T, B, 1, device=device) if padding is None else (~padding).t().unsqueeze(-1).float()
    if causal and padding is not None:
        keep = keep * (~padding).t().unsqueeze(-1).float()

    def run(impl, mod, x):
        x = x.clone().requires_grad_(True)
        mod.zero_grad()
        out = _run(mod, x, impl, padding)
        (out.float() * keep).pow(2).sum().backward()
        return [out.float() * keep, x.grad.float()] + [p.grad.float() for p in mod.parameters() if p.grad is not None]

    ref = run("eager", module, x32)
    calls = _FlexCalls(monkeypatch)
    fast = run("auto", module.to(dtype), x32.to(dtype))
    assert calls.count >= 1 or kind == "dual-context"
    if kind in ("hysan", "hybrid-gate"):  # every branch a window: one call for all
        assert (calls.count, calls.windows) == (1, 1)
    assert len(fast) == len(ref)
    # a tensor whose gradient is zero up to rounding (the key projection's bias: softmax
    # is shift invariant) is compared relative to the largest gradient
    floor = 0.01 * max(t.norm().item() for t in ref)
    for got, want in zip(fast, ref):
        assert _relative(got, want, floor) < CUDA_TOL[dtype]


@cuda
@pytest.mark.parametrize("dtype", CUDA_DTYPES, ids=str)
@pytest.mark.parametrize("kind", list(KINDS))
def test_cuda_incremental_decoding_and_beam_reorder_equal_the_full_pass(kind, dtype):
    """Decoder side on CUDA: one token at a time (the step kernels) and several at
    once after a cached prefix (the fused kernel, Tq < Tk), with a beam reorder of the
    cache between them, == the full fused pass."""
    _check_steps_then_a_chunk(kind, dtype, "cuda")


@pytest.mark.parametrize("kind", list(KINDS))
def test_incremental_decoding_and_beam_reorder_equal_the_full_pass_on_the_cpu(kind):
    """The same on the CPU, with its own kernels (the test above's twin, which CI runs)."""
    _check_steps_then_a_chunk(kind, torch.float32, "cpu")


def _check_steps_then_a_chunk(kind, dtype, device):
    module = _module(kind, True, dtype=dtype, device=device).eval()
    T = 12
    x = torch.randn(T, B, C, device=device, dtype=dtype)
    order = torch.tensor([1, 2, 0], device=device)
    with torch.no_grad():
        full, _ = module(x, x, x, need_weights=False)
        state = {}
        for t in range(4):
            token = x[t : t + 1]
            module(token, token, token, incremental_state=state, need_weights=False)
        _reorder(module, state, order)
        rest = x[4:, order]
        step, _ = module(rest, rest, rest, incremental_state=state, need_weights=False)
    assert _relative(step, full[4:, order]) < CUDA_TOL[dtype]


@cuda
def test_cuda_fused_kernel_compiles_once_per_kind_of_call():
    """The fused call is compiled once: new lengths and new tensors of a call of the
    same kind reuse it (a closure per call would compile each time)."""
    import torch._dynamo

    module = _module("gaussian+shaw", False, device="cuda")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    graphs = []
    for T in (16, 24, 40, 56):
        x = torch.randn(T, B, C, device="cuda", requires_grad=True)
        out = _run(module, x, "auto", _padding("left", B, T, [T, 9, 3], device="cuda"))
        out.sum().backward()
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    # dynamic shapes from the first call: one compiled function for the call, the far-left
    # call and the value term (a view's base guard may add one graph at the second call),
    # then nothing for a new length
    assert graphs[1:] == [graphs[1]] * 3 and graphs[-1] <= 2, graphs


def test_duck_sizing_is_off_inside_a_fused_call_and_restored_after():
    """``flex._no_duck_sizing()`` turns torch's duck sizing off and restores the setting
    after it, nested and after an error."""
    from torch.fx.experimental import _config as fx_config

    before = fx_config.use_duck_shape
    with pytest.raises(RuntimeError):
        with flex._no_duck_sizing():
            assert fx_config.use_duck_shape is False
            with flex._no_duck_sizing():
                assert fx_config.use_duck_shape is False
            assert fx_config.use_duck_shape is False
            raise RuntimeError("inside")
    assert fx_config.use_duck_shape is before


def test_duck_sizing_switch_keeps_each_threads_own_setting():
    """The setting is per thread: two threads' calls that interleave each get their
    own value back."""
    import threading

    from torch.fx.experimental import _config as fx_config

    entered_a, entered_b, left_a = threading.Event(), threading.Event(), threading.Event()
    after = {}

    def thread_a():
        fx_config.use_duck_shape = True
        with flex._no_duck_sizing():
            entered_a.set()
            entered_b.wait(5)
        left_a.set()
        after["a"] = fx_config.use_duck_shape

    def thread_b():
        fx_config.use_duck_shape = False
        entered_a.wait(5)
        with flex._no_duck_sizing():
            entered_b.set()
            left_a.wait(5)
        after["b"] = fx_config.use_duck_shape

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert after == {"a": True, "b": False}


def test_inductors_options_compile_kinds_of_their_own(monkeypatch):
    """``flex.INDUCTOR_OPTIONS`` (the probe's ``cpp`` and ``graphs`` variants) reach
    ``torch.compile`` for Inductor only (other backends ignore them, with a warning),
    and a kind compiled with them is cached apart from the same kind without."""
    made = []

    def fake_compile(function, **kwargs):
        made.append((function.__name__, kwargs))
        return function

    monkeypatch.setattr(flex, "COMPILED", {})
    monkeypatch.setattr(torch, "compile", fake_compile)
    key = ("kind",)
    plain = flex._compiled(key, "inductor")
    monkeypatch.setattr(flex, "INDUCTOR_OPTIONS", {"cpp_wrapper": True})
    with_options = flex._compiled(key, "inductor")
    assert flex._compiled(key, "inductor") is with_options and with_options is not plain
    flex._compiled(key, "aot_eager")
    assert [kwargs["options"] for _, kwargs in made] == [None, {"cpp_wrapper": True}, None]
    assert made[1][0].endswith("_options") and not made[0][0].endswith("_options")
    monkeypatch.setattr(flex, "INDUCTOR_OPTIONS", None)
    assert flex._compiled(key, "inductor") is plain and len(made) == 3
