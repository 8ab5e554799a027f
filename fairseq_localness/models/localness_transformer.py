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
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model
from fairseq.models.transformer import transformer_legacy as tl

from fairseq_localness.models._locality import (
    LayerSpec,
    LocalityOptions,
    LocalityTransformerModel,
    OptionError,
    default_layers,
    option_flag,
    parse_layers,
    register_presets,
    validate_gaussian_windows,
)
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.gaussian import WINDOW_STRATEGIES, GaussianLocalness
from fairseq_localness.modules.relative_position import RelativePositions


@dataclass
class LocalnessOptions(LocalityOptions):
    localness_encoder_layers: Optional[str] = field(
        default=None,
        metadata={"help": "encoder layers whose self-attention gets the Gaussian bias: "
                  "1-based list or ranges ('1-3', '1,2,4'), 'all' or 'none' "
                  "(default: the lowest three, 1-3, or every layer of a shallower encoder)"},
    )
    localness_decoder_layers: str = field(
        default="none", metadata={"help": "decoder layers whose self-attention gets the bias"}
    )
    localness_enc_dec_layers: str = field(
        default="none", metadata={"help": "decoder layers whose encoder-decoder attention gets the bias"}
    )
    localness_window: ChoiceEnum(WINDOW_STRATEGIES) = field(
        default="query",
        metadata={"help": "window strategy: fixed (D=--localness-fixed-window), layer (eq. 8), "
                  "query (eq. 9), head (eq. 11)"},
    )
    localness_fixed_window: float = field(default=10.0, metadata={"help": "D of the fixed strategy"})
    localness_head_window_max: float = field(default=50.0, metadata={"help": "N of the head strategy (eq. 11)"})
    localness_min_window: float = field(
        default=1.0, metadata={"help": "differentiable floor F on the learned window: D = F + (I - F) * "
                               "sigmoid(z); 0 gives Yang et al.'s eq. 6 exactly"}
    )
    localness_rel_pos: bool = field(
        default=False, metadata={"help": "add Shaw et al. (2018) relative positions to every self-attention"}
    )
    localness_rel_pos_k: int = field(default=16, metadata={"help": "relative position clipping distance k"})

    def encoder_layers(self, num_layers: int):
        """0-based encoder layers with the bias (the paper's Table 2 default: 1-3)."""
        spec = self.localness_encoder_layers
        if spec is None:
            spec = default_layers(3, num_layers)
        return parse_layers(spec, num_layers, "localness_encoder_layers")

    def validate(self, cfg):
        self.encoder_layers(cfg.encoder_layers)
        parse_layers(self.localness_decoder_layers, cfg.decoder_layers, "localness_decoder_layers")
        parse_layers(self.localness_enc_dec_layers, cfg.decoder_layers, "localness_enc_dec_layers")
        if self.localness_window not in WINDOW_STRATEGIES:
            raise OptionError(
                f"{option_flag('localness_window')} {self.localness_window!r}: unknown strategy; "
                f"allowed: {', '.join(WINDOW_STRATEGIES)}"
            )
        validate_gaussian_windows(self, "localness", self.localness_window)
        if self.localness_rel_pos_k < 1:
            raise OptionError(
                f"{option_flag('localness_rel_pos_k')} must be >= 1 (got {self.localness_rel_pos_k})"
            )

    def unused(self, cfg):
        out = []
        gaussian = (
            self.encoder_layers(cfg.encoder_layers)
            or parse_layers(self.localness_decoder_layers, cfg.decoder_layers, "localness_decoder_layers")
            or parse_layers(self.localness_enc_dec_layers, cfg.decoder_layers, "localness_enc_dec_layers")
        )
        window_options = ("localness_window", "localness_fixed_window", "localness_head_window_max",
                          "localness_min_window")
        if not gaussian:
            for name in window_options:
                if self.given(name):
                    out.append(
                        f"{option_flag(name)} has no effect: no layer has the Gaussian bias "
                        f"({option_flag('localness_encoder_layers')}, {option_flag('localness_decoder_layers')} "
                        f"and {option_flag('localness_enc_dec_layers')} select none)"
                    )
        else:
            for name, strategy in (("localness_fixed_window", "fixed"), ("localness_head_window_max", "head")):
                if self.given(name) and self.localness_window != strategy:
                    out.append(
                        f"{option_flag(name)} applies to {option_flag('localness_window')} {strategy} only "
                        f"(got {option_flag('localness_window')} {self.localness_window})"
                    )
            if self.given("localness_min_window") and self.localness_window == "fixed":
                out.append(
                    f"{option_flag('localness_min_window')} floors learned windows only; "
                    f"{option_flag('localness_window')} fixed uses {option_flag('localness_fixed_window')} as given"
                )
        if self.given("localness_rel_pos_k") and not self.localness_rel_pos:
            out.append(
                f"{option_flag('localness_rel_pos_k')} applies with {option_flag('localness_rel_pos')} only"
            )
        return out


def build_localness_attention(
    embed_dim, cfg, *, options: LocalnessOptions, kind: str, gaussian: bool, rel_pos: bool
) -> AttentionCore:
    """One attention sublayer. ``kind``: 'encoder_self', 'decoder_self' or 'enc_dec'."""
    heads = cfg.encoder.attention_heads if kind == "encoder_self" else cfg.decoder.attention_heads
    branches = None
    if gaussian:
        branches = [
            GaussianLocalness(
                embed_dim,
                heads,
                window=options.localness_window,
                fixed_window=options.localness_fixed_window,
                head_window_max=options.localness_head_window_max,
                min_window=options.localness_min_window,
            )
        ]
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
        rel_pos = options.localness_rel_pos
        build = partial(build_localness_attention, options=options)
        if side == "encoder":
            chosen = options.encoder_layers(cfg.encoder.layers)
            return [
                LayerSpec(
                    side,
                    i,
                    self_attention=partial(build, kind="encoder_self", gaussian=i in chosen, rel_pos=rel_pos)
                    if (i in chosen or rel_pos)
                    else None,
                )
                for i in range(cfg.encoder.layers)
            ]
        self_layers = parse_layers(options.localness_decoder_layers, cfg.decoder.layers, "localness_decoder_layers")
        cross_layers = parse_layers(options.localness_enc_dec_layers, cfg.decoder.layers, "localness_enc_dec_layers")
        return [
            LayerSpec(
                side,
                i,
                self_attention=partial(build, kind="decoder_self", gaussian=i in self_layers, rel_pos=rel_pos)
                if (i in self_layers or rel_pos)
                else None,
                encoder_attention=partial(build, kind="enc_dec", gaussian=True, rel_pos=False)
                if i in cross_layers
                else None,
            )
            for i in range(cfg.decoder.layers)
        ]


register_presets(
    "localness_transformer",
    {
        "": tl.base_architecture,
        "tiny": tl.tiny_architecture,
        "iwslt_de_en": tl.transformer_iwslt_de_en,
        "wmt_en_de": tl.transformer_wmt_en_de,
        "vaswani_wmt_en_de_big": tl.transformer_vaswani_wmt_en_de_big,
    },
)
