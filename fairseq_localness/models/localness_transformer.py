"""``localness_transformer``: a learned Gaussian localness bias (Yang et al. 2018),
optionally with Shaw et al. (2018) relative position representations.

The Gaussian bias (:class:`~fairseq_localness.modules.gaussian.GaussianLocalness`,
eq. 4-11 of the paper) is added to the energies of the chosen attention sublayers:

* encoder self-attention of ``--localness-encoder-layers`` (default ``1-3``, the
  paper's Table 2 choice; every layer of an encoder with fewer than three),
* decoder self-attention of ``--localness-decoder-layers`` (Table 3, "Dec"),
* encoder-decoder attention of ``--localness-enc-dec-layers`` (Table 3, "Enc-Dec").

``--localness-rel-pos`` adds relative position representations (clipping distance
``--localness-rel-pos-k``, default 16, keys and values) to every self-attention
sublayer of the encoder and the decoder, as in Shaw et al. (2018) and Yang et al.'s
Table 4 "+ Rel_Pos"; it combines with the localness bias.

With every layer list empty and relative positions off, the model is fairseq's
``transformer``: the same modules, parameters and outputs.

Presets: ``localness_transformer`` (base), ``localness_transformer_iwslt_de_en``,
``localness_transformer_wmt_en_de``, ``localness_transformer_vaswani_wmt_en_de_big``
and ``localness_transformer_tiny`` (for tests and the demo).
"""
from dataclasses import dataclass
from functools import partial
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model

from fairseq_localness.models._locality import (
    GaussianWindowOptions, LayerSpec, LocalityTransformerModel, OptionError, attention_heads, default_layers, option,
    option_flag, parse_layers, register_presets,
)
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.gaussian import WINDOW_STRATEGIES, GaussianWindows
from fairseq_localness.modules.relative_position import RelativePositions


@dataclass
class LocalnessOptions(GaussianWindowOptions):
    layer_option_prefix = "localness"
    gaussian_prefix = "localness"

    localness_encoder_layers: Optional[str] = option(
        None,
        "encoder layers whose self-attention gets the Gaussian bias (eq. 4): 1-based list or "
        "ranges ('1-3', '1,2,4'), 'all' or 'none'",
        default_text="1-3, the lowest three (Table 2), or every layer of a shallower encoder",
    )
    localness_decoder_layers: str = option(
        "none",
        "decoder layers whose (causal) self-attention gets the Gaussian bias (Table 3, Dec), "
        "same syntax",
    )
    localness_enc_dec_layers: str = option(
        "none",
        "decoder layers whose encoder-decoder attention gets the Gaussian bias (Table 3, Enc-Dec), "
        "same syntax",
    )
    localness_window: ChoiceEnum(WINDOW_STRATEGIES) = option(
        "query",
        "window size strategy of every Gaussian bias: fixed (D = --localness-fixed-window), "
        "layer (eq. 8), query (eq. 9), head (eq. 11)",
        scope="the layers with the Gaussian bias",
    )
    localness_fixed_window: float = option(
        GaussianWindows.fixed_window,
        "the window D of the fixed strategy, used as given (any finite D > 0; the floor "
        "--localness-min-window does not apply to it)",
        applies_to={"localness_window": ("fixed",)},
    )
    localness_head_window_max: float = option(
        GaussianWindows.head_window_max,
        "N of the head strategy: D = F + (N - F) * sigmoid(z) (eq. 11 with the floor F); "
        "must be above --localness-min-window",
        applies_to={"localness_window": ("head",)},
    )
    localness_min_window: float = option(
        GaussianWindows.min_window,
        "differentiable floor F on the learned windows: D = F + (max(I, F) - F) * sigmoid(z) "
        "(layer, query: eq. 6 with the floor, I = the number of keys) and D = F + (N - F) * "
        "sigmoid(z) (head, eq. 11); F = 0 gives the paper's equations exactly",
        applies_to={"localness_window": ("layer", "query", "head")},
        unused_message="{flag} floors learned windows only; --localness-window fixed uses "
        "--localness-fixed-window as given",
    )
    localness_rel_pos: bool = option(
        False,
        "add Shaw et al. (2018) relative position representations (keys and values) to every "
        "self-attention of the encoder and the decoder (Table 4, + Rel_Pos)",
    )
    localness_rel_pos_k: int = option(
        16,
        "clipping distance k of the relative positions (2k+1 embeddings for keys and for values)",
        applies_to={"localness_rel_pos": (True,)},
    )

    def layers_by_default(self, side: str, num_layers: int) -> str:
        """The encoder's lowest three layers (the paper's Table 2 choice)."""
        return default_layers(3, num_layers) if side == "encoder" else "none"

    def enc_dec_layers(self, num_layers: int):
        """0-based decoder layers whose encoder-decoder attention gets the bias."""
        return parse_layers(self.localness_enc_dec_layers, num_layers, "localness_enc_dec_layers")

    def validate(self, cfg):
        self.layers("encoder", cfg.encoder_layers)
        self.layers("decoder", cfg.decoder_layers)
        self.enc_dec_layers(cfg.decoder_layers)
        if self.localness_window not in WINDOW_STRATEGIES:
            raise OptionError(
                f"{option_flag('localness_window')} {self.localness_window!r}: unknown strategy; "
                f"allowed: {', '.join(WINDOW_STRATEGIES)}"
            )
        self.validate_gaussian_windows(self.localness_window)
        if self.localness_rel_pos_k < 1:
            raise OptionError(
                f"{option_flag('localness_rel_pos_k')} must be >= 1 (got {self.localness_rel_pos_k})"
            )

    def unused(self, cfg):
        gaussian = (
            self.layers("encoder", cfg.encoder_layers)
            or self.layers("decoder", cfg.decoder_layers)
            or self.enc_dec_layers(cfg.decoder_layers)
        )
        if gaussian:
            return self.inapplicable()
        window_options = ("localness_window", "localness_fixed_window", "localness_head_window_max",
                          "localness_min_window")
        out = [
            f"{option_flag(name)} has no effect: no layer has the Gaussian bias "
            f"({option_flag('localness_encoder_layers')}, {option_flag('localness_decoder_layers')} "
            f"and {option_flag('localness_enc_dec_layers')} select none)"
            for name in window_options
            if self.given(name)
        ]
        return out + self.inapplicable(["localness_rel_pos_k"])


