"""Helpers for the model tests: build any registered architecture on a toy
dictionary from command-line style arguments, without data on disk."""
import argparse
import math
from typing import List, Optional

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY
from torch.utils._python_dispatch import TorchDispatchMode

import fairseq_localness  # noqa: F401  (registers the models)
from fairseq_localness.modules.attention import set_attention_impl

VOCAB = 40
TINY = [
    "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
    "--encoder-layers", "3", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
    "--decoder-attention-heads", "4", "--decoder-layers", "3",
    "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
]
NO_DROPOUT = ["--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]
"""No dropout of any kind (outputs compared exactly, or counted)."""


class OperatorCalls(TorchDispatchMode):
    """Records the name of every operator called inside it (``names``), as the
    dispatcher sees them (views too): for tests that count what a pass launches."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def size_args(layers: int, dim: int, ffn: int, heads: int) -> List[str]:
    """fairseq's size options of a transformer, the same on the encoder and the decoder
    side: ``layers`` layers of width ``dim``, feed-forward width ``ffn``, ``heads`` heads."""
    return [arg for side in ("encoder", "decoder") for arg in (
        f"--{side}-layers", str(layers), f"--{side}-embed-dim", str(dim),
        f"--{side}-ffn-embed-dim", str(ffn), f"--{side}-attention-heads", str(heads))]

class ToyTask:
    def __init__(self, vocab: int = VOCAB):
        d = Dictionary()
        for i in range(vocab):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d
        self.src_dict = self.tgt_dict = d


def parse_model_args(arch: str, extra: Optional[List[str]] = None) -> argparse.Namespace:
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/dev/null", "--task", "translation", "--arch", arch] + list(extra or [])
    )
    return args


def build_model(arch: str, extra: Optional[List[str]] = None, task: Optional[ToyTask] = None, seed: int = 0):
    args = parse_model_args(arch, extra)
    torch.manual_seed(seed)
    task = task or ToyTask()
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    return model.eval(), task


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def random_batch(task, lengths, seed=0, left_pad_source=True):
    """Source tokens (left padded like fairseq), lengths, prev_output_tokens, target."""
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    pad, eos = d.pad(), d.eos()
    bsz, max_len = len(lengths), max(lengths)
    src = torch.full((bsz, max_len), pad, dtype=torch.long)
    for b, n in enumerate(lengths):
        toks = torch.randint(d.nspecial, len(d), (n - 1,), generator=g).tolist() + [eos]
        if left_pad_source:
            src[b, max_len - n:] = torch.tensor(toks)
        else:
            src[b, :n] = torch.tensor(toks)
    tgt_len = max_len + 1
    tgt = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    tgt[:, -1] = eos
    prev = torch.cat([torch.full((bsz, 1), eos, dtype=torch.long), tgt[:, :-1]], dim=1)
    return src, torch.tensor(lengths), prev, tgt


def training_metrics(arch: str) -> dict:
    """The metrics a model of ``arch`` (built from ``TINY``) logs in one training
    forward pass of a random batch of two sentences (6 and 3 tokens)."""
    from fairseq.logging import metrics

    model, task = build_model(arch, TINY)
    model.train()
    src, lens, prev, _ = random_batch(task, [6, 3], seed=3)
    with metrics.aggregate(new_root=True) as agg:
        model(src, lens, prev)
    return agg.get_smoothed_values()


def copy_shared_weights(src_model, dst_model):
    """Load every parameter of src into dst that has the same name and shape."""
    dst_state = dst_model.state_dict()
    for name, value in src_model.state_dict().items():
        if name in dst_state and dst_state[name].shape == value.shape:
            dst_state[name] = value.clone()
    dst_model.load_state_dict(dst_state)


def command_line_error(arch: str, args: List[str], capsys) -> str:
    """Building ``arch`` from ``TINY + args`` fails as a command-line error does
    (argparse-style, exit status 2); returns what it wrote on stderr."""
    with pytest.raises(SystemExit) as exit_info:
        build_model(arch, TINY + list(args))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def check_equals_fairseq_transformer(ours, task, atol: float = 1e-6, rtol: float = 1e-5):
    """``ours`` (built from ``TINY``) has the parameters of fairseq's transformer built
    from ``TINY``, under the same names, and with its weights gives its outputs."""
    ref, _ = build_model("transformer", TINY)
    assert count_parameters(ours) == count_parameters(ref)
    assert set(ours.state_dict()) == set(ref.state_dict())
    ours.load_state_dict(ref.state_dict())
    src, lens, prev, _ = random_batch(task, [7, 4, 5])
    torch.testing.assert_close(ours(src, lens, prev)[0], ref(src, lens, prev)[0], atol=atol, rtol=rtol)


# ------------------------------------------------------------------ model contract
# The checks every model, variant and placement must pass (tests/test_contract.py uses
# them on trained checkpoints; the per-model tests on freshly built models).
def decoding_batch(task, lengths=(6, 3, 5), beam: int = 2, seed: int = 1):
    """Source sentences repeated ``beam`` times (as beam search holds them) and random
    target prefixes of one length (prefix 0 is end-of-sentence)."""
    src, lens, prev, _ = random_batch(task, list(lengths), seed=seed)
    src, lens = src.repeat_interleave(beam, 0), lens.repeat_interleave(beam, 0)
    g = torch.Generator().manual_seed(seed + 4)
    d = task.target_dictionary
    body = torch.randint(d.nspecial, len(d), (prev.size(0) * beam, prev.size(1) - 1), generator=g)
    prev = torch.cat([prev[:, :1].repeat_interleave(beam, 0), body], 1)
    return src, lens, prev


def check_incremental_equals_full(model, task, reorder_at: int = 2, atol: float = 1e-5, lengths=(6, 3, 5)):
    """Step-by-step decoding == one teacher-forced pass, with a beam-search reorder
    mid-sequence.

    Beam search only moves hypotheses within a sentence (fairseq's own encoder-decoder
    attention relies on that), so the batch is sentences x beam and the new order maps
    each row to a beam of the same sentence; rows are duplicated and swapped.
    """
    src, lens, prev = decoding_batch(task, lengths=lengths, beam=2)
    # 3 sentences x beam 2: a beam duplicated (rows 0, 1 <- 1), one swapped (2 <-> 3),
    # one kept twice (4, 5 <- 4)
    order = torch.tensor([1, 1, 3, 2, 4, 4])
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lens)
        full, _ = model.decoder(prev, encoder_out=enc)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(out)
            if t == reorder_at:
                model.decoder.reorder_incremental_state_scripting(state, order)
                enc = model.encoder.reorder_encoder_out(enc, order)
                prev, full = prev[order], full[order]
                steps = [s[order] for s in steps]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=atol, rtol=1e-4)


def check_batch_invariance(model, task, lengths=(4, 9, 7), atol: float = 1e-5):
    """Each sentence alone == the same sentence inside a batch with longer ones: the
    source left-padded (fairseq's default), the target right-padded, compared on the
    encoder states and the decoder's log-probabilities at every real position."""
    src, lens, _, tgt = random_batch(task, list(lengths), seed=2)
    d = task.target_dictionary
    # targets of different real lengths, right-padded as fairseq's collater does
    tgt_lens = [max(2, n - 1) for n in lengths]
    prev = torch.full((len(lengths), max(tgt_lens)), d.pad(), dtype=torch.long)
    for b, n in enumerate(tgt_lens):
        prev[b, 0] = d.eos()
        prev[b, 1:n] = tgt[b, : n - 1]
    with torch.no_grad():
        enc_batch = model.encoder(src, src_lengths=lens)
        dec_batch = model.get_normalized_probs(model.decoder(prev, encoder_out=enc_batch), log_probs=True)
        for b, (n, m) in enumerate(zip(lengths, tgt_lens)):
            alone_src, alone_prev = src[b : b + 1, src.size(1) - n :], prev[b : b + 1, :m]
            enc_alone = model.encoder(alone_src, src_lengths=lens[b : b + 1])
            torch.testing.assert_close(
                enc_batch["encoder_out"][0][src.size(1) - n :, b : b + 1], enc_alone["encoder_out"][0],
                atol=atol, rtol=1e-4,
            )
            dec_alone = model.get_normalized_probs(model.decoder(alone_prev, encoder_out=enc_alone), log_probs=True)
            torch.testing.assert_close(dec_batch[b : b + 1, :m], dec_alone, atol=atol, rtol=1e-4)


def check_generation_batch_invariance(model, task):
    """The first sentence of a batch with longer ones, encoded and beam-searched alone,
    gives the same encoder states, hypothesis and score as inside the batch."""
    from fairseq.sequence_generator import SequenceGenerator

    src, lens, _, _ = random_batch(task, [4, 9, 7], seed=2)
    alone_src = src[:1, -4:]
    with torch.no_grad():
        enc_batch = model.encoder(src, src_lengths=lens)["encoder_out"][0]
        enc_alone = model.encoder(alone_src, src_lengths=lens[:1])["encoder_out"][0]
        torch.testing.assert_close(enc_batch[-4:, :1], enc_alone, atol=1e-5, rtol=1e-4)

        gen = SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=8)
        hyp_batch = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lens}})[0][0]
        hyp_alone = gen.generate([model], {"net_input": {"src_tokens": alone_src, "src_lengths": lens[:1]}})[0][0]
    assert hyp_batch["tokens"].tolist() == hyp_alone["tokens"].tolist()
    assert math.isclose(hyp_batch["score"].item(), hyp_alone["score"].item(), rel_tol=1e-4, abs_tol=1e-5)


