"""What a resumed ``fairseq-train`` takes from its checkpoint, checked before a step.

Resuming (``checkpoint_last.pt``, ``--restore-file``) hands fairseq's trainer more
than weights: the optimizer history (the update count, the learning-rate
scheduler's state), the optimizer's state (its moments and hyperparameters, the fp16
loss scale) and the data iterator's position. fairseq reads each of them as it
wrote them and fails (or worse, goes on) at the first step when they are not:
``num_updates = 2**70`` aborts in C++, ``-1000`` gives a negative learning rate and
trains 1,000 updates past ``--max-update``, a string in Adam's ``betas``, a moment
of the wrong shape or a position past the epoch's end each end in a traceback.

- :func:`check_history` (every load, with the other data checks of
  :func:`~fairseq_localness.checkpoint.settings.check_structure`): counts within
  their ranges (``num_updates`` and the iterator's position in ``0 .. 2**31``, the
  epoch in ``1 .. 2**31``), the scheduler's state numbers, the training time a
  finite number of seconds;
- against the run (:func:`guard_trainer`): the optimizer's state
  (:func:`check_optimizer_state`: as many parameter groups and parameters as the
  run's optimizer, each moment a tensor of its parameter's shape or a number, each
  hyperparameter of the type the run's has and within its range, the fp16 loss
  scale a positive number), the scheduler's state, just before fairseq loads them
  into the optimizer it built for the run;
  the iterator's position within the epoch's batches, just before fairseq
  fast-forwards to it.

A value that fails is refused in one line naming the file and the value
(:class:`~fairseq_localness.checkpoint.errors.MalformedCheckpointError`), before
the first step.
"""
import functools
import math
import os
import threading

import torch

from fairseq_localness.checkpoint.errors import MalformedCheckpointError, short_repr
from fairseq_localness.compat.mixed_precision import state_to_load

MAX_COUNT = 2 ** 31
"""The largest update count, epoch and position in an epoch a checkpoint may hold."""

_resumed = threading.local()  # .file: the checkpoint the trainer is resuming from

_NUMBER = (int, float)


def _is_number(value) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def _count(value, file: str, where: str, low: int = 0):
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_COUNT:
        raise MalformedCheckpointError(
            file, f"its {where} = {short_repr(value, 40)} is not an integer in {low} .. 2**31")


def _finite(value, file: str, where: str, low=None, high=None):
    """``value`` a finite number (a Python number, or a one-element tensor or array,
    as a distributed run's all-reduce leaves some), within ``[low, high)``."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        value = value.item()
    elif hasattr(value, "dtype") and getattr(value, "size", 0) == 1 and value.dtype.kind in "biuf":
        value = value.item()
    if not _is_number(value) or not math.isfinite(value) or (low is not None and value < low) \
            or (high is not None and value >= high):
        allowed = "a finite number" + (f" >= {low}" if low is not None else "") + (
            f" and < {high}" if high is not None else "")
        raise MalformedCheckpointError(file, f"its {where} = {short_repr(value, 40)} is not {allowed}")


def check_history(state: dict, file: str):
    """The counts and numbers a resume reads, without the run (see the module docstring)."""
    for i, entry in enumerate(state.get("optimizer_history") or []):
        if "num_updates" in entry:
            _count(entry["num_updates"], file, f"optimizer_history[{i}]'s num_updates")
        scheduler = entry.get("lr_scheduler_state")
        if scheduler is not None:
            check_scheduler_state(scheduler, file, f"optimizer_history[{i}]'s lr_scheduler_state")
    extra = state.get("extra_state")
    if not isinstance(extra, dict):
        return
    iterator = extra.get("train_iterator")
    if isinstance(iterator, dict):
        if "epoch" in iterator:
            _count(iterator["epoch"], file, "extra_state's train_iterator epoch", low=1)
        if "iterations_in_epoch" in iterator:
            _count(iterator["iterations_in_epoch"], file, "extra_state's train_iterator iterations_in_epoch")
    if "previous_training_time" in extra:
        _finite(extra["previous_training_time"], file, "extra_state's previous_training_time", low=0)


def check_scheduler_state(state, file: str, where: str = "lr_scheduler_state"):
    """fairseq's schedulers keep numbers (``best``, ``last_epoch``, ``lr``) or ``None``;
    the composite optimizer's keeps one such dict per optimizer."""
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise MalformedCheckpointError(file, f"its {where} is not a dict of named values, as fairseq writes it")
    for key, value in state.items():
        if isinstance(value, dict):
            check_scheduler_state(value, file, f"{where}'s {key}")
        elif not (value is None or _is_number(value)):
            raise MalformedCheckpointError(
                file, f"its {where}'s {key} = {short_repr(value, 40)} is not a number, as fairseq writes it")


# --------------------------------------------------------------------------- against the run
RANGES = {"lr": (0, None), "eps": (0, None), "weight_decay": (0, None), "momentum": (0, None),
          "betas": (0, 1)}
