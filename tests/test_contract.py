"""The model contract: every registered model x every variant it offers x every
placement it supports, trained through fairseq-train and then checked.

Each case trains a tiny model for 4 updates through fairseq-train's own entry point
(``fairseq_cli.train``: the parser, ``call_main``, the trainer, checkpointing; run in
this process to save the ~5 s start-up of a new one) on a corpus built so that one of
its two batches has no padding on either side (4 pairs of equal lengths) and the other
is padded on both sides (the source on the left, the target on the right). On the
saved checkpoint it checks:

* incremental decoding == the full teacher-forced pass, with a beam-search reorder
  mid-decode;
* batch and padding invariance: each sentence alone == the same sentence inside a
  padded batch (encoder states and decoder log-probabilities);
* finite outputs and gradients, every parameter reached, in fp32, fp16 and bf16;
* the fast attention paths == the eager reference (fp32 within 1e-5; bf16 and fp16
  within their precision), outputs and gradients.

At sentences longer than 256 tokens (:func:`test_model_contract_at_long_lengths`, a
fresh tiny model per paper: the lengths where the fast paths use bands, the causal
kernel and recomputed biases), the same checks but the half precisions.

Placements: ``enc`` (encoder self-attention), ``dec`` (decoder self-attention),
``encdec`` (encoder-decoder attention, localness only: the other papers change
self-attention only), ``enc+dec`` (both self-attentions at once: relative positions,
which the model adds to every self-attention, and Full-DC).
"""
import os
from typing import Dict, List, NamedTuple

import pytest
import torch

from model_utils import (
    NO_DROPOUT,
    check_batch_invariance,
    check_fast_path_equals_eager,
    check_finite,
    check_incremental_equals_full,
    size_args,
)

MODEL_ARGS = size_args(2, 16, 32, 2) + NO_DROPOUT


class Case(NamedTuple):
    arch: str
    variant: str
    placement: str
    args: List[str]

    @property
    def id(self) -> str:
        return f"{self.arch.replace('_transformer', '')}-{self.variant}-{self.placement}"


def _localness_cases() -> List[Case]:
    placements = {
        "enc": ["--localness-encoder-layers", "all"],
        "dec": ["--localness-encoder-layers", "none", "--localness-decoder-layers", "all"],
        "encdec": ["--localness-encoder-layers", "none", "--localness-enc-dec-layers", "all"],
    }
    cases = [
        Case("localness_transformer", window, where, ["--localness-window", window] + args)
        for window in ("fixed", "layer", "query", "head")
        for where, args in placements.items()
    ]
    cases.append(Case("localness_transformer", "rel_pos", "enc+dec",
                      ["--localness-encoder-layers", "none", "--localness-rel-pos", "--localness-rel-pos-k", "2"]))
    cases.append(Case("localness_transformer", "query+rel_pos", "enc+dec",
                      ["--localness-decoder-layers", "all", "--localness-rel-pos", "--localness-rel-pos-k", "2"]))
    return cases


def _hybrid_cases() -> List[Case]:
    variants: Dict[str, List[str]] = {
        "gate": ["--hybrid-variant", "gate"],
        "gate_head": ["--hybrid-variant", "gate", "--hybrid-gate", "head"],
        "gate_m2": ["--hybrid-variant", "gate", "--hybrid-window-m", "2"],
        "concat": ["--hybrid-variant", "concat"],
        "local_pattern": ["--hybrid-variant", "local_pattern"],
        "neighbor_query": ["--hybrid-variant", "neighbor", "--hybrid-neighbor-window", "query"],
        "neighbor_layer": ["--hybrid-variant", "neighbor", "--hybrid-neighbor-window", "layer"],
        "neighbor_head": ["--hybrid-variant", "neighbor", "--hybrid-neighbor-window", "head"],
        "local_h": ["--hybrid-variant", "local_h"],
        "local_s": ["--hybrid-variant", "local_s"],
    }
    placements = {
        "enc": ["--hybrid-encoder-layers", "all"],
        "dec": ["--hybrid-encoder-layers", "none", "--hybrid-decoder-layers", "all"],
    }
    return [Case("hybrid_transformer", v, where, vargs + pargs)
            for v, vargs in variants.items() for where, pargs in placements.items()]


