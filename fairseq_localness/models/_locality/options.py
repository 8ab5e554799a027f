"""Model options: their declaration (:func:`option`, the one source of ``--help``,
of the option tables of ``docs/<model>.md`` and of the refusal of options without
effect), the base dataclasses :class:`LocalityOptions` and
:class:`GaussianWindowOptions`, the parsing of layer lists (:func:`parse_layers`,
fairseq's ``--<side>-layers-to-keep``: :func:`layers_to_keep`) and the errors
(:class:`OptionError`; :func:`command_line_error` on the command line).

How options are validated, on the command line and when a model is built, is told
in :mod:`fairseq_localness.models._locality`.
"""
import dataclasses
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from fairseq.dataclass import ChoiceEnum, FairseqDataclass

from fairseq_localness.modules.gaussian import GaussianWindows
from fairseq_localness.modules.kernels.choice import ATTENTION_IMPLS


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
    """Base of every model's options dataclass, with the options all models share.

    ``attention_impl`` is the one shared option and the one without the model's prefix:
    it names the same setting as ``fairseq-localness-bench --attention-impl`` and
    changes which kernels compute the attention, not what they compute nor any
    parameter.
    """

    # ``<prefix>_encoder_layers`` / ``<prefix>_decoder_layers`` are the layer lists
    # :meth:`layers` reads (a class attribute, not an option)
    layer_option_prefix = ""

    attention_impl: ChoiceEnum(ATTENTION_IMPLS) = option(
        "auto",
        "the kernels of the model's attention sublayers (not fairseq's own, which the "
        "options leave in place): auto (the measured choice per device and shape), sdpa "
        "(one fused kernel call per branch wherever one applies), flex (every branch in "
        "one compiled FlexAttention call), dense (every branch one SDPA call with its mask "
        "and bias whole, no compiled call), eager (the reference: energies, softmax and "
        "weights in plain operators). The outputs agree to the dtype's rounding; stored "
        "in checkpoints, changed at generation with --model-overrides "
        "\"{'attention_impl': 'eager'}\"",
        scope="every layer the model's options replace",
    )

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

    @classmethod
    def own_fields(cls) -> List[dataclasses.Field]:
        """The model's own options: every declared one but those all models share
        (the fields of :class:`LocalityOptions`; FairseqDataclass's ``_name`` is none)."""
        shared = {fld.name for fld in dataclasses.fields(LocalityOptions)}
        return [fld for fld in dataclasses.fields(cls) if fld.name not in shared and not fld.name.startswith("_")]

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

    def validate_shared(self) -> None:
        """Raise :class:`OptionError` for an invalid shared option (the model's
        :meth:`validate` checks its own)."""
        if self.attention_impl not in ATTENTION_IMPLS:
            raise OptionError(
                f"{option_flag('attention_impl')} {self.attention_impl!r}: unknown kernel setting; "
                f"allowed: {', '.join(ATTENTION_IMPLS)}"
            )

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
