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
  the settings, and at most :data:`MAX_NAMESPACES` namespaces; the settings hold
  plain values only (strings, numbers, ``None``, in lists, dicts and namespaces).
- **What fairseq reads has fairseq's types** (:func:`check_structure`): the weights
  are dicts of named tensors, the optimizer history and what resuming reads of
  ``extra_state`` are as fairseq writes them.
- **Registered components.** The model's architecture, the task, and the criterion,
  optimizer, learning-rate scheduler, tokenizer, BPE and scorer the settings name
  are ones registered with fairseq (by fairseq itself, or by a ``--user-dir`` already
  imported, such as this package).
- **No interpolation.** No setting holds ``${``, nor spells it as a Python literal
  (``'\\x24{...}'``, which fairseq's upgrade of older settings reads with
  ``ast.literal_eval``): OmegaConf would resolve it when the setting is read (a
  resolver such as ``${oc.env:...}`` reads the environment; a string of many
  references expands exponentially). fairseq writes its settings resolved.
- **Literal where fairseq evaluates.** Every setting fairseq passes to ``eval()``
  (:data:`EVALUATED_SETTINGS`) is, where it is a string, a literal
  (:func:`~fairseq_localness.checkpoint.literals.literal`); fairseq's ``eval`` itself
  parses literals only (:mod:`fairseq_localness.checkpoint.literals`), so a setting
  missing from that list is refused when fairseq evaluates it, naming it.
- **No file named** (:mod:`~fairseq_localness.checkpoint.files`): the settings
  fairseq reads as paths are unset; **sizes fairseq can build** and **finite
  weights** (:mod:`~fairseq_localness.checkpoint.values`).

Trusted or not, the settings are checked (:func:`check_settings`: bounded, without
cycles, literals, no file, sizes) and so are the weights' values; the trust switch
skips the rest, which is about the pickle.

The settings' strings are remembered with their paths
(:func:`~fairseq_localness.checkpoint.literals.remember_settings`) for that refusal.
"""
import argparse
import ast
import math
from typing import Dict

import numpy as np
import torch

from fairseq_localness.checkpoint.errors import MalformedCheckpointError, UntrustedCheckpointError, short_repr
from fairseq_localness.checkpoint.files import _containers, command_line_generation, drop_file_settings
from fairseq_localness.checkpoint.literals import NotALiteral, literal, remember_settings
from fairseq_localness.checkpoint.values import check_finite, check_sizes
from fairseq_localness.checkpoint.resume import check_history

MAX_DEPTH = 64
MAX_NODES = 5_000_000
MAX_SETTINGS_NODES = {"cfg": 10_000, "args": 1_000}
"""A fairseq 0.12 checkpoint's settings (``cfg``) are about 500 values; the legacy
``args`` about 250, which fairseq turns into hydra overrides, parsed at about 5 ms a
value (a list of 40,000 values took 5 minutes)."""
MAX_SETTINGS_CHARS = {"cfg": 1_000_000, "args": 200_000}
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

MAX_NAMESPACES = 16
"""A fairseq checkpoint's settings hold one ``Namespace`` (the model's, or the legacy
``args``)."""
_SETTING_LEAVES = (str, int, float, bool, type(None))

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


def measure(root, file: str, where: str, max_nodes: int, trust_helps: bool = True, any_leaf: bool = False):
    """(values, characters) of ``root`` counted as a copy would count them; raises
    past ``max_nodes`` values, at a cycle, past :data:`MAX_DEPTH` levels, or (unless
    ``any_leaf``: a trusted file may hold other objects) at a value that is not data.
    Iterative: the size of each container is computed once. ``trust_helps``: whether
    the refusal suggests the trust switch (not where the switch checks it too)."""
    sizes: Dict[int, int] = {}
    chars: Dict[int, int] = {}
    keep = []  # the containers measured, alive while their ids are keys
    on_path = set()
    stack = [(root, 0, False)]
    while stack:
        value, depth, done = stack.pop()
        if not isinstance(value, _CONTAINERS):
            if not any_leaf and not _leaf_ok(value):
                raise UntrustedCheckpointError(file, f"{where} holds a {_describe(value)}, which is not data a "
                                               "fairseq checkpoint holds", trust_helps)
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
                    "more than a fairseq checkpoint holds", trust_helps)  # (where: 'it', 'its cfg', 'its args')
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise UntrustedCheckpointError(file, f"{where} contains itself (a cycle), which a fairseq checkpoint "
                                           "never does", trust_helps)
        if depth > MAX_DEPTH:
            raise UntrustedCheckpointError(file, f"{where} is nested more than {MAX_DEPTH} levels deep", trust_helps)
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


def _walk_settings(value, path, out, file):
    """Every leaf of the settings with its dotted path (shared values once per path);
    raises past :data:`MAX_NAMESPACES` namespaces."""
    namespaces = 0
    stack = [(value, path)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, argparse.Namespace):
            namespaces += 1
            if namespaces > MAX_NAMESPACES:
                raise UntrustedCheckpointError(
                    file, f"its settings hold more than {MAX_NAMESPACES} namespaces (counted as a copy would count "
                    "them), far more than fairseq writes; fairseq turns each into hundreds of overrides",
                    trust_helps=False)
            value = vars(value)
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        else:
            out.append((path, value))


def strings_within(value):
    """The strings in a literal's value (a string, or the strings inside lists,
    tuples, sets and dicts)."""
    stack, found = [value], []
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
    return found


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
        shown = short_repr(name, 60)
        raise UntrustedCheckpointError(
            file, f"its setting {setting} = {shown} names no registered {what} (a model of another --user-dir "
            "needs that directory imported first, e.g. --user-dir on the command line)", trust_helps=False)


BENCHMARK_TASKS = frozenset({"dummy_lm", "dummy_masked_lm", "dummy_mt"})
"""fairseq's benchmark tasks (``fairseq/benchmark``), which make their data from their
settings when they are set up (``dummy_mt``: a dictionary of ``dict_size`` symbols, built
in a Python loop, and tensors of ``src_len``): refused wherever a checkpoint names a task,
since the hub, the analyses and a nested task (wav2vec 2.0's ``w2v_args.task``) set up
the task a checkpoint names (``dict_size = 8,000,000`` took 14 s and 1.5 GB)."""


def _not_a_benchmark(file: str, setting: str, name):
    if isinstance(name, str) and name in BENCHMARK_TASKS:
        raise UntrustedCheckpointError(
            file, f"its setting {setting} = {name!r} names one of fairseq's benchmark tasks, which make their data "
            "from their settings when set up (a dictionary of dict_size symbols); a checkpoint's task reads its "
            "data", trust_helps=False)


def check_names(cfg, args, file: str):
    """The architecture, task and components the settings name are registered ones;
    no task they name, nested ones included, is one of :data:`BENCHMARK_TASKS`."""
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
        # every task section (cfg.task, a nested model's: cfg.model.w2v_args.task), whose
        # "task" fairseq's setup_task takes where it is a string, else its "_name"; and every
        # Namespace, which becomes settings of its own, its "task" included
        for path, container, items in _containers({"cfg": cfg}):
            if path.endswith(".task"):
                keys = ("task", "_name")
            elif isinstance(container, argparse.Namespace):
                keys = ("task",)
            else:
                continue
            for key in keys:
                name = items.get(key)
                if key == "_name" or isinstance(name, str):
                    _registered(file, f"{path}.{key}", name, TASK_REGISTRY, "task")
                    _not_a_benchmark(file, f"{path}.{key}", name)
        for group in REGISTRY_GROUPS:
            _registered(file, f"cfg.{group}._name", _get(cfg.get(group), "_name"),
                        REGISTRIES[group]["registry"], group.replace("_", "-"))
    if args is not None:
        if not isinstance(args, argparse.Namespace):
            raise MalformedCheckpointError(file, f"its settings (args) are a {_describe(args)}, not a Namespace")
        _registered(file, "args.arch", getattr(args, "arch", None), models, "architecture")
        _registered(file, "args.task", getattr(args, "task", None), TASK_REGISTRY, "task")
        _not_a_benchmark(file, "args.task", getattr(args, "task", None))
        for group in REGISTRY_GROUPS:
            value = getattr(args, group, None)
            if isinstance(value, str):
                _registered(file, f"args.{group}", value, REGISTRIES[group]["registry"], group.replace("_", "-"))


def bound_settings(settings: Dict[str, object], file: str, plain: bool = True):
    """The settings (``{"cfg": ..., "args": ...}``) hold no cycle and at most
    :data:`MAX_SETTINGS_NODES` values and :data:`MAX_SETTINGS_CHARS` characters counted
    as a copy would count them; trusted or not (``plain``: only data), so the
    refusal does not suggest trusting the file.

    Every ``Namespace`` in them, the legacy ``args`` or one within ``cfg`` (a model's
    settings written by an older fairseq; wav2vec 2.0's and HuBERT's fine-tuned models
    hold their pre-training settings as ``cfg.model.w2v_args``), is bounded as ``args``
    are, its strings read as literals included: fairseq turns each into hydra
    overrides (``convert_namespace_to_omegaconf``, also within ``build_model``), whose
    parse grows with the square of a list's values."""
    for key, value in settings.items():
        if value is not None:
            nodes, chars = measure(value, file, f"its {key}", MAX_SETTINGS_NODES[key], trust_helps=False,
                                   any_leaf=not plain)
            if chars > MAX_SETTINGS_CHARS[key]:
                raise UntrustedCheckpointError(
                    file, f"its {key} expands to more than {MAX_SETTINGS_CHARS[key]} characters when copied",
                    trust_helps=False)
            namespaces = _namespaces(value, key)
            if len(namespaces) > MAX_NAMESPACES:
                raise UntrustedCheckpointError(
                    file, f"its settings hold more than {MAX_NAMESPACES} namespaces, far more than fairseq writes; "
                    "fairseq turns each into hundreds of overrides", trust_helps=False)
            for where, namespace in namespaces:
                _bound_namespace(namespace, where, file, plain)


def _namespaces(value, path: str):
    """``(dotted path, Namespace)`` of each ``Namespace`` in ``value`` (a shared one
    once), the most deeply nested first: a refusal names the one that holds the
    excess."""
    found, seen, stack = [], set(), [(value, path, 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, argparse.Namespace):
            if id(value) in seen:
                continue
            seen.add(id(value))
            found.append((depth, path, value))
            value = vars(value)
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}", depth + 1) for k, v in value.items())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value))
    return [(path, namespace) for _, path, namespace in sorted(found, key=lambda f: -f[0])]


def _bound_namespace(namespace: argparse.Namespace, where: str, file: str, plain: bool):
    """At most ``args``' bounds of values (its strings read as literals included) and
    characters (see :func:`bound_settings`)."""
    limit, chars_limit = MAX_SETTINGS_NODES["args"], MAX_SETTINGS_CHARS["args"]
    nodes, chars = measure(namespace, file, f"its {where}", limit, trust_helps=False, any_leaf=not plain)
    if chars > chars_limit:
        raise UntrustedCheckpointError(
            file, f"its {where} expands to more than {chars_limit} characters when copied (fairseq turns such "
            "a Namespace into hydra overrides)", trust_helps=False)
    if nodes + _read_as_literals(namespace) > limit:
        raise UntrustedCheckpointError(
            file, f"its {where} {'expand' if where == 'args' else 'expands'} to more than {limit} values once "
            "fairseq reads their strings as literals "
            "(fairseq's upgrade of older settings turns a string such as '[0, 0, ...]' into one hydra override, "
            "parsed in a time that grows with the square of its values)", trust_helps=False)


def _read_as_literals(args) -> int:
    """The values that the strings of legacy ``args`` add when fairseq's upgrade of older
    settings reads them with ``ast.literal_eval`` (those of a field that is not a
    string; counted here for every string that reads as a literal, in the namespaces
    the args hold too)."""
    added, texts, stack = 0, [], [args]
    while stack:  # (the strings of the args, of the namespaces within them too: fairseq expands those)
        value = stack.pop()
        if isinstance(value, argparse.Namespace):
            stack.extend(vars(value).values())
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset)):
            stack.extend(value)
        elif isinstance(value, str):
            texts.append(value)
    for text in texts:  # (every one: a comment or a line continuation may come before the list)
        try:
            value = ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        stack = [value]
        while stack:
            value = stack.pop()
            added += 1
            if isinstance(value, dict):
                stack.extend(value.keys())
                stack.extend(value.values())
            elif isinstance(value, (list, tuple, set, frozenset)):
                stack.extend(value)
        added -= 1  # (the string itself was counted)
    return added


