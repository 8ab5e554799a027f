"""Observability: training metrics and per-token dumps from inside the modules.

Two channels, both cheap when unused:

* **Metrics.** Modules call :meth:`Observable.log_metric` with a detached tensor; it
  goes to fairseq's ``metrics.log_scalar`` under the module's ``metric_prefix`` (set
  when the model is built, e.g. ``enc1``), so the mean Gaussian centre offset, window,
  gate, ... of every layer appear in fairseq's training and validation logs. Values
  stay on the device (fairseq's meters accept tensors), so logging adds no sync.
* **Recording.** ``with AttentionRecorder(model) as rec:`` makes every observable
  module keep its per-token tensors (centres P, windows D, gates, branch
  distributions) during the forward passes run inside the block; ``rec.records``
  maps a module's name in the model to a list of dicts of CPU tensors, one dict per
  forward call. The analysis tools build on this.
"""
from collections import defaultdict
from typing import Dict, List, Optional

import torch
from torch import Tensor, nn


class Observable:
    """Mixin for ``nn.Module`` subclasses that expose statistics."""

    metric_prefix: Optional[str] = None
    _recorder: Optional["AttentionRecorder"] = None
    _record_name: str = ""

    @property
    def recording(self) -> bool:
        return self._recorder is not None

    def record(self, name: str, value: Optional[Tensor]):
        if self._recorder is not None and value is not None:
            self._recorder.add(self._record_name, name, value)

    def log_metric(self, name: str, value: Tensor, weight: float = 1.0, round: int = 3):
        """Log a scalar (a 0-d tensor) as ``<metric_prefix>_<name>``."""
        if self.metric_prefix is None:
            return
        from fairseq.logging import metrics

        metrics.log_scalar(f"{self.metric_prefix}_{name}", value.detach().float(), weight, round=round)


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
        current[name] = value.detach().float().cpu()

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
def masked_mean(value: Tensor, keep: Optional[Tensor]) -> Tensor:
    """Mean of ``value`` over the positions where ``keep`` is True (broadcast)."""
    if keep is None:
        return value.float().mean()
    keep = keep.expand_as(value).float()
    return (value.float() * keep).sum() / keep.sum().clamp(min=1.0)
