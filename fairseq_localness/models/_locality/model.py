"""The base class of the registered models, :class:`LocalityTransformerModel`:
fairseq's ``transformer`` that checks its options, makes the layer plan (one
:class:`~fairseq_localness.models._locality.layers.LayerSpec` per layer, kept
layers only under LayerDrop pruning) and builds its encoder and decoder from it;
:func:`rename_parameters` keeps older checkpoints loading."""
import dataclasses
import logging
import re
from contextvars import ContextVar
from functools import partial
from typing import Callable, Dict, List, Optional

from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models.transformer import TransformerConfig, TransformerModel, base_architecture
from torch import nn

from fairseq_localness.models._locality.layers import (
    SIDES,
    LayerSpec,
    LocalityTransformerDecoder,
    LocalityTransformerEncoder,
)
from fairseq_localness.models._locality.options import (
    LocalityOptions,
    OptionError,
    command_line_error,
    layers_to_keep,
    option_flag,
)
from fairseq_localness.modules.attention import set_attention_impl

logger = logging.getLogger(__name__)


# fairseq's TransformerModelBase.build_model calls build_encoder(cfg, ...) and
# build_decoder(cfg, ...) with --<side>-layers already cut to the number of kept layers
# when LayerDrop pruning is asked for; the number of layers as trained, which the
# layer options count, is gone by then. LocalityTransformerModel.build_model makes the
# plan before and hands it over through this variable for the duration of the call.
_PLAN_BEING_BUILT: ContextVar[Optional[Dict[str, List["LayerSpec"]]]] = ContextVar(
    "fairseq_localness_layer_plan", default=None
)


class LocalityTransformerModel(TransformerModel):
    """Base class of the registered models (see :mod:`fairseq_localness.models._locality`)."""

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
        options.validate_shared()
        options.validate(args)
        return options

    @classmethod
    def check_command_line(cls, args) -> None:
        """The checks of :meth:`check_args`, and options without effect refused, as an
        argparse-style error (exit status 2) naming the option."""
        try:
            options = cls.check_args(args)
            unused = list(options.unused(args))
            if options.given("attention_impl") and not cls.replaces_attention(options, args):
                unused.append(cls.attention_impl_unused())
            if unused:
                raise OptionError("; ".join(unused))
        except OptionError as e:
            command_line_error(str(e))

    @classmethod
    def replaces_attention(cls, options, args) -> bool:
        """Whether the layer plan replaces any of fairseq's modules (with every layer
        option off the model is fairseq's transformer, and ``--attention-impl`` has
        nothing to set)."""
        plan = cls.layer_plan(options, args)
        return any(spec.self_attention or spec.encoder_attention or spec.layer_class
                   for specs in plan.values() for spec in specs)

    @staticmethod
    def attention_impl_unused() -> str:
        return (
            f"{option_flag('attention_impl')} has no effect: the options replace no attention of "
            f"fairseq's transformer"
        )

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
            model = super().build_model(args, task)
        finally:
            _PLAN_BEING_BUILT.reset(token)
        if not set_attention_impl(model, options.attention_impl) and options.given("attention_impl"):
            logger.warning(cls.attention_impl_unused())
        return model

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