def check_settings(settings: Dict[str, object], file: str, plain: bool = True, bounded: bool = False):
    """Bounded (:func:`bound_settings`, unless ``bounded``: the caller has checked
    it); plain values only (unless not ``plain``: a trusted file may hold other
    objects); no interpolation, also once a setting is read as a literal; literals
    where fairseq evaluates (see the module docstring); no file named
    (:func:`~fairseq_localness.checkpoint.files.drop_file_settings`)."""
    if not bounded:
        bound_settings(settings, file, plain)
    leaves = []
    for top, value in settings.items():
        if value is not None:
            _walk_settings(value, top, leaves, file)
    strings = {}
    for path, value in leaves:
        shown = short_repr(value)
        if plain and not isinstance(value, _SETTING_LEAVES):
            raise UntrustedCheckpointError(
                file, f"its setting {path} is a {_describe(value)}, which fairseq's settings never are", trust_helps=False)
        if not isinstance(value, str):
            continue
        name = path.rsplit(".", 1)[-1]
        if name in EVALUATED_SETTINGS:
            try:
                literal(value)
            except NotALiteral as e:
                raise UntrustedCheckpointError(
                    file, f"its setting {path} = {shown} is not a Python literal ({e}), and fairseq evaluates "
                    "that setting; this package parses it as a literal and runs nothing", trust_helps=False)
        read = []
        if "$" in value or "\\" in value:  # fairseq's upgrade of older settings reads them with ast.literal_eval
            try:
                read = strings_within(ast.literal_eval(value))
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                pass
        if any("${" in text for text in [value, *read]):
            raise UntrustedCheckpointError(
                file, f"its setting {path} = {shown} is an OmegaConf interpolation (or a literal of one), which "
                "fairseq never writes and OmegaConf would resolve when the setting is read", trust_helps=False)
        strings[path] = value
    remember_settings(file, strings)
    check_sizes(leaves, file)
    drop_file_settings(settings, file)
    command_line_generation(settings, file)