def loss_and_grads(model, task, dtype=torch.float32, lengths=(5, 8, 3)):
    """Forward and backward of the summed NLL on a padded batch in ``dtype`` (a copy
    of ``model`` in training mode): returns the log-probs and every gradient."""
    import copy

    m = copy.deepcopy(model).to(dtype).train()
    src, lens, prev, tgt = random_batch(task, list(lengths), seed=3)
    pad = task.target_dictionary.pad()
    prev[0, -2:], tgt[0, -2:] = pad, pad  # right padding in the target of sentence 0
    lprobs = m.get_normalized_probs(m(src, lens, prev), log_probs=True)
    nll = -lprobs.float().gather(-1, tgt.unsqueeze(-1)).squeeze(-1).masked_fill(tgt.eq(pad), 0.0).sum()
    nll.backward()
    grads = {name: p.grad for name, p in m.named_parameters() if p.requires_grad}
    return lprobs, grads


def check_finite(model, task, dtype):
    """Outputs and gradients are finite in ``dtype`` (padded rows included), and every
    trainable parameter gets a gradient."""
    lprobs, grads = loss_and_grads(model, task, dtype)
    assert bool(torch.isfinite(lprobs).all()), f"non-finite outputs in {dtype}"
    missing = [name for name, g in grads.items() if g is None]
    assert not missing, f"parameters without gradient in {dtype}: {missing[:5]}"
    bad = [name for name, g in grads.items() if not bool(torch.isfinite(g).all())]
    assert not bad, f"non-finite gradients in {dtype}: {bad[:5]}"


