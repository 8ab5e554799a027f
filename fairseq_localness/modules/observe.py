"""Observability: training metrics and per-token dumps from inside the modules.

Two channels, both cheap when unused:

* **Metrics.** When :attr:`Observable.logging_metrics` says so (the one policy: the
  module is labelled and the pass is one of its ``metric_passes``, training and/or
  fairseq's validation), modules call :meth:`Observable.log_metrics` with the values
  of one forward call, detached, as one tensor; they go to fairseq's meters under the
  module's ``metric_prefix`` (set when the model is built, e.g. ``enc1``), so the mean
  Gaussian centre offset, window, gate, ... of every layer appear in fairseq's
  training and validation logs. Values stay on the device, so logging adds no sync,
  and a call costs one operator per open aggregator (its values added to running
  sums), where a scalar per metric through fairseq's ``AverageMeter`` costs two per
  metric and aggregator (fairseq-train has three open in a training step): on a GPU,
  launches, which bound a Transformer-base step's speed. fairseq reads the means at
  its log intervals (:class:`LocalityMetricMeter`).
* **Recording.** ``with AttentionRecorder(model) as rec:`` makes every observable
  module keep its per-token tensors (centres P, windows D, gates, branch
  distributions) during the forward passes run inside the block; ``rec.records``
  maps a module's name in the model to a list of dicts of CPU tensors, one dict per
  forward call (``rec.calls(module)`` for one module). The keys are the constants
  and functions below (:data:`CENTRE`, :func:`probs_key`, ...), shared by the modules
  that record and the analysis tools that read.
"""
from collections import OrderedDict, defaultdict
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

# ------------------------------------------------------------------ record keys
# The names under which modules record their per-token tensors (and, where the two
# coincide, log their metrics). Modules and the analysis tools both use these.
CENTRE = "P"  # Gaussian centre P_i (Yang et al. 2018, eq. 6), B x H x Tq
WINDOW = "D"  # Gaussian window D_i (Yang et al. 2018, eq. 6/9/11), B x H x Tq
QUERY_POSITION = "q_pos"  # real position of each query, B x Tq
VISIBLE_KEYS = "I"  # I of Yang et al. (2018): keys query i can see, B x Tq
GATE = "gate"  # the hybrid gate g_i (Xu et al. 2019, eq. 5), B x Tq or B x H x Tq
REAL_TOKENS = "real"  # 1 at real query tokens, 0 at padding, B x Tq (beside GATE)
QUERY_PADDING = "query_padding_mask"  # True at padding queries, B x Tq (DC module)
PROBS_PREFIX = "probs_"  # + branch name: a branch's distribution, B x H x Tq x Tk
GATE_PREFIX = "gate_"  # + branch name: HySAN's squeeze gate of a branch, B x Tq


def probs_key(branch: str) -> str:
    """The key of branch ``branch``'s attention distribution, e.g. ``probs_global``."""
    return PROBS_PREFIX + branch


def gate_key(branch: str) -> str:
    """The key (and metric name) of the squeeze gate of branch ``branch``, e.g. ``gate_backward``."""
    return GATE_PREFIX + branch


def branch_of(key: str, prefix: str) -> Optional[str]:
    """The branch name in a ``<prefix><branch>`` key (e.g. ``branch_of("probs_local1",
    PROBS_PREFIX) == "local1"``), or None when ``key`` is not of that kind."""
    return key[len(prefix):] if key.startswith(prefix) and len(key) > len(prefix) else None


# ------------------------------------------------------------------ metrics policy
TRAIN = "train"  # forward passes in training mode
VALID = "valid"  # fairseq's validation: eval mode while its "valid" aggregator is active


def in_fairseq_validation() -> bool:
    """Whether the current forward pass is fairseq's validation (``Trainer.valid_step``
    runs inside ``metrics.aggregate("valid")``), as opposed to inference (e.g.
    fairseq-generate), where nobody reads the metrics."""
    from fairseq.logging import metrics

    valid = metrics.get_meters("valid")
    return valid is not None and any(agg is valid for agg in metrics.get_active_aggregators())