METERS = frozenset({"AverageMeter", "SumMeter", "ConcatTensorMeter", "TimeMeter", "StopwatchMeter",
                    "LocalityMetricMeter"})
"""The meters of fairseq's logging, which its metrics state names by class, and this
package's (:class:`~fairseq_localness.modules.observe.LocalityMetricMeter`)."""
_NUMBER = (int, float)


def _tensors(value, file, where):
    if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                             for k, v in value.items())):
        raise MalformedCheckpointError(file, f"its {where} is not a dict of named tensors, as fairseq writes it")


def _number(value, file, where, none=True, finite=False):
    """A number as fairseq writes one: a Python number, or (after a distributed run's
    all-reduce, or from numpy) a one-element tensor or numeric array; with ``finite``,
    not infinite or NaN (a best score of ``-inf`` would keep fairseq from ever writing
    ``checkpoint_best.pt`` again in a resumed run)."""
    if value is None and none:
        return
    if not (isinstance(value, _NUMBER) and not isinstance(value, bool)
            or isinstance(value, torch.Tensor) and value.numel() == 1
            or isinstance(value, (np.ndarray, np.generic)) and value.size == 1 and value.dtype.kind in "biuf"):
        raise MalformedCheckpointError(file, f"its {where} is a {_describe(value)}, not a number")
    if finite:
        try:
            number = value if isinstance(value, _NUMBER) else value.item()
            finite = math.isfinite(number)
        except (TypeError, RuntimeError):  # (a complex number; a tensor without data)
            number, finite = value, False
        if not finite:
            raise MalformedCheckpointError(file, f"its {where} is {short_repr(number)}, not a finite number")


