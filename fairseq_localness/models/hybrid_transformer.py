"""``hybrid_transformer``: local and global patterns fused by a gate (Xu et al. 2019),
with the locality baselines of the paper's Table 1 as selectable variants.

In the self-attention of the chosen layers (``--hybrid-encoder-layers``, default
``1-2``: "the lowest two layers of the encoder", section 4, or the one layer of a
one-layer encoder; ``--hybrid-decoder-layers``, default none) the attention becomes the ``--hybrid-variant`` (see
:mod:`fairseq_localness.modules.hybrid` for the equations):

================  =====================  ==============================================
variant           Table 1 row            attention of a chosen layer
================  =====================  ==============================================
``gate``          HYBRID (Gate)          ``(1-g_i) global_i + g_i local_i`` (eq. 1-5)
``concat``        HYBRID (Concate)       ``[global_i; local_i]`` projected to d
``local_pattern`` LOCAL_PATTERN          the band ``|i-j| <= m`` alone (eq. 1, 3)
``neighbor``      NEIGHBOR               Gaussian bias centred on i, learned window
``local_h``       LOCAL_H                Gaussian bias, predicted centre, D = 10
``local_s``       LOCAL_S                Gaussian bias of Yang et al. 2018 (eq. 9)
================  =====================  ==============================================

``--hybrid-window-m`` is m (default 1, "window size 3"); ``--hybrid-gate head`` gives
one gate per head instead of one per token. The three baselines are used alone in the
chosen layers, replacing the attention (the reading is explained in
:mod:`fairseq_localness.modules.hybrid`); they apply to the same layers as the hybrid,
so every row of Table 1 differs from the others in the attention only.

With ``--hybrid-encoder-layers none`` (and no decoder layers) the model is fairseq's
``transformer``: the same modules, parameters and outputs.

Presets: ``hybrid_transformer`` (base), ``hybrid_transformer_iwslt_de_en``,
``hybrid_transformer_wmt_en_de``, ``hybrid_transformer_vaswani_wmt_en_de_big`` and
``hybrid_transformer_tiny`` (for tests and the demo).
"""
from dataclasses import dataclass
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model

from fairseq_localness.models._locality import (
    GaussianWindowOptions, LocalityTransformerModel, OptionError, attention_heads, default_layers, option, option_flag,
    register_presets,
)
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.gaussian import GaussianWindows
from fairseq_localness.modules.hybrid import GATE_TYPES, NEIGHBOR_WINDOWS, VARIANTS, HybridSettings, hybrid_attention