def _hysan_cases() -> List[Case]:
    enc_only = ["--hysan-decoder-layers", "none"]
    dec_only = ["--hysan-encoder-layers", "none"]
    cases = []
    for fusion in ("sum", "concat", "gated"):
        extra = ["--hysan-gate-reduction", "4"] if fusion == "gated" else []
        cases.append(Case("hysan_transformer", f"e1_{fusion}", "enc", ["--hysan-fusion", fusion] + extra + enc_only))
        cases.append(Case("hysan_transformer", f"e1_{fusion}", "dec", ["--hysan-fusion", fusion] + extra + dec_only))
    cases += [
        Case("hysan_transformer", "directions_sum", "enc",
             ["--hysan-encoder-branches", "forward,backward", "--hysan-fusion", "sum"] + enc_only),
        Case("hysan_transformer", "locals_concat", "enc",
             ["--hysan-encoder-branches", "global,local1,local2,local5", "--hysan-fusion", "concat"] + enc_only),
        Case("hysan_transformer", "forward_gated", "dec",
             ["--hysan-decoder-branches", "forward", "--hysan-gate-reduction", "4"] + dec_only),
        Case("hysan_transformer", "locals_concat", "dec",
             ["--hysan-decoder-branches", "forward,local1,local2,local5", "--hysan-fusion", "concat"] + dec_only),
    ]
    return cases


def _dc_cases() -> List[Case]:
    cases = [
        Case("dc_transformer", f"f{f}", where, ["--dc-mode", mode, "--dc-kernel-size", str(f)])
        for mode, where in (("enc", "enc"), ("dec", "dec"))
        for f in (1, 2, 3)
    ]
    cases.append(Case("dc_transformer", "f2", "enc+dec", ["--dc-mode", "full", "--dc-kernel-size", "2"]))
    cases.append(Case("dc_transformer", "f4", "enc+dec", ["--dc-mode", "full", "--dc-kernel-size", "4"]))
    return cases


CASES = _localness_cases() + _hybrid_cases() + _hysan_cases() + _dc_cases()