class Observable:
    """Mixin for ``nn.Module`` subclasses that expose statistics.

    Metrics: a module logs only when :attr:`logging_metrics` says so, the one policy
    of the package: the model has labelled the module (``metric_prefix``, e.g.
    ``enc1``) and the forward pass is one of the module's :attr:`metric_passes`
    (:data:`TRAIN`, :data:`VALID`).
    """

    metric_prefix: Optional[str] = None
    #: the passes in which this module logs its metrics (a class or instance attribute)
    metric_passes: Tuple[str, ...] = (TRAIN,)
    _recorder: Optional["AttentionRecorder"] = None
    _record_name: str = ""

    @property
    def recording(self) -> bool:
        return self._recorder is not None

    @property
    def record_name(self) -> str:
        """The module's name in the model while an :class:`AttentionRecorder` is open
        (the key of its calls in ``records``); "" before any recorder was opened."""
        return self._record_name

    @property
    def logging_metrics(self) -> bool:
        """Whether this forward pass logs metrics (see the class docstring)."""
        if self.metric_prefix is None or not self.metric_passes:
            return False
        if self.training:
            return TRAIN in self.metric_passes
        return VALID in self.metric_passes and in_fairseq_validation()

    def record(self, name: str, value: Optional[Tensor]):
        if self._recorder is not None and value is not None:
            self._recorder.add(self._record_name, name, value)

    def log_metric(self, name: str, value: Tensor, weight: float = 1.0, round: int = 3):
        """Log a scalar (a 0-d tensor) as ``<metric_prefix>_<name>``; callers check
        :attr:`logging_metrics` first (and skip computing the value otherwise)."""
        self.log_metrics((name,), value.reshape(1), weight, round)

    def log_metrics(self, names: Sequence[str], values: Tensor, weight: float = 1.0, round: int = 3):
        """Log ``values[i]`` (``values``: one value per name, a tensor of ``len(names)``)
        as ``<metric_prefix>_<names[i]>``, each weighted by ``weight`` (a number):
        one operator on the device per open fairseq aggregator (the call's values added
        to the running sums of that aggregator's meters, :class:`_Sums`), where a
        scalar per metric through fairseq's ``AverageMeter`` costs two per metric and
        aggregator; fairseq's logs show each metric's weighted mean over the steps of
        its interval, as ``AverageMeter`` gives it (:class:`LocalityMetricMeter`).
        Callers check :attr:`logging_metrics` first."""
        if self.metric_prefix is None:
            return
        from fairseq.logging import metrics

        names = tuple(names)
        if values.shape != (len(names),):
            raise ValueError(f"log_metrics: {len(names)} names need a tensor of {len(names)} values, "
                             f"got shape {tuple(values.shape)}")
        owners = self.__dict__.setdefault("_metric_owners", {})
        owner = owners.setdefault((bool(getattr(self, "training", False)), names), object())
        keys = [f"{self.metric_prefix}_{name}" for name in names]
        added = []
        for aggregator in metrics.get_active_aggregators():
            meters = [_locality_meter(aggregator, key, round) for key in keys]
            sums = meters[0].sums_of(owner)
            if sums is None or any(meter.sums_of(owner) is not sums for meter in meters):
                sums = _Sums(owner, len(names), values.device)  # (a meter started or reset: new sums)
                for index, meter in enumerate(meters):
                    meter.attach(sums, index)
            if all(sums is not other for other in added):
                added.append(sums)
        values = values.detach()
        for sums in added:
            sums.add(values, weight)