@dataclass
class HybridOptions(GaussianWindowOptions):
    layer_option_prefix = "hybrid"
    gaussian_prefix = "hybrid"

    hybrid_variant: ChoiceEnum(tuple(VARIANTS)) = option(
        "gate",
        "the self-attention of the chosen layers (Xu et al. 2019, Table 1): gate (HYBRID (Gate), "
        "eq. 1-5), concat (HYBRID (Concate)), local_pattern (LOCAL_PATTERN, eq. 1, 3), neighbor "
        "(NEIGHBOR), local_h (LOCAL_H), local_s (LOCAL_S)",
    )
    hybrid_encoder_layers: Optional[str] = option(
        None,
        "encoder layers whose self-attention becomes the variant: 1-based list or ranges "
        "('1-2', '1,3'), 'all' or 'none'",
        default_text="1-2, the lowest two (section 4), or the one layer of a one-layer encoder",
    )
    hybrid_decoder_layers: str = option(
        "none", "decoder layers whose (causal) self-attention becomes the variant, same syntax"
    )
    hybrid_window_m: int = option(
        1,
        "m of eq. 3: the local band keeps |i - j| <= m, window size 2m+1 (the paper: m = 1; in the decoder "
        "i-m <= j <= i)",
        applies_to={"hybrid_variant": ("gate", "concat", "local_pattern")},
    )
    hybrid_gate: ChoiceEnum(GATE_TYPES) = option(
        "token",
        "the gate of eq. 5: token (one scalar per token) or head (one scalar per token and head)",
        applies_to={"hybrid_variant": ("gate",)},
    )
    hybrid_fixed_window: float = option(
        GaussianWindows.fixed_window,
        "Gaussian window D of LOCAL_H, used as given (Luong et al. 2015: 10; the floor "
        "--hybrid-min-window does not apply to it)",
        applies_to={"hybrid_variant": ("local_h",)},
    )
    hybrid_neighbor_window: ChoiceEnum(NEIGHBOR_WINDOWS) = option(
        "query",
        "how NEIGHBOR learns its window: query (predicted per query, Yang et al. eq. 9), layer "
        "(eq. 8) or head (one learned scalar per head, eq. 11)",
        applies_to={"hybrid_variant": ("neighbor",)},
    )
    hybrid_head_window_max: float = option(
        GaussianWindows.head_window_max,
        "N of the head window: D = F + (N - F) * sigmoid(z) (Yang et al. eq. 11 with the floor F); "
        "must be above --hybrid-min-window",
        applies_to={"hybrid_variant": ("neighbor",), "hybrid_neighbor_window": ("head",)},
    )
    hybrid_min_window: float = option(
        GaussianWindows.min_window,
        "differentiable floor F on the learned Gaussian windows: D = F + (max(I, F) - F) * "
        "sigmoid(z) (query, layer: Yang et al. eq. 6 with the floor, I = the number of keys) and "
        "D = F + (N - F) * sigmoid(z) (head); F = 0 gives the paper's equations exactly",
        applies_to={"hybrid_variant": ("neighbor", "local_s")},
    )

    def settings(self) -> HybridSettings:
        return HybridSettings(
            window_m=self.hybrid_window_m,
            gate=self.hybrid_gate,
            neighbor_window=self.hybrid_neighbor_window,
            windows=self.gaussian_windows(),
        )

    def layers_by_default(self, side: str, num_layers: int) -> str:
        """"The lowest two layers of the encoder" (section 4); no decoder layer."""
        return default_layers(2, num_layers) if side == "encoder" else "none"

    def validate(self, cfg):
        self.layers("encoder", cfg.encoder_layers)
        self.layers("decoder", cfg.decoder_layers)
        for name, allowed in (
            ("hybrid_variant", tuple(VARIANTS)),
            ("hybrid_gate", GATE_TYPES),
            ("hybrid_neighbor_window", NEIGHBOR_WINDOWS),
        ):
            if getattr(self, name) not in allowed:
                raise OptionError(
                    f"{option_flag(name)} {getattr(self, name)!r}: unknown value; allowed: {', '.join(allowed)}"
                )
        if not isinstance(self.hybrid_window_m, int) or self.hybrid_window_m < 0:
            raise OptionError(
                f"{option_flag('hybrid_window_m')} must be an integer >= 0 (got {self.hybrid_window_m!r})"
            )
        if self.hybrid_gate != "token" and self.hybrid_variant != "gate":
            raise OptionError(
                f"{option_flag('hybrid_gate')} {self.hybrid_gate} applies to {option_flag('hybrid_variant')} "
                f"gate only (got {option_flag('hybrid_variant')} {self.hybrid_variant})"
            )
        neighbor_head = self.hybrid_variant == "neighbor" and self.hybrid_neighbor_window == "head"
        self.validate_gaussian_windows("head" if neighbor_head else "query")

    def unused(self, cfg):
        if self.layers("encoder", cfg.encoder_layers) or self.layers("decoder", cfg.decoder_layers):
            return self.inapplicable()
        return [
            f"{option_flag(fld.name)} has no effect: {option_flag('hybrid_encoder_layers')} and "
            f"{option_flag('hybrid_decoder_layers')} select no layer"
            for fld in self.own_fields()
            if fld.name not in ("hybrid_encoder_layers", "hybrid_decoder_layers") and self.given(fld.name)
        ]


def build_hybrid_attention(embed_dim, cfg, *, options: HybridOptions, side: str) -> AttentionCore:
    """The self-attention of one chosen layer of ``side`` ('encoder' or 'decoder')."""
    return hybrid_attention(
        options.hybrid_variant,
        embed_dim,
        attention_heads(cfg, side),
        options.settings(),
        dropout=cfg.attention_dropout,
        self_attention=True,
        causal=side == "decoder",
    )


@register_model("hybrid_transformer")
class HybridTransformerModel(LocalityTransformerModel):
    """fairseq's transformer with hybrid local/global self-attention (Xu et al. 2019)."""

    options_class = HybridOptions
    self_attention_builder = staticmethod(build_hybrid_attention)


register_presets("hybrid_transformer")