MAX_METERS = 1_000
"""The most meters one aggregator of a checkpoint's metrics may hold (fairseq-train's hold
about 13; fairseq's ``MetersDict`` adds each in a time that grows with their number:
40,000 took a minute to load)."""

FAIRSEQ_METERS = {
    # meter: (the entries of its state, those it may leave out)
    "AverageMeter": ({"val", "sum", "count", "round"}, {"round"}),
    "SumMeter": ({"sum", "round"}, {"round"}),
    "TimeMeter": ({"init", "n", "round", "start"}, {"n", "round", "start"}),
    "StopwatchMeter": ({"sum", "n", "round"}, {"round"}),
    "ConcatTensorMeter": ({"tensor"}, set()),
}
"""What fairseq's own meters keep (``fairseq.logging.meters``: their ``state_dict``)."""


def _check_meter(meter: str, state: dict, file: str, where: str):
    """A state of one of fairseq's meters (:data:`FAIRSEQ_METERS`): its entries, each a
    number (``val`` may be None) or a real array (``--eval-bleu``'s counts: numpy arrays),
    the arrays of one meter of one shape, or the concatenated tensor; its rounding a
    small integer or None. fairseq computes with them when it logs: ``round(value,
    -10**8)`` took minutes a line, and a ``TimeMeter`` of a 15,000 x 1 and a 15,000-value
    tensor broadcast into 15,000 x 15,000 (2.5 GB)."""
    entries, optional = FAIRSEQ_METERS[meter]
    shapes = set()
    if set(state) - entries or not entries - optional <= set(state):
        raise MalformedCheckpointError(file, f"its {where} has the entries {sorted(state)}, not a {meter}'s "
                                       f"({', '.join(sorted(entries))})")
    for entry, value in state.items():
        if entry == "round":
            _check_rounding(value, file, where)
        elif entry == "tensor":
            if value is not None and not isinstance(value, torch.Tensor):
                raise MalformedCheckpointError(file, f"its {where} tensor is a {_describe(value)}, not a tensor")
        elif not (value is None and entry == "val"):
            if isinstance(value, torch.Tensor) and not value.is_complex() and value.device.type != "meta" \
                    or isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
                if (value.size if isinstance(value, np.ndarray) else value.numel()) > 1:
                    shapes.add(tuple(value.shape))
            else:
                _number(value, file, f"{where} {entry}", none=False)
    if len(shapes) > 1:  # (arrays of one shape add and divide as they are; others broadcast)
        raise MalformedCheckpointError(file, f"its {where} holds arrays of the shapes {sorted(shapes)}, where "
                                       f"fairseq's {meter} computes with arrays of one shape")


