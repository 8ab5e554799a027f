"""Flat fp32 master weights for ``--bf16``, and one multi-tensor copy per sync, in
fairseq's ``FP16Optimizer``.

What fairseq does wrong (for speed; the numbers are right): ``--fp16`` and ``--bf16``
keep fp32 master copies of the model's weights. With ``--fp16`` they are one flat
tensor per device, which the optimizer steps as one parameter; ``--bf16`` turns the
flattening off (``FP16Optimizer.build_optimizer``: "mixed precision is faster on TPUs
without flat grads"), also off a TPU. Every parameter tensor then has a master of its
own, which the update copies its gradient into, takes the norm of, zeroes and steps
one by one: fairseq's own ``Adam`` (where apex's fused Adam is not installed) is a
Python loop of about eight operations per tensor. One ``--bf16`` update of the
transformer at IWSLT size (253 parameter tensors, on the CPU) is 3,969 operator calls,
about 3,000 of them per-tensor bookkeeping of the optimizer; the Full Dual Contextual
model, with 373 tensors, makes 1.48 times as many. On a GPU each is a kernel launch,
where a Transformer-base training step is bound by its launches (docs/benchmark.md, "On
a GPU"). Flat or not, the gradients are copied into the masters and the weights back
one tensor at a time (a ``copy_`` each, twice per update).

What the fix changes (:func:`patch_mixed_precision`):

* ``--bf16`` off a TPU flattens as ``--fp16`` does, unless ``--fp16-no-flatten-grads``
  is given, the optimizer is ``composite`` or cannot step flat parameters (fairseq's
  per-tensor masters then, as before);
* on a CPU (``--bf16 --cpu``) the flat master is keyed by the parameters' device
  index (None) where fairseq asks CUDA for its current device (``--fp16`` still needs
  CUDA, as in fairseq);
* each sync of a flat master is one ``torch._foreach_copy_`` over all tensors (on CUDA
  a few launches for all of them), and a parameter without a gradient gets a zero
  gradient in one ``torch._foreach_zero_``, as fairseq's copied zeros;
* resuming, into a flat master, an optimizer state saved per tensor (a ``--bf16`` run
  before this fix, or one with ``--fp16-no-flatten-grads``): the per-tensor states are
  joined in the parameters' order. Every state of fairseq's optimizers that has the
  shape of its parameter is element-wise (Adam's moments), so the join is exact where
  every tensor has a state (fairseq's per-tensor runs give each one); the step count is
  the largest of the tensors'. And the other way: a flat state resumed with
  ``--fp16-no-flatten-grads`` (or on a TPU) is split into the tensors' states. The
  resume check (:mod:`fairseq_localness.checkpoint.resume`) checks the state as it will
  be loaded, and the load converts it again.

The update is the same element-wise arithmetic; only the gradient norm (logged, and
used by ``--clip-norm``) is the norm of one flat vector instead of a norm of per-tensor
norms, which can differ in the last bits. The test that fails without it:
``tests/test_mixed_precision.py``.
"""
import logging
from typing import Dict, List, Optional, Sequence

import torch

from fairseq_localness.compat._patching import replaces

_MARK = "_fairseq_localness_mixed_precision"
logger = logging.getLogger(__name__)


def flattens(cfg) -> bool:
    """Whether ``FP16Optimizer`` keeps one flat fp32 master per device for ``cfg``:
    unless ``--fp16-no-flatten-grads``, or a TPU (where fairseq says per-tensor
    masters are faster)."""
    return not getattr(cfg.common, "fp16_no_flatten_grads", False) and not getattr(cfg.common, "tpu", False)