def test_the_matrix_covers_every_registered_model():
    from fairseq.models import MODEL_REGISTRY

    import fairseq_localness  # noqa: F401

    ours = {name for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_localness")}
    assert ours == {case.arch for case in CASES}
    assert len({case.id for case in CASES}) == len(CASES)


# --------------------------------------------------------------------------- data
VOCAB = [f"w{i}" for i in range(24)]
# (source length, target length) in words; the first four are equal (a batch without
# padding on either side), the last four all differ (a batch padded on both sides).
# fairseq orders by source length, then target length, and batches 4 in a row.
PAIR_LENGTHS = [(5, 5)] * 4 + [(7, 4), (8, 10), (9, 6), (11, 8)]


def _write_corpus(directory: str) -> None:
    g = torch.Generator().manual_seed(0)

    def sentence(n: int) -> str:
        return " ".join(VOCAB[i] for i in torch.randint(len(VOCAB), (n,), generator=g).tolist())

    src, tgt = zip(*[(sentence(s), sentence(t)) for s, t in PAIR_LENGTHS])
    for lang, lines in (("src", src), ("tgt", tgt)):
        with open(os.path.join(directory, f"train.{lang}"), "w") as f:
            f.write("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def contract_data(tmp_path_factory) -> str:
    from fairseq import options
    from fairseq_cli import preprocess

    base = tmp_path_factory.mktemp("contract")
    text, dest = str(base / "text"), str(base / "bin")
    os.makedirs(text)
    _write_corpus(text)
    parser = options.get_preprocessing_parser()
    args = parser.parse_args([
        "--source-lang", "src", "--target-lang", "tgt", "--trainpref", os.path.join(text, "train"),
        "--destdir", dest, "--joined-dictionary", "--workers", "1",
    ])
    preprocess.main(args)
    return dest


def test_the_corpus_gives_a_batch_without_and_a_batch_with_padding(contract_data):
    from fairseq import options, tasks

    import fairseq_localness  # noqa: F401

    args = options.parse_args_and_arch(options.get_training_parser(), _train_argv(
        contract_data, Case("localness_transformer", "query", "enc", []), "/tmp/unused"))
    task = tasks.setup_task(args)
    task.load_dataset("train")
    dataset = task.dataset("train")
    batches = list(task.get_batch_iterator(
        dataset, max_sentences=4, required_batch_size_multiple=1, seed=1).next_epoch_itr(shuffle=False))
    pad = task.source_dictionary.pad()
    padded = [(bool(b["net_input"]["src_tokens"].eq(pad).any()), bool(b["target"].eq(pad).any())) for b in batches]
    assert sorted(padded) == [(False, False), (True, True)]
    assert bool(batches[0]["net_input"]["src_tokens"][:, 0].eq(pad).any()) or bool(
        batches[1]["net_input"]["src_tokens"][:, 0].eq(pad).any())  # sources padded on the left


# --------------------------------------------------------------------------- training
def _train_argv(data: str, case: Case, save_dir: str) -> List[str]:
    return [
        data, "--task", "translation", "-s", "src", "-t", "tgt", "--arch", case.arch, *MODEL_ARGS, *case.args,
        "--optimizer", "adam", "--lr", "0.003", "--clip-norm", "1.0",
        "--batch-size", "4", "--required-batch-size-multiple", "1", "--max-epoch", "2",
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0",
        "--seed", "1", "--cpu", "--log-format", "simple", "--log-interval", "100", "--no-progress-bar",
    ]


def train_through_cli(data: str, case: Case, save_dir: str) -> str:
    """fairseq-train's entry point (``fairseq_cli.train.cli_main`` minus the process):
    parse, ``call_main``, train; returns the last checkpoint."""
    from fairseq import distributed_utils, options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import train

    args = options.parse_args_and_arch(options.get_training_parser(), _train_argv(data, case, save_dir))
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), train.main)
    path = os.path.join(save_dir, "checkpoint_last.pt")
    assert os.path.exists(path), f"fairseq-train wrote no checkpoint for {case.id}"
    return path


def load_trained(path: str):
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path])
    return models[0].eval(), task


