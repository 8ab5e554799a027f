"""One incremental decoder step costs what one new token costs.

Counted, not timed: ``torch.utils.flop_counter.FlopCounterMode`` (with the CPU kernels
of ``scaled_dot_product_attention``, as the benchmark counts them) over one decoder
step after a prefix of 8 and of 64 target tokens, for every decoder-side variant and
fairseq's transformer. Between the two:

* the FLOPs of everything but the attention's two products (linear maps, the DC
  convolution as a matrix product, the Gaussian predictors, Shaw et al.'s
  ``q W^K`` and bucketed ``W^V`` products: ``mm``/``addmm``/convolutions) do not change
  at all: nothing is recomputed over the prefix;
* the total grows by at most what ``q k^T`` and ``p v`` over 56 more keys add: per
  self-attention distribution ``2 x 2 B H Dh x 56`` FLOPs (a multiply-add is 2 FLOPs),
  where a core with L branches may compute L distributions (one SDPA call each).

The checks are shown to fail on a Local Context Unit that re-convolves the whole
prefix and on an attention core that re-projects every cached key.
"""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from fairseq_localness.cli.benchmark import flop_counter
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.dual_context import LocalContextUnit
from model_utils import NO_DROPOUT, build_model, random_batch, size_args

pytestmark = pytest.mark.usefixtures("one_thread")

# two layers of width 16 (one on the encoder side), no dropout
ARGS = size_args(2, 16, 32, 2) + ["--encoder-layers", "1"] + NO_DROPOUT
VARIANTS = {
    "transformer": ("transformer", []),
    "localness-dec": ("localness_transformer", ["--localness-encoder-layers", "none",
                                                "--localness-decoder-layers", "all"]),
    "localness-layer-dec": ("localness_transformer", ["--localness-encoder-layers", "none",
                                                      "--localness-decoder-layers", "all",
                                                      "--localness-window", "layer"]),
    "localness-rel_pos": ("localness_transformer", ["--localness-encoder-layers", "none", "--localness-rel-pos",
                                                    "--localness-rel-pos-k", "4"]),
    "hybrid-dec": ("hybrid_transformer", ["--hybrid-encoder-layers", "none", "--hybrid-decoder-layers", "all"]),
    "hysan-dec": ("hysan_transformer", ["--hysan-encoder-layers", "none", "--hysan-gate-reduction", "4",
                                        "--hysan-decoder-branches", "forward,local1,local3"]),
    "dec-dc": ("dc_transformer", ["--dc-mode", "dec"]),
    "full-dc": ("dc_transformer", ["--dc-mode", "full", "--dc-kernel-size", "3"]),
}
SHORT, LONG = 8, 64
ATTENTION_OPS = ("bmm", "baddbmm", "scaled_dot_product")  # q k^T and p v (also inside SDPA)


def _is_attention_op(op) -> bool:
    return any(name in str(op) for name in ATTENTION_OPS)


def step_flops(model, task, prefix_lengths=(SHORT, LONG)):
    """FLOPs by op of the decoder step that sees ``n`` target tokens, for each n:
    ``{n: {op: flops}}``; one incremental decode of 3 sentences, left-padded sources."""
    src, lens, _, _ = random_batch(task, [6, 4, 5], seed=0)
    g = torch.Generator().manual_seed(1)
    d = task.target_dictionary
    tokens = torch.randint(d.nspecial, len(d), (src.size(0), max(prefix_lengths)), generator=g)
    tokens[:, 0] = d.eos()
    counts, state = {}, {}
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lens)
        for n in range(1, max(prefix_lengths) + 1):
            if n in prefix_lengths:
                with flop_counter() as counter:
                    model.decoder(tokens[:, :n], encoder_out=enc, incremental_state=state)
                counts[n] = dict(counter.get_flop_counts()["Global"])
            else:
                model.decoder(tokens[:, :n], encoder_out=enc, incremental_state=state)
    return counts


