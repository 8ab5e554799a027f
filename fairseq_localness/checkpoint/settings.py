"""What a loaded checkpoint holds, checked before fairseq reads any of it.

torch's restricted unpickler builds only data, but fairseq then builds a model, a
task and a criterion from the checkpoint's own settings (``cfg``, or ``args`` in
older checkpoints), copies them into OmegaConf, and evaluates some of them.
:func:`check_state` runs on every checkpoint this package loads, before it is
returned to fairseq:

- **Only data, bounded.** Every value is a dict, list, tuple, set,
  ``argparse.Namespace``, string, number, ``None``, tensor or numeric numpy array;
  no cycles; at most :data:`MAX_DEPTH` levels; at most :data:`MAX_NODES` values
  counted as a copy would count them (shared references counted each time they
  are reached: a few kilobytes of references to references expand exponentially
  when OmegaConf or a log line copies them), of which at most
  :data:`MAX_SETTINGS_NODES` values and :data:`MAX_SETTINGS_CHARS` characters in
  the settings.
- **Registered components.** The model's architecture, the task, and the criterion,
  optimizer, learning-rate scheduler, tokenizer, BPE and scorer the settings name
  are ones registered with fairseq (by fairseq itself, or by a ``--user-dir`` already
  imported, such as this package).
- **No interpolation.** No setting holds ``${``: OmegaConf would resolve it when
  the setting is read (a resolver such as ``${oc.env:...}`` reads the environment; a
  string of many references expands exponentially). fairseq writes its settings
  resolved.
- **Literal where fairseq evaluates.** Every setting fairseq passes to ``eval()``
  (:data:`EVALUATED_SETTINGS`) is, where it is a string, a literal
  (:func:`~fairseq_localness.checkpoint.literals.literal`); fairseq's ``eval`` itself
  parses literals only (:mod:`fairseq_localness.checkpoint.literals`), so a setting
  missing from that list is refused when fairseq evaluates it, naming it.

The settings' strings are remembered with their paths
(:func:`~fairseq_localness.checkpoint.literals.remember_settings`) for that refusal.
"""
import argparse
from typing import Dict

import numpy as np
import torch

from fairseq_localness.checkpoint.errors import MalformedCheckpointError, UntrustedCheckpointError
from fairseq_localness.checkpoint.literals import NotALiteral, literal, remember_settings

MAX_DEPTH = 64
MAX_NODES = 5_000_000
MAX_SETTINGS_NODES = 50_000
"""A fairseq 0.12 checkpoint's settings are about 500 values."""
MAX_SETTINGS_CHARS = 4_000_000
"""... and about 10,000 characters."""

EVALUATED_SETTINGS = frozenset({
    # fairseq.utils.eval_str_list / eval_str_dict / eval_bool
    "adaptive_softmax_cutoff", "adaptive_input_cutoff", "left_pad_source", "left_pad_target",
    "xformers_att_config", "pipeline_balance", "pipeline_devices", "pipeline_encoder_balance",
    "pipeline_encoder_devices", "pipeline_decoder_balance", "pipeline_decoder_devices",
    # eval() in models, optimizers, criteria and fairseq_cli
    "adam_betas", "adamax_betas", "adafactor_eps", "lamb_betas", "wer_args", "character_filters",
    "conv_feature_layers", "conv_aggregator_layers", "override_encoder_layers", "encoder_layers",
    "decoder_layers", "encoder_attention", "decoder_attention", "self_attention", "project_input",
    "gated_attention", "downsample", "pretrained", "model_overrides", "optimizer_overrides",
    "decoder_zero_init", "input_layers", "feature_encoder_spec", "conv_layers",
})
"""The settings fairseq 0.12 evaluates (``tests/test_checkpoint_settings.py`` checks
this list against fairseq's installed source)."""

REGISTRY_GROUPS = ("criterion", "optimizer", "lr_scheduler", "tokenizer", "bpe", "scoring")

_LEAVES = (str, int, float, bool, type(None), bytes)
_CONTAINERS = (dict, list, tuple, set, frozenset, argparse.Namespace)


def _children(value):
    if isinstance(value, dict):
        return list(value.keys()) + list(value.values())
    if isinstance(value, argparse.Namespace):
        return list(vars(value).values())
    return list(value)


def _describe(value) -> str:
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _leaf_ok(value) -> bool:
    if isinstance(value, _LEAVES) or isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype.kind in "biufc"
    return False