def _flat_views(flat: torch.Tensor, params: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """The slices of the flat tensor ``flat`` that hold ``params``, in their order."""
    views, offset = [], 0
    for p in params:
        views.append(flat[offset: offset + p.numel()])
        offset += p.numel()
    return views


def _by_device(params, trainable_only: bool) -> Dict[Optional[int], list]:
    """``params`` grouped by device index, in order (fairseq's grouping: its gradient
    sync takes the trainable ones only, its weight sync all)."""
    groups: Dict[Optional[int], list] = {}
    for p in params:
        if p.requires_grad or not trainable_only:
            groups.setdefault(p.device.index, []).append(p)
    return groups


def _sync_grads(self):
    """fairseq's gradient sync of a flat master: each device's gradients into its flat
    fp32 gradient, as one multi-tensor copy (zeros for a parameter without one)."""
    if not self._needs_sync:
        return
    by_device = _by_device(self.fp16_params, trainable_only=True)
    with torch.no_grad():
        for device, flat in self.fp32_params.items():
            params = by_device.get(device, [])
            views = _flat_views(flat.grad, params)
            pairs = [(view, p.grad.reshape(-1)) for view, p in zip(views, params) if p.grad is not None]
            if pairs:
                torch._foreach_copy_([view for view, _ in pairs], [grad for _, grad in pairs])
            missing = [view for view, p in zip(views, params) if p.grad is None]
            if missing:
                torch._foreach_zero_(missing)
    self._needs_sync = False


def _sync_params(self):
    """fairseq's weight sync of a flat master: each device's flat fp32 weights back into
    the model's parameters, as one multi-tensor copy."""
    by_device = _by_device(self.fp16_params, trainable_only=False)
    with torch.no_grad():
        for device, flat in self.fp32_params.items():
            params = by_device.get(device, [])
            if params:
                views = [view.view_as(p) for view, p in zip(_flat_views(flat.detach(), params), params)]
                torch._foreach_copy_([p.detach() for p in params], views)


def _cpu_flat_params(params) -> Dict[None, torch.nn.Parameter]:
    """fairseq's flat fp32 master for parameters on a CPU (fairseq's asks CUDA for its
    device): ``{None: flat}``, None being a CPU parameter's ``device.index``."""
    total = sum(p.numel() for p in params)
    flat = params[0].new_empty(total, dtype=torch.float32)
    with torch.no_grad():
        torch._foreach_copy_(_flat_views(flat, params), [p.detach().reshape(-1) for p in params])
    flat = torch.nn.Parameter(flat)
    flat.grad = flat.data.new_zeros(total)
    return {None: flat}


_MAX_STATE_KEYS = 16
"""The most entries a parameter's saved state may have to be joined (Adam's are step,
exp_avg, exp_avg_sq and max_exp_avg_sq)."""


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_entries(entries) -> None:
    """Each parameter's saved state a dict of at most :data:`_MAX_STATE_KEYS` named
    values, else ValueError."""
    if not all(isinstance(entry, dict) and len(entry) <= _MAX_STATE_KEYS and all(isinstance(k, str) for k in entry)
               for entry in entries):
        raise ValueError(f"a parameter's state is not a dict of at most {_MAX_STATE_KEYS} named values")


def _joined_state(state_dict: dict, shapes: Sequence[torch.Size]) -> dict:
    """An optimizer state saved per parameter tensor (``shapes``: the parameters', in
    order) as the state of one flat parameter: each state tensor of its parameter's
    shape joined in order (zeros for a parameter without state), the step count the
    largest, any other number the same for all. Raises ValueError, naming what is
    wrong, for anything else (the state comes from a checkpoint: its layout is checked
    before anything is joined)."""
    groups, states = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(groups, list) or not isinstance(states, dict):
        raise ValueError("it is not torch's (state, param_groups)")
    if len(groups) != 1:
        raise ValueError(f"the saved optimizer state has {len(groups)} parameter groups; a flat fp32 master has one "
                         "(resume with --fp16-no-flatten-grads, or with --reset-optimizer)")
    ids = groups[0].get("params") if isinstance(groups[0], dict) else None
    if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
        raise ValueError("its param_groups[0] names no list of parameters")
    if len(set(ids)) != len(ids) or not set(states) <= set(ids):
        raise ValueError("its state does not name each parameter of its group once")
    if len(ids) != len(shapes):
        raise ValueError(f"the saved optimizer state has {len(ids)} parameter tensors, the model {len(shapes)} "
                         "(resume with --reset-optimizer)")
    entries = [states.get(i, {}) for i in ids]
    _check_entries(entries)
    joined = {}
    for key in sorted({key for entry in entries for key in entry}):
        values = [entry.get(key) for entry in entries]
        present = [v for v in values if v is not None]
        if key == "step":
            if not all(_is_number(v) or torch.is_tensor(v) and v.dim() == 0 for v in present):
                raise ValueError("its step counts are not numbers")
            joined[key] = max(present, key=float)
        elif all(torch.is_tensor(v) for v in present):
            if any(tuple(v.shape) != tuple(shape) for v, shape in zip(values, shapes) if v is not None):
                raise ValueError(f"its {key!r} of a parameter is not of the parameter's shape: not of this model")
            like = present[0]
            joined[key] = torch.cat([(v if v is not None else like.new_zeros(shape)).reshape(-1)
                                     for v, shape in zip(values, shapes)])
        elif all(_is_number(v) for v in present) and len(set(present)) == 1:
            joined[key] = present[0]
        else:
            raise ValueError(f"the saved optimizer state {key!r} differs between parameter tensors and cannot be "
                             "joined into a flat fp32 master (resume with --fp16-no-flatten-grads)")
    group = dict(groups[0], params=[0])
    return dict(state_dict, state={0: joined} if joined else {}, param_groups=[group])


def _split_state(state_dict: dict, shapes: Sequence[torch.Size]) -> dict:
    """The state of one flat parameter as the states of the parameter tensors of
    ``shapes`` (in order): each state tensor of the flat parameter's size split into
    views of their shapes, every other value (the step count) the same for each. Raises
    ValueError, naming what is wrong, for anything else."""
    groups, states = state_dict.get("param_groups"), state_dict.get("state")
    if not isinstance(states, dict) or len(groups) != 1 or not isinstance(groups[0], dict):
        raise ValueError("it is not torch's (state, param_groups) of one group")
    (pid,) = groups[0]["params"]
    if not isinstance(pid, int) or isinstance(pid, bool) or not set(states) <= {pid}:
        raise ValueError("its state does not name the parameter of its group")
    entry = states.get(pid, {})
    _check_entries([entry])
    sizes = [shape.numel() for shape in shapes]
    split: List[dict] = [{} for _ in shapes]
    for key, value in entry.items():
        if torch.is_tensor(value) and value.dim() > 0:
            if value.dim() != 1 or value.numel() != sum(sizes):
                raise ValueError(f"its {key!r} has {value.numel():,} values, the model's parameters "
                                 f"{sum(sizes):,}: not of this model")
            for state, part, shape in zip(split, value.split(sizes), shapes):
                state[key] = part.view(shape)
        elif _is_number(value) or torch.is_tensor(value):
            for state in split:
                state[key] = value
        else:
            raise ValueError(f"its {key!r} is a {type(value).__name__}, not a tensor or a number")
    group = dict(groups[0], params=list(range(len(shapes))))
    return dict(state_dict, state={i: state for i, state in enumerate(split) if state}, param_groups=[group])


def state_to_load(optimizer, state_dict):
    """The optimizer state that ``optimizer`` (fairseq's) loads from ``state_dict``:
    joined into one flat state (:func:`_joined_state`) where the optimizer has a flat
    fp32 master and the state was saved per parameter tensor, split into per-tensor
    states (:func:`_split_state`) where it has one master per tensor and the state was
    saved flat (a ``--bf16`` run resumed with ``--fp16-no-flatten-grads``); ``state_dict``
    itself otherwise. Raises ValueError where the state's layout allows neither."""
    masters = getattr(optimizer, "fp32_params", None)
    if masters is None or not isinstance(state_dict, dict) or not isinstance(state_dict.get("param_groups"), list):
        return state_dict
    groups = state_dict["param_groups"]
    saved_flat = len(groups) == 1 and isinstance(groups[0], dict) and isinstance(groups[0].get("params"), list) \
        and len(groups[0]["params"]) == 1
    shapes = [p.shape for p in optimizer.fp16_params]
    if optimizer.has_flat_params:
        if len(masters) != 1 or saved_flat:
            return state_dict  # (a flat state: the resume check judges it)
        return _joined_state(state_dict, shapes)
    if saved_flat and isinstance(masters, list) and len(masters) == len(shapes) > 1:
        return _split_state(state_dict, shapes)
    return state_dict


def patch_mixed_precision():
    """Apply the fix (idempotent): see the module docstring."""
    from fairseq import optim
    from fairseq.optim import fp16_optimizer

    mixin, wrapper = fp16_optimizer._FP16OptimizerMixin, fp16_optimizer.FP16Optimizer
    if getattr(wrapper.build_optimizer.__func__, _MARK, False):
        return
    original_build = wrapper.build_optimizer.__func__
    original_fp32_params = mixin.build_fp32_params.__func__
    original_sync_grads, original_sync_params = mixin._sync_fp16_grads_to_fp32, mixin._sync_fp32_params_to_fp16
    original_load = mixin.load_state_dict

    def build_optimizer(cls, cfg, params, **kwargs):
        # (the composite optimizer needs its parameters apart: it steps groups of them)
        if not getattr(cfg.common, "bf16", False) or not flattens(cfg) \
                or getattr(cfg.optimizer, "_name", None) == "composite":
            return original_build(cls, cfg, params, **kwargs)
        fp32_params = cls.build_fp32_params(cfg.optimizer, params, flatten=True)
        fp32_optimizer = optim.build_optimizer(cfg.optimizer, [fp32_params])
        if not fp32_optimizer.supports_flat_params:
            logger.info("%s cannot step a flat fp32 master: one per parameter tensor, as fairseq's --bf16",
                        type(fp32_optimizer).__name__)
            fp32_params = cls.build_fp32_params(cfg.optimizer, params, flatten=False)
            fp32_optimizer = optim.build_optimizer(cfg.optimizer, fp32_params)
        return cls(cfg, params, fp32_optimizer, fp32_params, **kwargs)

    def build_fp32_params(cls, args, params, flatten=True):
        # (bf16 only: fairseq's --fp16 needs CUDA, and stays refused on a CPU)
        if flatten and params and params[0].device.type == "cpu" and params[0].dtype == torch.bfloat16:
            return _cpu_flat_params(params)
        return original_fp32_params(cls, args, params, flatten=flatten)

    def sync_grads(self):
        return _sync_grads(self) if self.has_flat_params else original_sync_grads(self)

    def sync_params(self):
        return _sync_params(self) if self.has_flat_params else original_sync_params(self)

    def load_state_dict(self, state_dict, optimizer_overrides=None):
        loaded = state_to_load(self, state_dict)
        if loaded is not state_dict:
            logger.info("the optimizer state %s to the fp32 master's layout (%d parameter tensors)",
                        "joined" if self.has_flat_params else "split", len(self.fp16_params))
        return original_load(self, loaded, optimizer_overrides)

    wrapper.build_optimizer = classmethod(replaces(build_optimizer, original_build, _MARK))
    mixin.build_fp32_params = classmethod(replaces(build_fp32_params, original_fp32_params, _MARK))
    mixin._sync_fp16_grads_to_fp32 = replaces(sync_grads, original_sync_grads, _MARK)
    mixin._sync_fp32_params_to_fp16 = replaces(sync_params, original_sync_params, _MARK)
    mixin.load_state_dict = replaces(load_state_dict, original_load, _MARK)