def _value_term_needs_eager(core) -> bool:
    """Shaw et al.'s value term runs on the eager path only while attention dropout is on."""
    rel = core.relative_positions
    return rel is not None and rel.value_embeddings is not None and core._dropout_active()


class attention_paths:
    """Context manager that records which path every attention core's branches took:
    ``paths["windows"]`` lists the calls whose branches took one product for all
    (:func:`~fairseq_localness.modules.kernels.choice.fused_windows`), ``paths["sdpa"]``
    / ``paths["eager"]`` list, per branch evaluated otherwise, whether that
    evaluation needs the eager path by design: the core has Shaw et al.'s value term
    (which only the eager path computes), or it is a one-branch core asked for its
    weights (fairseq's decoder asks its last layer's encoder-decoder attention for
    them, for alignments)."""

    def __enter__(self):
        from fairseq_localness.modules.attention import AttentionCore

        from fairseq_localness.modules import attention

        self.paths = {"sdpa": [], "eager": [], "windows": []}
        self._saved = (AttentionCore._sdpa, AttentionCore._eager_branch, AttentionCore._use_sdpa,
                       attention.fused_windows)
        sdpa, eager, use_sdpa, fused_windows = self._saved
        weights_asked = set()  # ids of the one-branch cores whose current call wants weights

        def spy_use_sdpa(core, query, need_weights, ctx):
            (weights_asked.add if need_weights and len(core.branches) == 1 else weights_asked.discard)(id(core))
            return use_sdpa(core, query, need_weights, ctx)

        def needs_eager(core) -> bool:
            return _value_term_needs_eager(core) or id(core) in weights_asked

        def spy_sdpa(core, *args, **kwargs):
            self.paths["sdpa"].append(needs_eager(core))
            return sdpa(core, *args, **kwargs)

        def spy_eager(core, *args, **kwargs):
            self.paths["eager"].append(needs_eager(core))
            return eager(core, *args, **kwargs)

        def spy_windows(*args, **kwargs):
            stacked = fused_windows(*args, **kwargs)
            if stacked is not None:
                self.paths["windows"].append(stacked.size(2))
            return stacked

        AttentionCore._sdpa, AttentionCore._eager_branch = spy_sdpa, spy_eager
        AttentionCore._use_sdpa = spy_use_sdpa
        attention.fused_windows = spy_windows
        return self.paths

    def __exit__(self, *exc):
        from fairseq_localness.modules import attention
        from fairseq_localness.modules.attention import AttentionCore

        (AttentionCore._sdpa, AttentionCore._eager_branch, AttentionCore._use_sdpa,
         attention.fused_windows) = self._saved
        return False


