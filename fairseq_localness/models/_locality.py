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
  touches them, each declared with :func:`option` (what it does, the settings of the
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
"""
import dataclasses
import logging
import os
import re
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, List, Optional, Sequence

from fairseq.dataclass import FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import (
    TransformerConfig,
    TransformerDecoderBase,
    TransformerEncoderBase,
    TransformerModel,
    base_architecture,
)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import nn

from fairseq_localness.modules.gaussian import GaussianWindows
from fairseq_localness.modules.observe import Observable

logger = logging.getLogger(__name__)


class OptionError(ValueError):
    """An invalid model option; the message names the option and what is allowed."""


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def command_line_error(message: str) -> None:
    """Stop like an argparse error: ``<prog>: error: <message>``, exit status 2."""
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "fairseq"
    sys.stderr.write(f"{prog}: error: {message}\n")
    sys.stderr.flush()
    raise SystemExit(2)


def parse_layers(spec: Optional[str], num_layers: int, option: str) -> List[int]:
    """Parse a 1-based layer list such as ``"1-3"``, ``"1,3,5"``, ``"all"`` or ``""``.

    Returns sorted 0-based indices. ``""`` and ``"none"`` select no layer.
    Raises :class:`OptionError` naming ``option`` for anything else.
    """
    flag = option_flag(option)
    if spec is None:
        return []
    spec = str(spec).strip().lower()
    if spec in ("", "none"):
        return []
    if spec == "all":
        return list(range(num_layers))
    chosen = set()
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise OptionError(
                f"{flag} {spec!r}: cannot parse {part!r}; expected 1-based layer numbers and "
                f"ranges such as '1-3' or '1,3,5', or 'all' / 'none'"
            )
        first = int(match.group(1))
        last = int(match.group(2) or first)
        if first > last:
            raise OptionError(f"{flag} {spec!r}: empty range {part!r} (start > end)")
        for layer in (first, last):
            if num_layers < 1:
                raise OptionError(
                    f"{flag} {spec!r}: this side has no layers; the only allowed value is 'none'"
                )
            if not 1 <= layer <= num_layers:
                raise OptionError(
                    f"{flag} {spec!r}: layer {layer} is out of range; this side has "
                    f"{num_layers} layers (allowed: 1..{num_layers})"
                )
        chosen.update(range(first - 1, last))
    return sorted(chosen)


def layers_to_keep(args, side: str, num_layers: int) -> Optional[List[int]]:
    """The trained layers of ``side`` that a LayerDrop-pruned model keeps (fairseq's
    ``--encoder-layers-to-keep`` / ``--decoder-layers-to-keep``, Fan et al. 2019:
    comma-separated 0-based indices, e.g. ``'0,2'``), sorted; None when not pruned.

    ``num_layers`` is the number of layers the model was trained with. Raises
    :class:`OptionError` naming the option for anything but distinct indices in
    ``0..num_layers-1`` (fairseq itself would build a model that cannot load them).
    """
    option = f"{side}_layers_to_keep"
    value = getattr(args, option, None)
    if value is None or value == "" or value == []:
        return None
    flag = option_flag(option)
    # a string from --model-overrides; a list from fairseq's own parser (List[int])
    parts = list(value) if isinstance(value, (list, tuple)) else str(value).split(",")
    value = ",".join(str(p) for p in parts)  # as the messages show it
    kept = []
    for part in parts:
        text = str(part).strip()
        if not re.fullmatch(r"\d+", text):
            raise OptionError(
                f"{flag} {value!r}: cannot parse {text!r}; expected comma-separated 0-based layer "
                f"indices such as '0,2' (allowed: 0..{num_layers - 1})"
            )
        index = int(text)
        if index >= num_layers:
            raise OptionError(
                f"{flag} {value!r}: layer {index} is out of range; the model has {num_layers} "
                f"{side} layers (allowed: 0..{num_layers - 1})"
            )
        if index in kept:
            raise OptionError(f"{flag} {value!r}: layer {index} is listed more than once")
        kept.append(index)
    return sorted(kept)


def _value(value):
    """An option's value as compared and shown (an Enum from a ChoiceEnum field: its value)."""
    return value.value if hasattr(value, "value") and not isinstance(value, (int, float, str)) else value


def attention_heads(cfg, side: str) -> int:
    """H of ``side``'s attention (``cfg``: fairseq's transformer config)."""
    return cfg.encoder.attention_heads if side == "encoder" else cfg.decoder.attention_heads


def _or(values: Sequence) -> str:
    values = [str(v) for v in values]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def applies_to_text(applies_to: Dict[str, Sequence]) -> str:
    """``{"hybrid_variant": ("neighbor", "local_s")}`` -> ``--hybrid-variant neighbor or
    local_s``; several conditions are joined by ``with``; a switch (``(True,)``) is its
    flag alone."""
    parts = []
    for name, values in applies_to.items():
        parts.append(option_flag(name) if tuple(values) == (True,) else f"{option_flag(name)} {_or(values)}")
    return " with ".join(parts)


def option(default, help: str, *, applies_to: Optional[Dict[str, Sequence]] = None, scope: str = "",
           default_text: str = "", unused_message: str = "") -> dataclasses.Field:
    """A model option: a field of the model's options dataclass, the one declaration
    that ``--help``, the option tables of ``docs/<model>.md``
    (:mod:`fairseq_localness.models.options_doc`) and the refusal of options without
    effect (:meth:`LocalityOptions.inapplicable`) are made from.

    * ``help``: what the option does (what the code computes, with the paper's
      equation);
    * ``applies_to``: ``{other option: its values}`` under which the option has an
      effect (all conditions together; ``(True,)`` for a switch); given otherwise, it
      is refused on the command line and a warning when a checkpoint is loaded;
      ``unused_message`` replaces the standard message (``{flag}``: this option,
      ``{got}``: the other options as given);
    * ``scope``: where it applies when that is a set of layers rather than other
      options' values (the model's ``unused`` checks it);
    * ``default_text``: the default in words, for a default of None (computed from
      other options).

    ``--help`` shows ``help``, then ``applies to ...``, then ``default: ...`` when
    ``default_text`` is given.
    """
    where = "; ".join(filter(None, [applies_to_text(applies_to) if applies_to else "", scope]))
    full_help = help
    if where:
        full_help += f". Applies to {where} only"
    if default_text:
        full_help += f" (default: {default_text})"
    metadata = {
        "help": full_help,
        "doc": help,
        "applies_to": dict(applies_to or {}),
        "scope": scope,
        "default_text": default_text,
        "unused_message": unused_message,
    }
    return dataclasses.field(default=default, metadata=metadata)


@dataclass
class LocalityOptions(FairseqDataclass):
    """Base of every model's options dataclass."""

    # ``<prefix>_encoder_layers`` / ``<prefix>_decoder_layers`` are the layer lists
    # :meth:`layers` reads (a class attribute, not an option)
    layer_option_prefix = ""

    @classmethod
    def from_args(cls, args) -> "LocalityOptions":
        values = {}
        for fld in dataclasses.fields(cls):
            if fld.name.startswith("_"):
                continue
            value = getattr(args, fld.name, None)
            if value is None:
                value = fld.default if fld.default is not dataclasses.MISSING else fld.default_factory()
            if hasattr(value, "value") and not isinstance(value, (int, float, str)):
                value = value.value  # an Enum from a ChoiceEnum field
            values[fld.name] = value
        return cls(**values)

    def layers_by_default(self, side: str, num_layers: int) -> str:
        """The layer list of ``side`` when its option is None (not given)."""
        return "none"

    def layers(self, side: str, num_layers: int) -> List[int]:
        """0-based layers of ``side`` (with ``num_layers`` layers) whose self-attention
        the model replaces: the option ``<layer_option_prefix>_<side>_layers`` parsed
        by :func:`parse_layers` (which raises :class:`OptionError` naming it)."""
        option = f"{self.layer_option_prefix}_{side}_layers"
        spec = getattr(self, option)
        if spec is None:
            spec = self.layers_by_default(side, num_layers)
        return parse_layers(spec, num_layers, option)

    def validate(self, cfg) -> None:
        """Raise :class:`OptionError` for invalid options (cfg: fairseq's config)."""

    def unused(self, cfg) -> List[str]:
        """Messages for options given (set to something else than their default) that
        have no effect with the other options: the variant, window strategy, fusion
        or mode they belong to is not the chosen one, or no layer uses them."""
        return []

    def inapplicable(self, names: Optional[Sequence[str]] = None) -> List[str]:
        """Messages for the options (all, or ``names``) given although their
        ``applies_to`` condition (see :func:`option`) does not hold."""
        out = []
        for fld in dataclasses.fields(self):
            applies_to = fld.metadata.get("applies_to")
            if not applies_to or (names is not None and fld.name not in names) or not self.given(fld.name):
                continue
            if all(_value(getattr(self, other)) in values for other, values in applies_to.items()):
                continue
            got = ", ".join(
                f"{option_flag(other)} {_value(getattr(self, other))}" if tuple(values) != (True,)
                else f"no {option_flag(other)}"
                for other, values in applies_to.items()
            )
            message = fld.metadata.get("unused_message")
            if message:
                out.append(message.format(flag=option_flag(fld.name), got=got))
            elif list(applies_to.values()) == [(True,)]:
                out.append(f"{option_flag(fld.name)} applies with {applies_to_text(applies_to)} only")
            else:
                out.append(f"{option_flag(fld.name)} applies to {applies_to_text(applies_to)} only (got {got})")
        return out

    def given(self, name: str) -> bool:
        """Whether option ``name`` differs from its default."""
        fld = next(f for f in dataclasses.fields(self) if f.name == name)
        default = fld.default if fld.default is not dataclasses.MISSING else fld.default_factory()
        return getattr(self, name) != default


@dataclass
class GaussianWindowOptions(LocalityOptions):
    """Base of the options of a model with Gaussian branches
    (:class:`~fairseq_localness.modules.gaussian.GaussianLocalness`).

    The subclass declares ``<gaussian_prefix>_fixed_window``,
    ``<gaussian_prefix>_head_window_max`` and ``<gaussian_prefix>_min_window`` (with
    the defaults of :class:`~fairseq_localness.modules.gaussian.GaussianWindows` and
    help texts of its own); this class reads them into one ``GaussianWindows`` and
    checks them with that class's own rule, naming the options.
    """

    gaussian_prefix = ""  # a class attribute, not an option

    def gaussian_option(self, setting: str) -> str:
        """The option of a ``GaussianWindows`` setting, e.g. ``localness_min_window``."""
        return f"{self.gaussian_prefix}_{setting}"

    def gaussian_windows(self) -> GaussianWindows:
        """The window settings shared by the model's Gaussian branches."""
        return GaussianWindows(
            **{f.name: getattr(self, self.gaussian_option(f.name)) for f in dataclasses.fields(GaussianWindows)}
        )

    def validate_gaussian_windows(self, window_strategy: str) -> None:
        """Raise :class:`OptionError` for invalid window settings: finite, positive
        windows, a floor >= 0, and a floor below N when the ``head`` strategy is used
        (:meth:`GaussianWindows.problem <fairseq_localness.modules.gaussian.GaussianWindows.problem>`)."""
        problem = self.gaussian_windows().problem(
            window_strategy, name=lambda setting: option_flag(self.gaussian_option(setting))
        )
        if problem is not None:
            raise OptionError(problem)


def default_layers(count: int, num_layers: int) -> str:
    """The lowest ``count`` layers of a side, or all of a shallower one ('none' if it has none)."""
    return f"1-{min(count, num_layers)}" if num_layers >= 1 else "none"


SubmoduleBuilder = Callable[[int, object], nn.Module]  # (embed_dim, cfg) -> module

SIDES = ("encoder", "decoder")


@dataclass
class LayerSpec:
    """What the plan puts into one layer; None keeps fairseq's module."""

    side: str  # "encoder" or "decoder"
    # 0-based position in the built model (in a LayerDrop-pruned model, the position
    # among the kept layers: encoder.layers.<index>, labelled enc<index + 1>)
    index: int
    self_attention: Optional[SubmoduleBuilder] = None
    encoder_attention: Optional[SubmoduleBuilder] = None
    # Builds the whole layer, for variants that replace more than an attention
    # (called as layer_class(cfg, spec, ...) like the classes below).
    layer_class: Optional[type] = None

    @property
    def label(self) -> str:
        return f"{'enc' if self.side == 'encoder' else 'dec'}{self.index + 1}"


def _label_observables(module: Optional[nn.Module], prefix: str):
    if module is None:
        return
    for sub in module.modules():
        if isinstance(sub, Observable):
            sub.metric_prefix = prefix


class LocalityEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with the self-attention chosen by a :class:`LayerSpec`."""

    def __init__(self, cfg, spec: LayerSpec, return_fc: bool = False):
        # fairseq's __init__ calls build_self_attention, which reads the spec; a plain
        # (non-Module) attribute may be set before nn.Module.__init__.
        self.layer_spec = spec
        super().__init__(cfg, return_fc=return_fc)
        _label_observables(self.self_attn, spec.label)

    def build_self_attention(self, embed_dim, cfg):
        if self.layer_spec.self_attention is not None:
            return self.layer_spec.self_attention(embed_dim, cfg)
        return super().build_self_attention(embed_dim, cfg)


class LocalityDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with self- and encoder-decoder attention chosen by a
    :class:`LayerSpec`."""

    def __init__(self, cfg, spec: LayerSpec, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self.layer_spec = spec  # read by the build_* methods that fairseq's __init__ calls
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        _label_observables(self.self_attn, spec.label + "_self")
        _label_observables(self.encoder_attn, spec.label + "_cross")

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if self.layer_spec.self_attention is not None:
            return self.layer_spec.self_attention(embed_dim, cfg)
        return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)

    def build_encoder_attention(self, embed_dim, cfg):
        if self.layer_spec.encoder_attention is not None:
            return self.layer_spec.encoder_attention(embed_dim, cfg)
        return super().build_encoder_attention(embed_dim, cfg)


def _wrap_like_fairseq(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping, as fairseq's build_*_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class _SpecQueue:
    """The :class:`LayerSpec` of each layer of one side, handed out in layer order.

    fairseq's ``TransformerEncoderBase.__init__`` / ``TransformerDecoderBase.__init__``
    call ``build_encoder_layer(cfg)`` / ``build_decoder_layer(cfg, ...)`` once per layer,
    in order, without the layer's index. This is the one place that works around it:
    the encoder/decoder below hold a queue (a plain object, set before
    ``nn.Module.__init__``) from which each call takes the next spec.
    """

    def __init__(self, side: str, specs: Sequence[LayerSpec]):
        self.side = side
        self._specs = list(specs)
        self._next = 0

    def next_spec(self) -> LayerSpec:
        if self._next >= len(self._specs):
            raise RuntimeError(f"fairseq built more {self.side} layers than the plan has ({len(self._specs)})")
        spec = self._specs[self._next]
        self._next += 1
        return spec

    def check_done(self) -> None:
        if self._next != len(self._specs):
            raise RuntimeError(
                f"the plan has {len(self._specs)} {self.side} layers but fairseq built {self._next}"
            )


class LocalityTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, specs: Sequence[LayerSpec], return_fc=False):
        self.layer_queue = _SpecQueue("encoder", specs)  # see _SpecQueue
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        self.layer_queue.check_done()
        del self.layer_queue

    def build_encoder_layer(self, cfg):
        spec = self.layer_queue.next_spec()
        layer_class = spec.layer_class or LocalityEncoderLayer
        return _wrap_like_fairseq(layer_class(cfg, spec, return_fc=self.return_fc), cfg)


class LocalityTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, specs: Sequence[LayerSpec], no_encoder_attn=False):
        self.layer_queue = _SpecQueue("decoder", specs)  # see _SpecQueue
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)
        self.layer_queue.check_done()
        del self.layer_queue

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        spec = self.layer_queue.next_spec()
        layer_class = spec.layer_class or LocalityDecoderLayer
        return _wrap_like_fairseq(layer_class(cfg, spec, no_encoder_attn), cfg)


