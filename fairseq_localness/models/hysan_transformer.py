"""``hysan_transformer``: the Hybrid Self-Attention Network (Song et al. 2019).

Every chosen self-attention sublayer becomes a HySAN sublayer
(:mod:`fairseq_localness.modules.hysan`): one ``q k^T`` shared by several masked
branches (global, forward, backward, local k; eq. 8-12), fused by sum, concatenation
or the squeeze-gated sum (eq. 13-14). Encoder-decoder attention stays fairseq's.

Options (all prefixed ``--hysan-``):

* ``--hysan-encoder-branches`` (default ``global,forward,backward,local1``) and
  ``--hysan-decoder-branches`` (default ``forward,local1``): comma-separated branch
  names, any subset of Table 1's columns; ``local<k>`` for any k >= 1, several widths
  at once allowed (``local1,local2,local5``). The decoder takes only causal branches
  (``forward``, ``local<k>``).
* ``--hysan-fusion`` ``sum|concat|gated`` (default ``gated``; Table 2).
* ``--hysan-gate-reduction`` r (default 16), must divide the model dimension.
* ``--hysan-gate-bias``: biases in the squeeze gate (off, as the paper's counts imply).
* ``--hysan-encoder-layers`` / ``--hysan-decoder-layers`` (default ``all``): 1-based
  layer lists or ranges, ``all`` or ``none``; the other layers keep fairseq's
  attention.

The defaults are the paper's "e1" setting with gated sum, in every layer
(docs/hysan_transformer.md: Table 2's parameter counts pin it). "NoPos" is fairseq's ``--no-token-positional-embeddings``.

With ``--hysan-encoder-branches global --hysan-decoder-branches forward
--hysan-fusion sum`` (or both layer lists ``none``) the model computes exactly what
fairseq's ``transformer`` computes, with the same parameters.

Presets: ``hysan_transformer`` (base), ``hysan_transformer_tiny`` (tests and demo),
``hysan_transformer_iwslt_de_en``, ``hysan_transformer_wmt_en_de``,
``hysan_transformer_vaswani_wmt_en_de_big`` and ``hysan_transformer_iwslt_small``
(the paper's IWSLT14 setting: 2 + 2 layers, d = 256, 4 heads, FFN 1024).
"""
from dataclasses import dataclass
from typing import List

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model

from fairseq_localness.models._locality import (
    LocalityOptions, LocalityTransformerModel, OptionError, attention_heads, option, option_flag, register_presets,
    transformer_small,
)
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.hysan import (
    FUSIONS, branch_names, build_fusion, fixed_branches, local_width, make_branch,
)

# Why the decoder refuses the encoder-only branches.
_DECODER_REFUSALS = {
    "backward": "it attends to future target tokens; the paper applies the directional "
    "branches to the encoder only",
    "global": "decoder self-attention is causal, so 'global' would be the same distribution "
    "as 'forward' (the vanilla decoder self-attention); use 'forward'",
}