def _half_precisions():
    return [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_model_contract(case, contract_data, tmp_path):
    torch.set_num_threads(1)
    model, task = load_trained(train_through_cli(contract_data, case, str(tmp_path / "ckpt")))
    assert task.source_dictionary.pad() == 1

    check_incremental_equals_full(model, task)
    check_batch_invariance(model, task)
    for dtype in [torch.float32] + _half_precisions():
        check_finite(model, task, dtype)
    for dtype in [torch.float32] + _half_precisions():
        check_fast_path_equals_eager(model, task, dtype)


# --------------------------------------------------------------------------- the checks can fail
def test_a_broken_cache_reorder_fails_the_contract(monkeypatch):
    """Beam reordering that forgets the attention cache is caught."""
    from fairseq_localness.modules.attention import AttentionCore
    from model_utils import build_model

    model, task = build_model("localness_transformer", MODEL_ARGS + ["--localness-decoder-layers", "all"])
    check_incremental_equals_full(model, task)
    monkeypatch.setattr(AttentionCore, "reorder_incremental_state", lambda self, state, order: state)
    with pytest.raises(AssertionError):
        check_incremental_equals_full(model, task)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_a_broken_causal_mask_fails_the_contract(monkeypatch, impl):
    """A decoder self-attention that can see the future is caught (teacher forcing sees
    later targets, incremental decoding cannot), on the eager path (the causal mask) and
    on the fast path (the CPU flash kernel's ``is_causal``)."""
    from fairseq_localness.modules import context
    from fairseq_localness.modules.attention import set_attention_impl
    from fairseq_localness.modules.kernels import sdpa
    from model_utils import build_model

    model, task = build_model("hybrid_transformer", MODEL_ARGS + ["--hybrid-encoder-layers", "none",
                                                                  "--hybrid-decoder-layers", "all"])
    set_attention_impl(model, impl)
    check_incremental_equals_full(model, task)
    monkeypatch.setattr(context, "causal_mask",
                        lambda tq, tk, device: torch.zeros(tq, tk, dtype=torch.bool, device=device))
    if sdpa.CPU_FLASH is not None:
        flash = sdpa.CPU_FLASH
        monkeypatch.setattr(sdpa, "CPU_FLASH",
                            lambda q, k, v, p, is_causal, **kw: flash(q, k, v, p, False, **kw))
    with pytest.raises(AssertionError):
        check_incremental_equals_full(model, task)


def test_a_mask_that_ignores_padding_fails_the_contract(monkeypatch):
    """Attention to padding keys breaks batch invariance."""
    from fairseq_localness.modules import attention
    from model_utils import build_model

    model, task = build_model("hysan_transformer", MODEL_ARGS + ["--hysan-gate-reduction", "4"])
    check_batch_invariance(model, task)
    original = attention.AttentionCore._base_mask

    def no_padding(self, ctx, attn_mask):
        ctx.key_padding_mask = None
        return original(self, ctx, attn_mask)

    monkeypatch.setattr(attention.AttentionCore, "_base_mask", no_padding)
    with pytest.raises(AssertionError):
        check_batch_invariance(model, task)


def test_a_fast_path_that_drops_the_bias_fails_the_contract(monkeypatch):
    """A fast path that differs from the eager reference is caught."""
    from fairseq_localness.modules.attention import AttentionCore
    from fairseq_localness.modules.context import AttentionBranch
    from model_utils import build_model

    model, task = build_model("localness_transformer", MODEL_ARGS)
    check_fast_path_equals_eager(model, task)
    original = AttentionCore._sdpa

    def without_bias(self, ctx, v, branch, base_blocked, soft_bias):
        return original(self, ctx, v, AttentionBranch(), base_blocked, soft_bias)

    monkeypatch.setattr(AttentionCore, "_sdpa", without_bias)
    with pytest.raises(AssertionError):
        check_fast_path_equals_eager(model, task)


# --------------------------------------------------------------------------- long sentences
LONG = (300, 140, 290)  # above 256: the bands, causal kernels and recomputed biases at length
LONG_CASES = {
    "hysan-e1_gated": ("hysan_transformer", ["--hysan-gate-reduction", "4"]),
    "hybrid-gate-enc+dec": ("hybrid_transformer", ["--hybrid-encoder-layers", "all", "--hybrid-decoder-layers", "all"]),
    "localness-query-enc+dec": ("localness_transformer", ["--localness-decoder-layers", "all"]),
    "localness-rel_pos-enc+dec": ("localness_transformer", ["--localness-rel-pos", "--localness-rel-pos-k", "4"]),
}


@pytest.mark.parametrize("name", list(LONG_CASES))
def test_model_contract_at_long_lengths(name):
    """At sentences of 140-300 tokens (a fresh tiny model): the fast paths == the eager
    reference (log-probabilities and every gradient, training mode), batch and padding
    invariance, and incremental decoding == the full pass over a 300-token prefix."""
    from model_utils import build_model, loss_and_grads

    from fairseq_localness.modules.attention import set_attention_impl

    torch.set_num_threads(1)
    arch, args = LONG_CASES[name]
    model, task = build_model(arch, MODEL_ARGS + args)
    results = {}
    for impl in ("eager", "sdpa"):
        set_attention_impl(model, impl)
        results[impl] = loss_and_grads(model, task, lengths=LONG)
    set_attention_impl(model, "auto")
    (ref, ref_grads), (fast, fast_grads) = results["eager"], results["sdpa"]
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)
    scale = max(1.0, max(g.abs().max().item() for g in ref_grads.values() if g is not None))
    for key, g in ref_grads.items():
        if g is not None:
            torch.testing.assert_close(fast_grads[key] / scale, g / scale, atol=1e-5, rtol=1e-4, msg=key)

    check_batch_invariance(model, task, lengths=LONG)

    check_incremental_equals_full(model, task, lengths=LONG)