def _locality_meter(aggregator, key: str, round: Optional[int]) -> "LocalityMetricMeter":
    """The :class:`LocalityMetricMeter` under ``key`` in a fairseq aggregator, made
    where there is none; one of fairseq's meters there (an ``AverageMeter`` restored
    from a checkpoint written before this meter existed) is taken over, its sum and
    count kept."""
    meter = aggregator.get(key)
    if isinstance(meter, LocalityMetricMeter):
        return meter
    new = LocalityMetricMeter(round)
    if meter is None:
        aggregator.add_meter(key, new, priority=10)
    else:
        new.base_sum = float(getattr(meter, "sum", 0.0) or 0.0)
        new.base_weight = float(getattr(meter, "count", 0.0) or 0.0)
        OrderedDict.__setitem__(aggregator, key, new)  # (its place and priority kept)
    return new


class _Sums:
    """Running sums of one module's metrics for the meters of one fairseq aggregator,
    from the step at which they started: ``sum_steps weight * value`` per metric on the
    device (float64, one ``add_`` per step for all of them) and ``sum_steps weight``
    on the host. ``owner`` stands for the module, its mode and its list of names."""

    def __init__(self, owner, count: int, device):
        self.owner = owner
        with torch.inference_mode(False):  # (added to in validation under inference mode too)
            self.sums = torch.zeros(count, dtype=torch.float64, device=device)
        self.weight = 0.0

    def add(self, values: Tensor, weight: float = 1.0):
        self.sums.add_(values, alpha=weight)
        self.weight += float(weight)


class LocalityMetricMeter:
    """A fairseq meter of one metric logged by :meth:`Observable.log_metrics`: the
    weighted mean of the values since its start or last reset, as fairseq's
    ``AverageMeter`` gives it, read from running sums on the device (:class:`_Sums`, one
    per module that logs the metric) only when fairseq asks (its log intervals, a
    checkpoint; one host sync per read). Its state is two numbers and the rounding, so
    a checkpoint keeps it (fairseq restores a meter by its class's name in
    ``fairseq.logging.meters``, where this package registers it)."""

    def __init__(self, round: Optional[int] = None):
        self.round = round
        self.reset()

    def reset(self):
        self.base_sum, self.base_weight = 0.0, 0.0  # (restored from a checkpoint, or taken over)
        self.sources: List[Tuple[_Sums, int]] = []

    def sums_of(self, owner) -> Optional[_Sums]:
        """The running sums of ``owner`` this meter reads, or None."""
        for sums, _ in self.sources:
            if sums.owner is owner:
                return sums
        return None

    def attach(self, sums: _Sums, index: int):
        """Read ``sums[index]`` from now on (in place of the same owner's former sums,
        whose totals are kept)."""
        for position, (old, old_index) in enumerate(self.sources):
            if old.owner is sums.owner:
                self.base_sum += float(old.sums[old_index])
                self.base_weight += old.weight
                del self.sources[position]
                break
        self.sources.append((sums, index))

    def update(self, val, n: float = 1):
        """A value logged under this meter's name by fairseq's ``log_scalar`` (not this
        package's way, which adds to the sums): counted as ``AverageMeter`` would."""
        if val is not None:
            self.base_sum += float(val) * n
            self.base_weight += n

    def _totals(self) -> Tuple[float, float]:
        total, weight = self.base_sum, self.base_weight
        for sums, index in self.sources:
            total += float(sums.sums[index])
            weight += sums.weight
        return total, weight

    @property
    def avg(self) -> Optional[float]:
        total, weight = self._totals()
        return total / weight if weight > 0 else None

    @property
    def smoothed_value(self) -> Optional[float]:
        value = self.avg
        return value if value is None or self.round is None else round(value, self.round)

    def state_dict(self):
        total, weight = self._totals()
        return {"sum": total, "weight": weight, "round": self.round}

    def load_state_dict(self, state_dict):
        self.reset()
        self.base_sum, self.base_weight = float(state_dict["sum"]), float(state_dict["weight"])
        self.round = state_dict.get("round")


def _register_meter():
    """Make :class:`LocalityMetricMeter` restorable from a checkpoint: fairseq's
    ``MetersDict.load_state_dict`` finds a meter's class by name among
    ``fairseq.logging.meters``'s globals."""
    try:
        from fairseq.logging import meters
    except ImportError:  # pragma: no cover - fairseq is a dependency
        return
    setattr(meters, LocalityMetricMeter.__name__, LocalityMetricMeter)