def measure(root, file: str, where: str, max_nodes: int):
    """(values, characters) of ``root`` counted as a copy would count them; raises
    past ``max_nodes`` values, at a cycle, past :data:`MAX_DEPTH` levels, or at a
    value that is not data. Iterative: the size of each container is computed once."""
    sizes: Dict[int, int] = {}
    chars: Dict[int, int] = {}
    keep = []  # the containers measured, alive while their ids are keys
    on_path = set()
    stack = [(root, 0, False)]
    while stack:
        value, depth, done = stack.pop()
        if not isinstance(value, _CONTAINERS):
            if not _leaf_ok(value):
                raise UntrustedCheckpointError(file, f"{where} holds a {_describe(value)}, which is not data a "
                                               "fairseq checkpoint holds")
            continue
        key = id(value)
        if done:
            on_path.discard(key)
            children = _children(value)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            chars[key] = sum(chars.get(id(c), len(c) if isinstance(c, (str, bytes)) else 0) for c in children)
            if sizes[key] > max_nodes:
                raise UntrustedCheckpointError(
                    file, f"{where} expands to more than {max_nodes} values when copied (shared references), far "
                    "more than a fairseq checkpoint holds")  # (where: 'it', 'its cfg', 'its args')
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise UntrustedCheckpointError(file, f"{where} contains itself (a cycle), which a fairseq checkpoint "
                                           "never does")
        if depth > MAX_DEPTH:
            raise UntrustedCheckpointError(file, f"{where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(value, argparse.Namespace) and not all(isinstance(k, str) for k in vars(value)):
            raise MalformedCheckpointError(file, f"{where} holds a Namespace with a name that is not a string")
        on_path.add(key)
        keep.append(value)
        stack.append((value, depth, True))
        stack.extend((c, depth + 1, False) for c in _children(value))
    key = id(root)
    if isinstance(root, _CONTAINERS):
        return sizes[key], chars[key]
    return 1, len(root) if isinstance(root, (str, bytes)) else 0


def _walk_settings(value, path, out):
    """Every leaf of the settings with its dotted path (shared values once per path)."""
    stack = [(value, path)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        else:
            out.append((path, value))


def _get(group, key):
    if isinstance(group, argparse.Namespace):
        return getattr(group, key, None)
    if isinstance(group, dict):
        return group.get(key)
    return None


def _registered(file: str, setting: str, name, registry, what: str):
    if name is None:
        return
    if not isinstance(name, str) or name not in registry:
        shown = repr(name) if len(repr(name)) <= 60 else repr(name)[:57] + "..."
        raise UntrustedCheckpointError(
            file, f"its setting {setting} = {shown} names no registered {what} (a model of another --user-dir "
            "needs that directory imported first, e.g. --user-dir on the command line)", trust_helps=False)


def check_names(cfg, args, file: str):
    """The architecture, task and components the settings name are registered ones."""
    import fairseq_localness  # noqa: F401  (registers this package's models with fairseq)
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    models = set(ARCH_MODEL_REGISTRY) | set(MODEL_REGISTRY)
    if cfg is not None:
        if not isinstance(cfg, dict):
            raise MalformedCheckpointError(file, f"its settings (cfg) are a {_describe(cfg)}, not a dict")
        model = cfg.get("model")
        for key in ("_name", "arch"):
            _registered(file, f"cfg.model.{key}", _get(model, key), models, "architecture")
        _registered(file, "cfg.task._name", _get(cfg.get("task"), "_name"), TASK_REGISTRY, "task")
        for group in REGISTRY_GROUPS:
            _registered(file, f"cfg.{group}._name", _get(cfg.get(group), "_name"),
                        REGISTRIES[group]["registry"], group.replace("_", "-"))
    if args is not None:
        if not isinstance(args, argparse.Namespace):
            raise MalformedCheckpointError(file, f"its settings (args) are a {_describe(args)}, not a Namespace")
        _registered(file, "args.arch", getattr(args, "arch", None), models, "architecture")
        _registered(file, "args.task", getattr(args, "task", None), TASK_REGISTRY, "task")
        for group in REGISTRY_GROUPS:
            value = getattr(args, group, None)
            if isinstance(value, str):
                _registered(file, f"args.{group}", value, REGISTRIES[group]["registry"], group.replace("_", "-"))


def check_settings(settings: Dict[str, object], file: str):
    """No interpolation; literals where fairseq evaluates (see the module docstring)."""
    leaves = []
    for top, value in settings.items():
        if value is not None:
            _walk_settings(value, top, leaves)
    strings = {}
    for path, value in leaves:
        if not isinstance(value, str):
            continue
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        if "${" in value:
            raise UntrustedCheckpointError(
                file, f"its setting {path} = {shown} is an OmegaConf interpolation, which fairseq never writes "
                "and OmegaConf would resolve when the setting is read", trust_helps=False)
        name = path.rsplit(".", 1)[-1]
        if name in EVALUATED_SETTINGS:
            try:
                literal(value)
            except NotALiteral as e:
                raise UntrustedCheckpointError(
                    file, f"its setting {path} = {shown} is not a Python literal ({e}), and fairseq evaluates "
                    "that setting; this package parses it as a literal and runs nothing", trust_helps=False)
        strings[path] = value
    remember_settings(file, strings)


def check_state(state, file: str, names: bool = True):
    """Check a loaded checkpoint (see the module docstring); raises
    :class:`~fairseq_localness.checkpoint.errors.CheckpointError`. ``names``: also
    check that the components it names are registered (imports fairseq)."""
    if not isinstance(state, dict):
        raise MalformedCheckpointError(file, f"it holds a {_describe(state)}, not a fairseq checkpoint's dict")
    settings = {key: state.get(key) for key in ("cfg", "args")}
    for key, value in settings.items():
        if value is not None:
            _, chars = measure(value, file, f"its {key}", MAX_SETTINGS_NODES)
            if chars > MAX_SETTINGS_CHARS:
                raise UntrustedCheckpointError(
                    file, f"its {key} expands to more than {MAX_SETTINGS_CHARS} characters when copied")
    measure(state, file, "it", MAX_NODES)
    check_settings(settings, file)
    if names:
        check_names(settings["cfg"], settings["args"], file)