# fairseq's TransformerModelBase.build_model calls build_encoder(cfg, ...) and
# build_decoder(cfg, ...) with --<side>-layers already cut to the number of kept layers
# when LayerDrop pruning is asked for; the number of layers as trained, which the
# layer options count, is gone by then. LocalityTransformerModel.build_model makes the
# plan before and hands it over through this variable for the duration of the call.
_PLAN_BEING_BUILT: ContextVar[Optional[Dict[str, List["LayerSpec"]]]] = ContextVar(
    "fairseq_localness_layer_plan", default=None
)


class LocalityTransformerModel(TransformerModel):
    """Base class of the registered models (see the module docstring)."""

    options_class = LocalityOptions
    # (embed_dim, cfg, *, options, side) -> the self-attention of a chosen layer
    self_attention_builder: Optional[Callable[..., nn.Module]] = None
    # old parameter name -> new one, as regular expressions over state-dict keys
    # (relative to the model); applied when a checkpoint is loaded
    renamed_parameters: Dict[str, str] = {}

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        gen_parser_from_dataclass(parser, cls.options_class())

    @classmethod
    def check_args(cls, args) -> LocalityOptions:
        """Validate the model's options and the sizes they depend on (``args`` after
        the architecture's defaults are filled in); raises :class:`OptionError`."""
        for side in ("encoder", "decoder"):
            layers = getattr(args, f"{side}_layers", None)
            if layers is not None and layers < 0:
                raise OptionError(f"--{side}-layers must be >= 0 (got {layers})")
            dim = getattr(args, f"{side}_embed_dim", None)
            heads = getattr(args, f"{side}_attention_heads", None)
            if dim is not None and heads is not None and (heads < 1 or dim % heads):
                divisors = [h for h in range(1, min(dim, 64) + 1) if dim % h == 0]
                raise OptionError(
                    f"--{side}-attention-heads {heads}: must divide --{side}-embed-dim {dim} "
                    f"(allowed: {', '.join(map(str, divisors))}{', ...' if dim > 64 else ''})"
                )
        if getattr(args, "cross_self_attention", False):
            raise OptionError("--cross-self-attention is not supported by the locality models")
        for side in SIDES:
            layers_to_keep(args, side, getattr(args, f"{side}_layers"))
        options = cls.options_class.from_args(args)
        options.validate(args)
        return options

    @classmethod
    def check_command_line(cls, args) -> None:
        """The checks of :meth:`check_args`, and options without effect refused, as an
        argparse-style error (exit status 2) naming the option."""
        try:
            options = cls.check_args(args)
            unused = options.unused(args)
            if unused:
                raise OptionError("; ".join(unused))
        except OptionError as e:
            command_line_error(str(e))

    @classmethod
    def build_model(cls, args, task):
        """fairseq's ``build_model``, with the layer plan computed first.

        LayerDrop pruning (``--encoder-layers-to-keep`` / ``--decoder-layers-to-keep``,
        e.g. through ``fairseq-generate --model-overrides``): fairseq sets
        ``--<side>-layers`` to the number of kept layers and
        ``checkpoint_utils.prune_state_dict`` renumbers the kept layers' parameters.
        The plan is made for the layers as trained (the layer options count them) and
        then restricted to the kept ones, so that every kept layer has the attention
        and the parameters it was trained with.
        """
        base_architecture(args)
        options = cls.check_args(args)
        for message in options.unused(args):
            logger.warning(message)
        plan = cls.layer_plan(options, args)
        for side in SIDES:
            # as a string of sorted indices: fairseq's build_model and prune_state_dict
            # split it (an int or a list, e.g. from --model-overrides, would stop them)
            kept = layers_to_keep(args, side, getattr(args, f"{side}_layers"))
            if kept is not None:
                setattr(args, f"{side}_layers_to_keep", ",".join(map(str, kept)))
        token = _PLAN_BEING_BUILT.set(plan)
        try:
            return super().build_model(args, task)
        finally:
            _PLAN_BEING_BUILT.reset(token)

    @classmethod
    def layer_plan(cls, options, args) -> Dict[str, List[LayerSpec]]:
        """Side -> the :class:`LayerSpec` of each layer the model builds:
        :meth:`layer_specs` for the layers as trained (``args.<side>_layers``), then,
        for a LayerDrop-pruned side, only the kept ones, renumbered in order."""
        cfg = TransformerConfig.from_namespace(args)
        plan = {}
        for side in SIDES:
            specs = cls.layer_specs(options, cfg, side)
            kept = layers_to_keep(args, side, len(specs))
            if kept is not None:
                specs = [dataclasses.replace(specs[i], index=position) for position, i in enumerate(kept)]
            plan[side] = specs
        return plan

    @classmethod
    def _specs_to_build(cls, cfg, side: str) -> List[LayerSpec]:
        """The specs of ``side`` for ``build_encoder``/``build_decoder``: the plan
        :meth:`build_model` made, or, when these are called on their own, the plan of
        an unpruned ``cfg``."""
        plan = _PLAN_BEING_BUILT.get()
        if plan is not None:
            return plan[side]
        if getattr(getattr(cfg, side), "layers_to_keep", None):
            raise OptionError(
                f"--{side}-layers-to-keep: a pruned model must be built with build_model, which "
                f"knows how many layers it was trained with"
            )
        return cls.layer_specs(cls.options_class.from_args(cfg), cfg, side)

    @classmethod
    def layer_specs(cls, options, cfg, side: str) -> List[LayerSpec]:
        """One :class:`LayerSpec` per layer of ``side``: the layers that
        ``options.layers`` selects get ``self_attention_builder``'s module, the others
        keep fairseq's."""
        num_layers = cfg.encoder.layers if side == "encoder" else cfg.decoder.layers
        if cls.self_attention_builder is None:
            return [LayerSpec(side, i) for i in range(num_layers)]
        chosen = options.layers(side, num_layers)
        build = partial(cls.self_attention_builder, options=options, side=side)
        return [LayerSpec(side, i, self_attention=build if i in chosen else None) for i in range(num_layers)]

    def upgrade_state_dict_named(self, state_dict, name):
        """Rename the parameters of older checkpoints (``renamed_parameters``), then
        fairseq's upgrades. Keys already in the current form are left alone, so the
        hook is a no-op on current checkpoints."""
        rename_parameters(state_dict, name, self.renamed_parameters)
        super().upgrade_state_dict_named(state_dict, name)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return LocalityTransformerEncoder(cfg, src_dict, embed_tokens, cls._specs_to_build(cfg, "encoder"))

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return LocalityTransformerDecoder(
            cfg, tgt_dict, embed_tokens, cls._specs_to_build(cfg, "decoder"), no_encoder_attn=cfg.no_cross_attention
        )


