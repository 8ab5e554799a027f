"""Shared model machinery: fairseq's transformer whose attention sublayers follow a
per-layer plan.

Each model of this package is fairseq's ``transformer`` (same embeddings, layers,
feed-forward blocks, parameter names) in which a validated *plan* says, layer by
layer and side by side, which attention replaces fairseq's ``MultiheadAttention``.
Layers the plan leaves alone are built by fairseq itself, so with every option off
a model computes exactly what ``transformer`` computes.

A model class provides

* ``options_class``: a dataclass of its options, fields prefixed with the model's
  name (``localness_*``, ...) so fairseq's ``encoder_*``/``decoder_*`` routing never
  touches them (the one option all models share, ``attention_impl``, is declared in
  :class:`LocalityOptions` and has no prefix), each declared with :func:`option` (what it does, the settings of the
  other options it applies to); ``--help``, the option tables of ``docs/<model>.md``
  (:mod:`fairseq_localness.models.options_doc`) and the refusal of options without
  effect (:meth:`LocalityOptions.inapplicable`) are made from that one source. Its
  ``layer_option_prefix`` names the layer-list options ``<prefix>_encoder_layers`` /
  ``<prefix>_decoder_layers`` that :meth:`LocalityOptions.layers` reads;
* ``self_attention_builder(embed_dim, cfg, *, options, side)``: the module that
  replaces the self-attention of the chosen layers; the default
  :meth:`LocalityTransformerModel.layer_specs` puts it into the layers
  :meth:`LocalityOptions.layers` selects (a model that changes more than the
  self-attention, e.g. the encoder-decoder attention too, overrides ``layer_specs``
  and returns one :class:`LayerSpec` per layer of a side).

The plan is made for the layers as trained; with fairseq's LayerDrop pruning
(``--encoder-layers-to-keep`` / ``--decoder-layers-to-keep``) the model keeps the
plan's specs of the kept layers (:meth:`LocalityTransformerModel.build_model`), so a
kept layer has the attention and the parameters it was trained with.

Models with Gaussian branches derive their options from
:class:`GaussianWindowOptions`, which reads the shared window settings once into a
:class:`~fairseq_localness.modules.gaussian.GaussianWindows`. Parameter renames are
mapped by ``renamed_parameters`` (see :meth:`LocalityTransformerModel.upgrade_state_dict_named`),
so that checkpoints keep loading.

Options are validated twice. On the command line (``fairseq-train``, through the
architecture functions that ``parse_args_and_arch`` applies to the parsed arguments)
an invalid option, or one that has no effect on the chosen variant, is an
argparse-style error: ``<prog>: error: <message>`` on stderr and exit status 2, before
fairseq creates ``--save-dir`` or reads any data. When a model is built (training, or
loading a checkpoint) invalid options raise :class:`OptionError` and options without
effect are logged as warnings, so checkpoints trained before a check was added still
load. Messages name the option and the allowed values.

Modules, one concern each: :mod:`~fairseq_localness.models._locality.options` (the
options' declaration, the base options dataclasses, layer lists, option errors),
:mod:`~fairseq_localness.models._locality.layers` (:class:`LayerSpec`, the layers,
encoder and decoder a plan builds), :mod:`~fairseq_localness.models._locality.model`
(:class:`LocalityTransformerModel`: checks, layer plan, LayerDrop pruning,
parameter renames) and :mod:`~fairseq_localness.models._locality.presets` (the
named architectures). A model imports what it needs from this package.
"""
from fairseq_localness.models._locality.layers import (
    SIDES, LayerSpec, LocalityDecoderLayer, LocalityEncoderLayer, LocalityTransformerDecoder,
    LocalityTransformerEncoder, SubmoduleBuilder, attention_heads,
)
from fairseq_localness.models._locality.model import LocalityTransformerModel, rename_parameters
from fairseq_localness.models._locality.options import (
    GaussianWindowOptions, LocalityOptions, OptionError, applies_to_text, command_line_error, default_layers,
    layers_to_keep, option, option_flag, parse_layers,
)
from fairseq_localness.models._locality.presets import fairseq_presets, register_presets, transformer_small

__all__ = [
    "GaussianWindowOptions", "LayerSpec", "LocalityDecoderLayer", "LocalityEncoderLayer", "LocalityOptions",
    "LocalityTransformerDecoder", "LocalityTransformerEncoder", "LocalityTransformerModel", "OptionError", "SIDES",
    "SubmoduleBuilder", "applies_to_text", "attention_heads", "command_line_error", "default_layers",
    "fairseq_presets", "layers_to_keep", "option", "option_flag", "parse_layers", "register_presets",
    "rename_parameters", "transformer_small",
]