@dataclass
class HysanOptions(LocalityOptions):
    layer_option_prefix = "hysan"

    hysan_encoder_branches: str = option(
        "global,forward,backward,local1",
        "branches of the encoder self-attention (eq. 8-12), comma-separated: global, forward, "
        "backward, local<k> (|i - j| <= k, k >= 1, several widths allowed)",
        scope="the layers of --hysan-encoder-layers",
    )
    hysan_decoder_branches: str = option(
        "forward,local1",
        "branches of the decoder self-attention, causal only: forward, local<k> (i - k <= j <= i)",
        scope="the layers of --hysan-decoder-layers",
    )
    hysan_fusion: ChoiceEnum(FUSIONS) = option(
        "gated",
        "fusion of the branch outputs (eq. 13-14, Table 2): sum, concat (projected back to d) or "
        "gated (squeeze gate)",
    )
    hysan_gate_reduction: int = option(
        16,
        "reduction r of the squeeze gate (d -> d/r -> d); must divide the embedding size",
        applies_to={"hysan_fusion": ("gated",)},
    )
    hysan_gate_bias: bool = option(
        False,
        "give the squeeze gate's two linear maps biases (off: the paper's parameter counts)",
        applies_to={"hysan_fusion": ("gated",)},
    )
    hysan_encoder_layers: str = option(
        "all",
        "encoder layers with HySAN self-attention: 1-based list or ranges ('1-3', '1,2'), 'all' "
        "or 'none'",
    )
    hysan_decoder_layers: str = option("all", "decoder layers with HySAN self-attention, same syntax")

    def branches(self, side: str) -> List[str]:
        """The validated branch names of ``side``."""
        option = f"hysan_{side}_branches"
        spec = getattr(self, option)
        flag = option_flag(option)
        names = [part.strip().lower() for part in str(spec or "").split(",") if part.strip()]
        allowed = ", ".join(branch_names(side))
        if not names:
            raise OptionError(
                f"{flag} {spec!r}: give at least one branch (allowed: {allowed}); to keep "
                f"fairseq's attention on this side use {option_flag(f'hysan_{side}_layers')} none"
            )
        for name in names:
            width = local_width(name)
            if side == "decoder" and name in _DECODER_REFUSALS:
                raise OptionError(
                    f"{flag}: {name!r} is not allowed in the decoder: {_DECODER_REFUSALS[name]} "
                    f"(allowed: {allowed})"
                )
            if name not in fixed_branches(side) and width is None:
                raise OptionError(f"{flag}: unknown branch {name!r} (allowed: {allowed})")
            if width is not None and width < 1:
                raise OptionError(
                    f"{flag}: {name!r}: the local width k must be an integer >= 1 (e.g. local1, local2, local5)"
                )
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise OptionError(f"{flag} {spec!r}: branch listed more than once: {', '.join(duplicates)}")
        return names

    def validate(self, cfg):
        for side in ("encoder", "decoder"):
            self.branches(side)
            self.layers(side, getattr(cfg, f"{side}_layers"))
        if self.hysan_fusion not in FUSIONS:
            raise OptionError(
                f"{option_flag('hysan_fusion')} {self.hysan_fusion!r}: unknown fusion; allowed: {', '.join(FUSIONS)}"
            )
        r = self.hysan_gate_reduction
        if self.hysan_fusion == "gated":
            for side in ("encoder", "decoder"):
                dim = getattr(cfg, f"{side}_embed_dim")
                if r < 1 or dim % r != 0:
                    divisors = [x for x in (1, 2, 4, 8, 16, 32, 64) if dim % x == 0]
                    raise OptionError(
                        f"{option_flag('hysan_gate_reduction')} {r}: must be a positive divisor of "
                        f"--{side}-embed-dim {dim} (e.g. {', '.join(map(str, divisors))})"
                    )

    def unused(self, cfg):
        out = []
        sides = [side for side in ("encoder", "decoder") if self.layers(side, getattr(cfg, f"{side}_layers"))]
        for side in ("encoder", "decoder"):
            if side not in sides and self.given(f"hysan_{side}_branches"):
                out.append(
                    f"{option_flag(f'hysan_{side}_branches')} has no effect: "
                    f"{option_flag(f'hysan_{side}_layers')} selects no layer"
                )
        if not sides:
            for name in ("hysan_fusion", "hysan_gate_reduction", "hysan_gate_bias"):
                if self.given(name):
                    out.append(
                        f"{option_flag(name)} has no effect: {option_flag('hysan_encoder_layers')} and "
                        f"{option_flag('hysan_decoder_layers')} select no layer"
                    )
        else:
            out += self.inapplicable()
        return out


def build_hysan_attention(embed_dim, cfg, *, options: HysanOptions, side: str) -> AttentionCore:
    """One HySAN self-attention sublayer of ``side`` ("encoder" or "decoder")."""
    names = options.branches(side)
    fusion = build_fusion(
        options.hysan_fusion,
        embed_dim,
        names,
        reduction=options.hysan_gate_reduction,
        gate_bias=options.hysan_gate_bias,
    )
    return AttentionCore(
        embed_dim,
        attention_heads(cfg, side),
        dropout=cfg.attention_dropout,
        self_attention=True,
        causal=side == "decoder",
        branches=[make_branch(name, side) for name in names],
        fusion=fusion,
    )


@register_model("hysan_transformer")
class HysanTransformerModel(LocalityTransformerModel):
    """fairseq's transformer with Hybrid Self-Attention Network sublayers (Song et al. 2019)."""

    options_class = HysanOptions
    self_attention_builder = staticmethod(build_hysan_attention)


# The paper's IWSLT14 De-En setting (tensor2tensor's ``transformer_small``): 2 + 2
# layers, d = 256, 4 heads, FFN 1024. With a 32K joint vocabulary and
# ``--share-all-embeddings`` the vanilla model has the paper's 11.9M parameters.
register_presets("hysan_transformer", {"iwslt_small": transformer_small(layers=2)})