def rename_parameters(state_dict: dict, prefix: str, renamed: Dict[str, str]) -> List[str]:
    """Apply ``renamed`` (``{old pattern: new}``, regular expressions matched against
    the part of a key after ``prefix``) to the keys of ``state_dict`` in place; returns
    the new names. A key whose new name is already present is an error (the state dict
    would hold two versions of one parameter)."""
    if not renamed:
        return []
    start = f"{prefix}." if prefix else ""
    done = []
    for key in [k for k in state_dict if k.startswith(start)]:
        rest = key[len(start):]
        for old, new in renamed.items():
            if re.search(old, rest):
                target = start + re.sub(old, new, rest)
                if target in state_dict:
                    raise KeyError(f"cannot rename {key!r} to {target!r}: the state dict has both")
                state_dict[target] = state_dict.pop(key)
                done.append(target)
                break
    return done


def transformer_small(layers: int, ffn_embed_dim: int = 1024):
    """A fill function for a small transformer (tensor2tensor's ``transformer_small``
    sizes): d = 256, 4 heads, ``ffn_embed_dim`` (default 1024 = 4d), ``layers`` layers
    on each side; the rest as fairseq's base architecture. Values given on the command
    line win, as in fairseq's own architecture functions."""

    def fill(args):
        for side in ("encoder", "decoder"):
            for name, value in (("embed_dim", 256), ("ffn_embed_dim", ffn_embed_dim),
                                ("attention_heads", 4), ("layers", layers)):
                setattr(args, f"{side}_{name}", getattr(args, f"{side}_{name}", value))
        base_architecture(args)

    fill.__name__ = f"transformer_small_{layers}_layers"
    fill.__doc__ = (
        f"{layers} + {layers} layers, d = 256, 4 heads, FFN {ffn_embed_dim} (tensor2tensor's transformer_small sizes)"
    )
    return fill


