"""``dc_transformer``: the Dual Contextual module (Ampomah et al. 2021) in place
of the self-attention sublayer of chosen encoder and/or decoder layers.

:class:`~fairseq_localness.modules.dual_context.DualContextModule` (eq. 6-9: a Local
Context Unit, two FI attention units without output projection, an aggregation
``[h_l; h_g] W_z + b_z``) is built as the layer's ``self_attn``; fairseq's layer supplies
the dropout, residual and LayerNorm of eq. 9 around it (see that module's docstring for
why this is exactly eq. 9 and how pre-norm reads).

* ``--dc-mode``: ``enc`` (Enc-DC, the default and the paper's recommendation),
  ``dec`` (Dec-DC), ``full`` (Full-DC), ``none`` (fairseq's transformer).
* ``--dc-encoder-layers`` / ``--dc-decoder-layers``: 1-based layers of the sides the
  mode selects (default: all of them), e.g. ``--dc-encoder-layers 1-2`` for Table 5
  row 3. Giving a range for a side the mode leaves alone is an error.
* ``--dc-kernel-size``: f of the convolution (default 2, Sect. 5.2).
* ``--dc-log-divergence``: log the per-layer JS divergence between the two FI units
  (eq. 10-11) as ``enc<l>_js`` / ``dec<l>_self_js`` during validation.

Presets: ``dc_transformer`` (base), ``dc_transformer_tiny``,
``dc_transformer_iwslt_de_en``, ``dc_transformer_wmt_en_de``,
``dc_transformer_vaswani_wmt_en_de_big`` and ``dc_transformer_iwslt_small`` (the paper's
IWSLT setting, Sect. 5.2: 4+4 layers, d = 256, 4 heads; the paper does not give the
feed-forward size, we use 1024 = 4d, the Transformer's ratio).
"""
from dataclasses import dataclass
from functools import partial
from typing import Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.models import register_model

from fairseq_localness.models._locality import (
    LocalityOptions, LocalityTransformerModel, OptionError, attention_heads, option, option_flag, register_presets,
    transformer_small,
)
from fairseq_localness.modules.dual_context import DualContextModule

DC_MODES = ("enc", "dec", "full", "none")
# why --dc-kernel-size / --dc-log-divergence are refused with --dc-mode none
_DC_MODULE_ONLY = "{flag} has no effect with {got} (it applies to the DC module of modes enc, dec and full)"
# an option of the DC module itself: it applies to every mode but none
_dc_module_option = partial(option, applies_to={"dc_mode": ("enc", "dec", "full")}, unused_message=_DC_MODULE_ONLY)
_SIDES_OF_MODE = {"enc": ("encoder",), "dec": ("decoder",), "full": ("encoder", "decoder"), "none": ()}


@dataclass
class DCOptions(LocalityOptions):
    layer_option_prefix = "dc"

    dc_mode: ChoiceEnum(DC_MODES) = option(
        "enc",
        "where the Dual Contextual module (eq. 6-9) replaces self-attention: enc (Enc-DC), dec "
        "(Dec-DC), full (Full-DC) or none (fairseq's transformer)",
    )
    dc_encoder_layers: Optional[str] = option(
        None,
        "encoder layers with the DC module: 1-based list or ranges ('1-2', '1,3'), 'all' or "
        "'none'; given with another mode it is an error",
        applies_to={"dc_mode": ("enc", "full")},
        default_text="all",
    )
    dc_decoder_layers: Optional[str] = option(
        None,
        "decoder layers with the (causal) DC module, same syntax; given with another mode it is "
        "an error",
        applies_to={"dc_mode": ("dec", "full")},
        default_text="all",
    )
    dc_kernel_size: int = _dc_module_option(
        2,
        "kernel size f of the Local Context Unit's convolution (eq. 6; the paper: 2, Sect. 5.2; causal in the decoder)",
    )
    dc_log_divergence: bool = _dc_module_option(
        False,
        "log the Jensen-Shannon divergence between the two FI units of every DC layer (eq. 10-11) "
        "as the validation metric <layer>_js",
    )

    def layers_by_default(self, side: str, num_layers: int) -> str:
        """Every layer of a side the mode selects."""
        return "all"

    def layers(self, side: str, num_layers: int):
        """0-based DC layers of ``side`` ('encoder' or 'decoder'); validates. A side the
        mode leaves alone has none, and giving it a layer list is an error."""
        option = f"dc_{side}_layers"
        spec = getattr(self, option)
        if side not in _SIDES_OF_MODE[self.dc_mode]:
            if spec is not None:
                raise OptionError(
                    f"{option_flag(option)} {spec!r} is given but {option_flag('dc_mode')} "
                    f"{self.dc_mode} leaves the {side} alone; use --dc-mode "
                    f"{'enc' if side == 'encoder' else 'dec'} or full"
                )
            return []
        return super().layers(side, num_layers)

    def validate(self, cfg):
        if self.dc_mode not in DC_MODES:
            raise OptionError(
                f"{option_flag('dc_mode')} {self.dc_mode!r}: unknown mode; allowed: {', '.join(DC_MODES)}"
            )
        if int(self.dc_kernel_size) != self.dc_kernel_size or self.dc_kernel_size < 1:
            raise OptionError(
                f"{option_flag('dc_kernel_size')} must be an integer >= 1 (got {self.dc_kernel_size})"
            )
        for side in ("encoder", "decoder"):
            self.layers(side, getattr(cfg, f"{side}_layers"))

    def unused(self, cfg):
        # (a layer list given for a side the mode leaves alone is an error, see layers)
        return self.inapplicable(["dc_kernel_size", "dc_log_divergence"])


def build_dc_module(embed_dim, cfg, *, options: DCOptions, side: str) -> DualContextModule:
    """The DC module of one layer (a :data:`SubmoduleBuilder` for ``self_attention``)."""
    return DualContextModule(
        embed_dim,
        attention_heads(cfg, side),
        kernel_size=options.dc_kernel_size,
        causal=side == "decoder",
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        log_divergence=options.dc_log_divergence,
    )


@register_model("dc_transformer")
class DCTransformerModel(LocalityTransformerModel):
    """fairseq's transformer with the Dual Contextual module (Enc-DC, Dec-DC, Full-DC)."""

    options_class = DCOptions
    self_attention_builder = staticmethod(build_dc_module)


# The paper's IWSLT setting (Sect. 5.2): 4 + 4 layers, d = 256, 4 heads (FFN 1024, not
# stated in the paper).
register_presets("dc_transformer", {"iwslt_small": transformer_small(layers=4)})