def _check_locality_meter(state: dict, file: str, where: str):
    """A :class:`~fairseq_localness.modules.observe.LocalityMetricMeter`'s state: its
    weighted sum and weight (numbers) and its rounding (a small integer or None)."""
    if set(state) - {"sum", "weight", "round"} or not {"sum", "weight"} <= set(state):
        raise MalformedCheckpointError(file, f"its {where} has the entries {sorted(state)}, not a metric meter's "
                                       "(sum, weight, round)")
    for entry in ("sum", "weight"):
        value = state[entry]
        _number(value, file, f"{where} {entry}", none=False)
        if isinstance(value, torch.Tensor) and (value.is_complex() or value.device.type == "meta"):
            raise MalformedCheckpointError(file, f"its {where} {entry} is a {value.dtype} tensor on "
                                           f"{value.device.type}, not a real number")
        try:
            number = float(value)
        except (OverflowError, ValueError, TypeError, RuntimeError):
            raise MalformedCheckpointError(file, f"its {where} {entry} is not a number a float holds") from None
        # (a sum may be NaN or infinite, as fairseq's AverageMeter keeps one after an overflow step)
        if entry == "weight" and not (math.isfinite(number) and number >= 0):
            raise MalformedCheckpointError(file, f"its {where} weight is not a finite number >= 0")
    _check_rounding(state.get("round"), file, where)


def _check_rounding(value, file: str, where: str):
    """A meter's rounding (the digits fairseq's ``safe_round`` keeps): a small integer or None."""
    if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 20):
        raise MalformedCheckpointError(file, f"its {where} round is {short_repr(value, 40)}, not an integer from 0 "
                                       "to 20 or None")