def fairseq_presets() -> Dict[str, Callable]:
    """The sizes every model registers, from fairseq's own architecture functions:
    suffix ("" for the model's base) -> function filling the sizes into ``args``."""
    from fairseq.models.transformer import transformer_legacy as tl

    return {
        "": tl.base_architecture,
        "tiny": tl.tiny_architecture,  # tests and the demo
        "iwslt_de_en": tl.transformer_iwslt_de_en,
        "wmt_en_de": tl.transformer_wmt_en_de,
        "vaswani_wmt_en_de_big": tl.transformer_vaswani_wmt_en_de_big,
    }


def register_presets(model_name: str, extra: Optional[Dict[str, Callable]] = None):
    """Register ``<model_name>_<suffix>`` architectures: :func:`fairseq_presets` and
    ``extra`` (suffix -> fill function, e.g. ``{"iwslt_small": transformer_small(2)}``).

    The registered function fills in the sizes, then, when it is applied to a
    freshly parsed command line (fairseq's ``parse_args_and_arch``; a config built by
    fairseq for a model or read from a checkpoint carries ``_name``), checks the
    model's options with :meth:`LocalityTransformerModel.check_command_line`.
    """
    from fairseq.models import register_model_architecture

    for suffix, fill in {**fairseq_presets(), **(extra or {})}.items():
        arch = model_name + ("_" + suffix if suffix else "")
        register_model_architecture(model_name, arch)(_checked_architecture(model_name, fill))


def _checked_architecture(model_name: str, fill):
    def architecture(args):
        fill(args)
        if getattr(args, "_name", None) is None:
            from fairseq.models import MODEL_REGISTRY

            MODEL_REGISTRY[model_name].check_command_line(args)

    architecture.__name__ = getattr(fill, "__name__", "architecture")
    architecture.__doc__ = fill.__doc__
    return architecture