def attention_allowance(model, bsz: int, extra_keys: int) -> int:
    """What ``q k^T`` and ``p v`` of one query row over ``extra_keys`` more keys add in
    every decoder attention whose keys grow: 2 products x 2 FLOPs x B x H x Dh per key,
    once per distribution (one per branch of an :class:`AttentionCore`)."""
    total = 0
    for module in model.decoder.modules():
        if isinstance(module, AttentionCore) and module.causal:
            distributions, heads, head_dim = len(module.branches), module.num_heads, module.head_dim
        elif isinstance(module, MultiheadAttention) and module.self_attention:
            distributions, heads, head_dim = 1, module.num_heads, module.head_dim
        else:
            continue  # encoder-decoder attention: its keys do not grow
        total += distributions * 2 * 2 * bsz * heads * head_dim * extra_keys
    return total


def check_step_cost(model, task):
    counts = step_flops(model, task)
    short, long = counts[SHORT], counts[LONG]

    def non_attention(c):
        return {str(op): n for op, n in c.items() if not _is_attention_op(op)}

    assert non_attention(long) == non_attention(short), (
        f"FLOPs outside the attention products grow with the prefix: {non_attention(short)} at {SHORT} "
        f"tokens, {non_attention(long)} at {LONG}"
    )
    growth = sum(long.values()) - sum(short.values())
    allowance = attention_allowance(model, 3, LONG - SHORT)
    assert 0 < growth <= allowance, f"one step grew by {growth} FLOPs from {SHORT} to {LONG} tokens " \
                                    f"(allowed: {allowance}, the attention products over the new keys)"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_an_incremental_step_costs_one_token(variant):
    """The default paths (SDPA where it applies; the eager path for Shaw et al.'s
    relative positions, whose value term needs the distribution)."""
    arch, args = VARIANTS[variant]
    model, task = build_model(arch, ARGS + args)
    check_step_cost(model, task)


# --------------------------------------------------------------------------- the check can fail
def _reconvolving(original):
    """A Local Context Unit whose cache keeps every input and convolves all of them at
    every step (same outputs, cost growing with the prefix)."""

    def convolve(self, r, padding_mask=None, incremental_state=None):
        if incremental_state is None:
            return original(self, r, padding_mask)
        buffer = self._get_input_buffer(incremental_state)
        history = r if buffer.get("history") is None else torch.cat([buffer["history"], r], 0)
        buffer["history"] = history
        self._set_input_buffer(incremental_state, buffer)
        return original(self, history, None)[-r.size(0):]

    return convolve


def _reprojecting(original):
    """An attention core that keeps its self-attention inputs and projects all of them
    again at every step."""

    def project(self, query, key, value, key_padding_mask, incremental_state, static_kv, projections=None):
        if incremental_state is None or not self.self_attention:
            return original(self, query, key, value, key_padding_mask, incremental_state, static_kv, projections)
        buffer = self._get_input_buffer(incremental_state)
        history = query if buffer.get("history") is None else torch.cat([buffer["history"], query], 0)
        buffer["history"] = history
        self._set_input_buffer(incremental_state, buffer)
        q, k, v, kpm = original(self, history, history, history, None, None, False)
        return q[:, :, -query.size(0):], k, v, kpm

    return project


@pytest.mark.parametrize("broken", ["dc_convolution", "attention_projection"])
def test_a_step_that_recomputes_the_prefix_fails_the_check(broken, monkeypatch):
    if broken == "dc_convolution":
        variant = "dec-dc"
        monkeypatch.setattr(LocalContextUnit, "convolve", _reconvolving(LocalContextUnit.convolve))
    else:
        variant = "localness-rel_pos"
        monkeypatch.setattr(AttentionCore, "_project", _reprojecting(AttentionCore._project))
    arch, args = VARIANTS[variant]
    model, task = build_model(arch, ARGS + args)
    # the broken cache still decodes correctly: only its cost gives it away
    src, lens, prev, _ = random_batch(task, [6, 4, 5], seed=0)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lens)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
                 for t in range(prev.size(1))]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    with pytest.raises(AssertionError, match="grow"):
        check_step_cost(model, task)