"""The ranges of the hyperparameters fairseq's optimizers share ([low, high))."""

FACTORED = {"exp_avg_sq_row": lambda shape: shape[:-1], "exp_avg_sq_col": lambda shape: shape[:-2] + shape[-1:]}
"""Adafactor's factored second moments: their shapes from the parameter's."""


def _same_kind(saved, run) -> bool:
    if _is_number(run):
        return _is_number(saved)
    if isinstance(run, (tuple, list)):
        return isinstance(saved, (tuple, list)) and len(saved) == len(run) and all(
            _same_kind(s, r) for s, r in zip(saved, run))
    if run is None or isinstance(run, (bool, str)):
        return type(saved) is type(run)
    return True  # (a kind this check does not know: fairseq's own load decides)


def _hyperparameter(value, run, file: str, where: str, key: str):
    if not _same_kind(value, run):
        raise MalformedCheckpointError(
            file, f"its {where} = {short_repr(value, 40)} is not of the kind the run's optimizer has "
            f"({short_repr(run, 40)})")
    if isinstance(run, bool) and value != run:  # (amsgrad: True wants a max_exp_avg_sq the state may not hold)
        raise MalformedCheckpointError(
            file, f"its {where} = {value!r}, the run's optimizer {run!r}: a switch of the optimizer decides which "
            "state its step reads, and the first step would fail on what the state does not hold")
    low, high = RANGES.get(key, (None, None))
    for item in value if isinstance(value, (tuple, list)) else [value]:
        if _is_number(item):
            _finite(item, file, where, low, high)


NON_NEGATIVE = frozenset({"step", "exp_avg_sq", "max_exp_avg_sq", "exp_avg_sq_row", "exp_avg_sq_col", "sum",
                          "square_avg", "acc_delta"})
"""Moments that are never negative: step counts and running averages of squares (Adam's
``exp_avg_sq``, Adafactor's, Adagrad's ``sum``, RMSprop's, Adadelta's). A negative
square's root, or a NaN anywhere, makes the first step's weights NaN, and the second
stops on "gradients are Nan/Inf" with a traceback."""


def _moment(value, param: torch.Tensor, file: str, where: str, key: str):
    low = 0 if key in NON_NEGATIVE else None
    if isinstance(value, torch.Tensor):
        shape = tuple(param.shape)
        allowed = [shape, ()] + ([FACTORED[key](shape)] if key in FACTORED and len(shape) >= 2 else [])
        if tuple(value.shape) not in allowed:
            raise MalformedCheckpointError(
                file, f"its {where} is a tensor of shape {list(value.shape)}, its parameter's is {list(shape)}: "
                "the optimizer's state is not of this model")
        if value.dtype.is_floating_point or value.dtype.is_complex:
            bad = int((~torch.isfinite(value)).sum()) + (int((value < 0).sum()) if low is not None else 0)
            if bad:
                raise MalformedCheckpointError(
                    file, f"its {where} holds {bad:,} values that are not finite"
                    + (" or are negative" if low is not None else "") + f" (of {value.numel():,}): the first "
                    "step would make the weights NaN")
        elif low is not None and value.numel() and int(value.min()) < 0:
            raise MalformedCheckpointError(file, f"its {where} holds a negative value")
        return
    if value is None or _is_number(value):
        if value is not None:
            _finite(value, file, where, low)
        return
    raise MalformedCheckpointError(file, f"its {where} is a {type(value).__name__}, not a tensor or a number")