def check_structure(state, file: str):
    """The entries fairseq reads from a checkpoint have the types fairseq writes: the
    weights (``model``, which every checkpoint holds; ``criterion``, the EMA's) dicts
    of named tensors, the optimizer history's counters and names, and what resuming
    reads of ``extra_state`` (the epoch iterator's position, the best score, the
    metrics with fairseq's own meters), the counts within their ranges
    (:func:`~fairseq_localness.checkpoint.resume.check_history`). Other entries are
    left as they are."""
    if "model" not in state:
        raise MalformedCheckpointError(file, "it holds no weights (no 'model' entry), which every fairseq "
                                       "checkpoint has")
    _tensors(state["model"], file, "model")
    if state.get("criterion") is not None:
        _tensors(state["criterion"], file, "criterion")
    history = state.get("optimizer_history")
    if history is not None:
        if not isinstance(history, list) or not all(isinstance(h, dict) for h in history):
            raise MalformedCheckpointError(file, "its optimizer_history is not a list of dicts")
        for h in history:
            for key in ("criterion_name", "optimizer_name"):
                if key in h and not isinstance(h[key], str):
                    raise MalformedCheckpointError(file, f"its optimizer_history's {key} is not a string")
            if "num_updates" in h and (not isinstance(h["num_updates"], int) or isinstance(h["num_updates"], bool)):
                raise MalformedCheckpointError(file, "its optimizer_history's num_updates is not an integer")
    extra = state.get("extra_state")
    if extra is None:
        check_history(state, file)
        return
    if not isinstance(extra, dict):
        raise MalformedCheckpointError(file, f"its extra_state is a {_describe(extra)}, not a dict")
    for key in ("best", "val_loss"):
        if key in extra:
            _number(extra[key], file, f"extra_state's {key}", finite=key == "best")
    if "previous_training_time" in extra:
        _number(extra["previous_training_time"], file, "extra_state's previous_training_time", none=False)
    iterator = extra.get("train_iterator")
    if iterator is not None:
        if not (isinstance(iterator, dict)
                and all(isinstance(iterator.get(k, 0), int) and not isinstance(iterator.get(k, 0), bool)
                        for k in ("epoch", "iterations_in_epoch", "version"))
                and isinstance(iterator.get("shuffle", True), bool)):
            raise MalformedCheckpointError(file, "its extra_state's train_iterator is not fairseq's (epoch, "
                                           "iterations_in_epoch, shuffle)")
    for key in ("ema", "ema_fp32_params"):
        if extra.get(key) is not None:
            _tensors(extra[key], file, f"extra_state's {key}")
    metrics = extra.get("metrics")
    if metrics is not None:
        ok = isinstance(metrics, dict) and all(
            isinstance(name, str) and isinstance(meters, list) and all(
                isinstance(m, (tuple, list)) and len(m) == 4 and isinstance(m[0], int) and isinstance(m[1], str)
                and m[2] in METERS and isinstance(m[3], dict) and all(isinstance(k, str) for k in m[3])
                for m in meters)
            for name, meters in metrics.items())
        if not ok:
            raise MalformedCheckpointError(file, "its extra_state's metrics are not fairseq's (priority, name, "
                                           f"meter, state) with its own meters ({', '.join(sorted(METERS))})")
        for name, meters in metrics.items():
            if len(meters) > MAX_METERS:
                raise MalformedCheckpointError(
                    file, f"its extra_state's metrics {name!r} hold {len(meters):,} meters, more than the "
                    f"{MAX_METERS:,} a resumed run logs (fairseq adds each in a time that grows with their number)")
            for _, key, meter, meter_state in meters:
                where = f"extra_state's metrics {name}/{key}"
                if meter == "LocalityMetricMeter":
                    _check_locality_meter(meter_state, file, where)
                else:
                    _check_meter(meter, meter_state, file, where)
    check_history(state, file)


def check_state(state, file: str, names: bool = True):
    """Check a loaded checkpoint (see the module docstring); raises
    :class:`~fairseq_localness.checkpoint.errors.CheckpointError`. ``names``: also
    check that the components it names are registered (imports fairseq)."""
    if not isinstance(state, dict):
        raise MalformedCheckpointError(file, f"it holds a {_describe(state)}, not a fairseq checkpoint's dict")
    settings = {key: state.get(key) for key in ("cfg", "args")}
    bound_settings(settings, file)
    measure(state, file, "it", MAX_NODES)
    check_structure(state, file)
    check_finite(state, file)
    check_settings(settings, file, bounded=True)  # (bounded above, before the whole state is measured)
    if names:
        check_names(settings["cfg"], settings["args"], file)