class AttentionRecorder:
    """Context manager that collects per-token statistics from a model's modules.

    Example::

        with AttentionRecorder(model) as rec:
            model(**sample["net_input"])
        rec.records["encoder.layers.0.self_attn.branches.0"][0]["P"]  # B x H x Tq
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.records: Dict[str, List[Dict[str, Tensor]]] = defaultdict(list)
        self._open: Dict[str, Dict[str, Tensor]] = {}

    def add(self, module_name: str, name: str, value: Tensor):
        current = self._open.setdefault(module_name, {})
        if name in current:  # a new forward call of the same module
            self.records[module_name].append(current)
            current = self._open[module_name] = {}
        kept = value.detach().float().cpu()
        if kept.data_ptr() == value.data_ptr():  # a float tensor on the CPU: a copy, not the model's own
            kept = kept.clone()
        current[name] = kept

    def calls(self, module: Observable) -> List[Dict[str, Tensor]]:
        """What ``module`` (a module of the recorded model) recorded, one dict per
        forward call (call :meth:`flush` or leave the block first)."""
        return self.records[module.record_name]

    def flush(self):
        for module_name, current in self._open.items():
            if current:
                self.records[module_name].append(current)
        self._open = {}

    def __enter__(self):
        for name, module in self.model.named_modules():
            if isinstance(module, Observable):
                module._recorder = self
                module._record_name = name
        return self

    def __exit__(self, *exc):
        self.flush()
        for module in self.model.modules():
            if isinstance(module, Observable):
                module._recorder = None
        return False


@torch.no_grad()
def weighted_means(values, weights: Optional[Tensor]) -> Tensor:
    """The means of ``values[m]`` (``M x ...``, or a sequence of M tensors of one shape)
    over the positions weighted by ``weights`` (weights that sum to 1, e.g.
    :meth:`~.context.AttentionContext.query_weights`, broadcasting to each value; the
    value is first averaged over the dimensions they broadcast along), as one float32
    tensor of M; the plain means where ``weights`` is None. With the real tokens'
    weights ``1 / count`` this is :func:`masked_mean` of each value, in three
    operators for all (an average, one matrix-vector product, the stacking of a
    sequence)."""
    if not isinstance(values, Tensor):
        values = torch.stack(list(values))
    if weights is None:
        return values.reshape(values.size(0), -1).mean(1, dtype=torch.float32)
    weights = weights.reshape((1,) * (values.dim() - weights.dim()) + tuple(weights.shape))
    spread = [d for d in range(1, values.dim()) if weights.size(d) == 1 and values.size(d) != 1]
    per_weight = values.mean(spread, keepdim=True, dtype=torch.float32) if spread else values.float()
    flat = weights[0].expand(per_weight.shape[1:]).reshape(-1)
    return torch.mv(per_weight.reshape(per_weight.size(0), -1), flat)


@torch.no_grad()
def masked_mean(value: Tensor, keep: Optional[Tensor]) -> Tensor:
    """Mean of ``value`` over the positions where ``keep`` is True (``keep`` broadcasts
    to ``value``: e.g. a gate ``Tq x B x C`` and the real tokens ``Tq x B x 1``).

    ``value`` is first summed, in float32, over the dimensions ``keep`` broadcasts
    along (one pass over it, no mask of its size), then weighted by ``keep``."""
    if keep is None:
        return value.mean(dtype=torch.float32)
    keep = keep.reshape((1,) * (value.dim() - keep.dim()) + tuple(keep.shape))
    spread = [d for d in range(value.dim()) if keep.size(d) == 1 and value.size(d) != 1]
    per_kept = value.sum(spread, keepdim=True, dtype=torch.float32) if spread else value.float()
    copies = value.numel() // per_kept.numel()  # the elements of value behind each element of keep
    kept = keep.sum(dtype=torch.float32) * copies
    return (per_kept * keep).sum() / kept.clamp(min=1.0)


_register_meter()