def check_optimizer_state(optimizer, state, file: str, overrides=None):
    """``last_optimizer_state`` against ``optimizer``, the run's (a fairseq optimizer,
    whose ``.optimizer`` is torch's): see the module docstring."""
    where = "last_optimizer_state"
    if not isinstance(state, dict):
        raise MalformedCheckpointError(file, f"its {where} is a {type(state).__name__}, not a dict")
    if "loss_scale" in state:  # (fairseq divides by it)
        _finite(state["loss_scale"], file, f"{where}'s loss_scale", low=0)
        if state["loss_scale"] == 0:
            raise MalformedCheckpointError(file, f"its {where}'s loss_scale is 0; fairseq divides by it")
    inner = getattr(optimizer, "optimizer", None)
    if not isinstance(inner, torch.optim.Optimizer) or "param_groups" not in inner.state_dict():
        return  # an optimizer of another layout (a composite one): fairseq's own load decides
    try:  # a state saved per tensor for a flat fp32 master, or flat for per-tensor ones: as it will be loaded
        state = state_to_load(optimizer, state)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise MalformedCheckpointError(file, f"its {where} cannot be loaded into the run's fp32 master weights "
                                       f"(flat, or one per tensor): {exc}")
    groups, moments = state.get("param_groups"), state.get("state")
    if not (isinstance(groups, list) and all(isinstance(g, dict) for g in groups) and isinstance(moments, dict)):
        raise MalformedCheckpointError(file, f"its {where} is not torch's (state, param_groups)")
    if len(groups) != len(inner.param_groups):
        raise MalformedCheckpointError(file, f"its {where} has {len(groups)} parameter groups, the run's optimizer "
                                       f"{len(inner.param_groups)}")
    params = {}
    overrides = overrides or {}
    for i, (saved, run) in enumerate(zip(groups, inner.param_groups)):
        ids = saved.get("params")
        if not (isinstance(ids, list) and all(isinstance(p, int) and not isinstance(p, bool) for p in ids)):
            raise MalformedCheckpointError(file, f"its {where}'s param_groups[{i}] names no list of parameters")
        if len(ids) != len(run["params"]):
            raise MalformedCheckpointError(
                file, f"its {where}'s param_groups[{i}] has {len(ids)} parameters, the run's optimizer "
                f"{len(run['params'])}: the optimizer's state is not of this model")
        params.update(zip(ids, run["params"]))
        for key, value in run.items():
            if key != "params" and key in saved and key not in overrides:
                _hyperparameter(saved[key], value, file, f"{where}'s param_groups[{i}] {key}", key)
    if len(params) != sum(len(g["params"]) for g in groups):
        raise MalformedCheckpointError(file, f"its {where} names a parameter twice")
    for pid, entry in moments.items():
        if pid not in params:
            raise MalformedCheckpointError(file, f"its {where}'s state names a parameter {short_repr(pid, 20)} "
                                           "that no parameter group holds")
        if not isinstance(entry, dict):
            raise MalformedCheckpointError(file, f"its {where}'s state of parameter {pid} is not a dict")
        for key, value in entry.items():
            _moment(value, params[pid], file, f"{where}'s state[{pid}] {key}", key)


def check_iterator_position(iterator, state, file: str):
    """The position ``state`` (``extra_state["train_iterator"]``) within the epoch's
    batches of ``iterator``, the run's."""
    if not isinstance(state, dict):
        return
    position = state.get("iterations_in_epoch", 0)
    batches = len(iterator)
    end = batches if state.get("version", 1) == 1 else batches - 1  # (version 1: "finished" is the end)
    if isinstance(position, int) and position > 0 and position > end:
        raise MalformedCheckpointError(
            file, f"its extra_state's train_iterator iterations_in_epoch = {position} is past the epoch's "
            f"{batches} batches of this run")


# --------------------------------------------------------------------------- the hooks
def _file() -> str:
    """The checkpoint the trainer last resumed from."""
    return getattr(_resumed, "file", None) or "<checkpoint>"


def _wrap(method, check):
    """``method`` of one object, calling ``check(*args)`` first."""
    @functools.wraps(method)
    def checked(*args, **kwargs):
        check(*args, **kwargs)
        return method(*args, **kwargs)
    return checked


def guard_trainer(trainer_class, iterator_class):
    """Check what fairseq's ``Trainer.load_checkpoint`` takes from a checkpoint against
    the run (see the module docstring): a checkpoint path that exists but is not a
    regular file is refused (fairseq would start from scratch in silence and fail at
    the first save); the optimizer and scheduler the trainer builds for the resume
    check the state they are given; ``iterator_class.load_state_dict`` checks the
    position. Idempotent."""
    if getattr(trainer_class.load_checkpoint, "_fairseq_localness_resume", False):
        return
    from fairseq_localness.checkpoint.load import refuse_not_regular

    load_checkpoint, build_optimizer = trainer_class.load_checkpoint, trainer_class._build_optimizer

    @functools.wraps(load_checkpoint)
    def guarded_load_checkpoint(self, filename, *args, **kwargs):
        if os.path.exists(filename):
            refuse_not_regular(str(filename), os.stat(filename).st_mode)
        _resumed.file = str(filename)  # (named by the checks below, and by the iterator's after it returns)
        return load_checkpoint(self, filename, *args, **kwargs)

    @functools.wraps(build_optimizer)
    def guarded_build_optimizer(self):
        build_optimizer(self)
        optimizer, scheduler = self._optimizer, self._lr_scheduler
        optimizer.load_state_dict = _wrap(optimizer.load_state_dict, lambda state, overrides=None: (
            check_optimizer_state(optimizer, state, _file(), overrides)))
        if scheduler is not None:
            scheduler.load_state_dict = _wrap(scheduler.load_state_dict, lambda state: (
                check_scheduler_state(state, _file(), "optimizer_history's lr_scheduler_state")))

    guarded_load_checkpoint._fairseq_localness_resume = True
    trainer_class.load_checkpoint = guarded_load_checkpoint
    trainer_class._build_optimizer = guarded_build_optimizer

    load_state_dict = iterator_class.load_state_dict

    @functools.wraps(load_state_dict)
    def guarded_iterator_load(self, state_dict):
        check_iterator_position(self, state_dict, _file())
        return load_state_dict(self, state_dict)

    iterator_class.load_state_dict = guarded_iterator_load