# Half precision: how far the fast path's gradients may be from the eager path's, per
# parameter tensor, as ||g_fast - g_eager|| / max(||g_eager||, 0.01 ||all eager grads||).
# The two paths round differently (SDPA keeps q k^T in float32 inside the kernel; the
# eager path rounds it to the input dtype before its float32 softmax), and in these
# tiny models a rounding difference can flip a ReLU unit of a feed-forward layer near 0,
# which moves that layer's gradient by a few percent: on fresh models the largest
# per-tensor difference was 0.063 (fp16) and 0.060 (bf16), always in an fc1; each path's
# own distance from a float64 run is of the same size. On the contract's checkpoints
# (tests/test_contract.py, 4 updates) bf16 reached 0.183, again in a decoder fc1. A
# dropped bias or a wrong mask moves the gradients of the tensors it feeds by O(1).
HALF_GRAD_TOL = {torch.float16: 0.25, torch.bfloat16: 0.25}


def check_fast_path_equals_eager(model, task, dtype=torch.float32):
    """The fast attention paths give what the eager reference gives: outputs and
    gradients, fp32 within 1e-5 (every element), half precision within its
    precision (outputs element-wise, 1e-2 in fp16 and 5e-2 in bf16; gradients per
    tensor in norm, :data:`HALF_GRAD_TOL`).

    Also checks that the comparison compares something: with ``"sdpa"`` every branch
    of every attention core took the fast path (SDPA), single- or multi-branch, in
    every dtype, except in cores with Shaw et al.'s value term (eager by design), and
    with ``"eager"`` none did. (``"auto"``, the default, differs from ``"sdpa"`` only
    on a CPU in float32: it keeps several branches on the eager path when they are
    trained with attention dropout or over few keys, and without gradients over few
    keys computes windows alone in one product.)"""
    from fairseq_localness.modules.attention import AttentionCore

    tol = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
           torch.float16: dict(atol=1e-2, rtol=1e-2)}[dtype]
    results, paths = {}, {}
    for impl in ("eager", "sdpa"):
        set_attention_impl(model, impl)
        with attention_paths() as paths[impl]:
            results[impl] = loss_and_grads(model, task, dtype)
    set_attention_impl(model, "auto")
    assert not paths["eager"]["sdpa"], "attention_impl='eager' took the fast path"
    assert all(paths["sdpa"]["eager"]), (
        f"{dtype}: {paths['sdpa']['eager'].count(False)} branch evaluations that need no distribution took the "
        f"eager path under attention_impl='sdpa'"
    )
    fast_cores = [m for m in model.modules() if isinstance(m, AttentionCore) and not _value_term_needs_eager(m)]
    assert bool(paths["sdpa"]["sdpa"]) == bool(fast_cores), f"{dtype}: no attention core took the fast path"
    (ref, ref_grads), (fast, fast_grads) = results["eager"], results["sdpa"]
    torch.testing.assert_close(fast.float(), ref.float(), **tol)
    names = [name for name, g in ref_grads.items() if g is not None]
    if dtype == torch.float32:
        for name in names:
            g = ref_grads[name]
            scale = max(1.0, g.float().abs().max().item())
            torch.testing.assert_close(fast_grads[name].float() / scale, g.float() / scale, **tol, msg=name)
        return
    total = torch.cat([ref_grads[n].double().flatten() for n in names]).norm()
    for name in names:
        g, f = ref_grads[name].double(), fast_grads[name].double()
        assert bool(torch.isfinite(f).all()), f"{dtype}: non-finite fast-path gradient of {name}"
        distance = ((f - g).norm() / torch.maximum(g.norm(), 0.01 * total)).item()
        assert distance <= HALF_GRAD_TOL[dtype], f"{dtype}: gradient of {name} differs by {distance:.3f} (relative norm)"