def build_localness_attention(
    embed_dim, cfg, *, options: LocalnessOptions, kind: str, gaussian: bool, rel_pos: bool
) -> AttentionCore:
    """One attention sublayer. ``kind``: 'encoder_self', 'decoder_self' or 'enc_dec'."""
    heads = attention_heads(cfg, "encoder" if kind == "encoder_self" else "decoder")
    branches = None
    if gaussian:
        branches = [options.gaussian_windows().branch(embed_dim, heads, window=options.localness_window)]
    return AttentionCore(
        embed_dim,
        heads,
        kdim=cfg.encoder.embed_dim if kind == "enc_dec" else None,
        vdim=cfg.encoder.embed_dim if kind == "enc_dec" else None,
        dropout=cfg.attention_dropout,
        self_attention=kind != "enc_dec",
        encoder_decoder_attention=kind == "enc_dec",
        causal=kind == "decoder_self",
        branches=branches,
        relative_positions=RelativePositions(embed_dim // heads, options.localness_rel_pos_k) if rel_pos else None,
    )


@register_model("localness_transformer")
class LocalnessTransformerModel(LocalityTransformerModel):
    """fairseq's transformer with a learned Gaussian localness bias (Yang et al. 2018)."""

    options_class = LocalnessOptions

    @classmethod
    def layer_specs(cls, options: LocalnessOptions, cfg, side: str):
        """The Gaussian bias in the self-attention of ``options.layers(side)`` and in the
        encoder-decoder attention of ``--localness-enc-dec-layers``; with
        ``--localness-rel-pos`` relative positions in every self-attention."""
        num_layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
        rel_pos = options.localness_rel_pos
        build = partial(build_localness_attention, options=options)
        kind = "encoder_self" if side == "encoder" else "decoder_self"
        gaussian = options.layers(side, num_layers)
        cross = options.enc_dec_layers(num_layers) if side == "decoder" else []
        return [
            LayerSpec(
                side,
                i,
                self_attention=partial(build, kind=kind, gaussian=i in gaussian, rel_pos=rel_pos)
                if (i in gaussian or rel_pos)
                else None,
                encoder_attention=partial(build, kind="enc_dec", gaussian=True, rel_pos=False) if i in cross else None,
            )
            for i in range(num_layers)
        ]


register_presets("localness_transformer")
