"""The modules' training metrics: one operator per call on the device, read by fairseq's
meters at its log intervals, with the means fairseq's own ``AverageMeter`` gives."""
import math
import pickle

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq.logging import meters, metrics

import fairseq_localness  # noqa: F401  (registers the meter)
from fairseq_localness.checkpoint.errors import MalformedCheckpointError
from fairseq_localness.checkpoint.settings import check_structure
from fairseq_localness.modules.observe import LocalityMetricMeter, Observable, masked_mean, masked_means


class _Module(nn.Module, Observable):
    metric_prefix = "enc1"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _steps(seed=0, count=7):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(3, generator=g), float(w)) for w in torch.randint(1, 5, (count,), generator=g)]


def test_the_logged_means_equal_fairseqs_average_meter_over_intervals_and_resets():
    """Three metrics over seven weighted steps, a ``train_inner``-like aggregator reset
    after the fourth: each interval's mean equals what ``metrics.log_scalar`` (fairseq's
    ``AverageMeter``) gives for the same values, and the long-lived aggregator's too."""
    module = _Module().train()
    names = ("a", "b", "c")
    with metrics.aggregate(new_root=True) as outer:
        with metrics.aggregate("inner_ours") as inner:
            for step, (values, weight) in enumerate(_steps()):
                if step == 4:
                    metrics.reset_meters("inner_ours")
                module.log_metrics(names, values, weight, round=6)
        ours_inner, ours_outer = inner.get_smoothed_values(), outer.get_smoothed_values()
    with metrics.aggregate(new_root=True) as outer:
        with metrics.aggregate("inner_theirs") as inner:
            for step, (values, weight) in enumerate(_steps()):
                if step == 4:
                    metrics.reset_meters("inner_theirs")
                for name, value in zip(names, values):
                    metrics.log_scalar(f"enc1_{name}", value, weight, round=6)
        theirs_inner, theirs_outer = inner.get_smoothed_values(), outer.get_smoothed_values()
    assert set(ours_inner) == set(theirs_inner) == {"enc1_a", "enc1_b", "enc1_c"}
    for key in theirs_inner:
        assert math.isclose(ours_inner[key], theirs_inner[key], rel_tol=1e-5)
        assert math.isclose(ours_outer[key], theirs_outer[key], rel_tol=1e-5)


def test_one_operator_per_call_whatever_the_metrics_and_aggregators():
    """After the first call, a call with four metrics under three open aggregators (as
    in fairseq-train's training step) runs one operator (the sums' ``add_``); fairseq's
    ``log_scalar`` runs two per metric and aggregator."""
    module = _Module().train()
    names = ("a", "b", "c", "d")
    values = torch.rand(4)
    with metrics.aggregate(new_root=True), metrics.aggregate("x_ops"), metrics.aggregate("y_ops"):
        module.log_metrics(names, values)
        doubled = values * 2
        ops = _Ops()
        with ops:
            module.log_metrics(names, doubled)
        theirs = _Ops()
        for name, value in zip(names, values):  # (first calls create the meters)
            metrics.log_scalar(f"z_{name}", value)
        with theirs:
            for name, value in zip(names, values):
                metrics.log_scalar(f"z_{name}", value)
    assert [name for name in ops.names if name != "detach"] == ["add_"]  # (detach: a view, no kernel)
    assert [name for name in theirs.names if name != "unbind"] == ["mul", "add"] * len(names) * 3


def test_training_and_evaluation_keep_separate_sums():
    """A validation pass (evaluation mode) between training steps does not enter the
    training interval's means, nor the other way round."""
    module = _Module()
    with metrics.aggregate(new_root=True) as train:
        module.train().log_metrics(("a",), torch.tensor([1.0]))
        with metrics.aggregate(new_root=True) as valid:
            module.eval().log_metrics(("a",), torch.tensor([10.0]))
        module.train().log_metrics(("a",), torch.tensor([3.0]))
    assert train.get_smoothed_values()["enc1_a"] == 2.0
    assert valid.get_smoothed_values()["enc1_a"] == 10.0


def test_the_meter_state_survives_a_checkpoint_and_goes_on():
    """fairseq saves the meters' state in its checkpoints and restores each meter by its
    class name in ``fairseq.logging.meters``: the state is numbers, the restored meter
    keeps the mean so far and adds new steps to it."""
    module = _Module().train()
    with metrics.aggregate(new_root=True) as agg:
        for values, weight in _steps(count=3):
            module.log_metrics(("a", "b", "c"), values, weight)
        state = agg.state_dict()
    assert getattr(meters, "LocalityMetricMeter") is LocalityMetricMeter
    saved = pickle.loads(pickle.dumps(state))
    kinds = {meter for _, _, meter, _ in saved}
    assert kinds == {"LocalityMetricMeter"}
    assert all(set(s) == {"sum", "weight", "round"} and isinstance(s["sum"], float) for *_, s in saved)
    restored = meters.MetersDict()
    restored.load_state_dict(saved)
    later = _Module().train()  # a new process: new sums
    with metrics.aggregate(new_root=True) as agg:
        agg.load_state_dict(saved)
        for values, weight in _steps(seed=1, count=2):
            later.log_metrics(("a", "b", "c"), values, weight)
        resumed = agg.get_smoothed_values()
    every = _steps(count=3) + _steps(seed=1, count=2)
    for index, name in enumerate("abc"):
        want = sum(v[index].item() * w for v, w in every) / sum(w for _, w in every)
        assert math.isclose(resumed[f"enc1_{name}"], round(want, 3), abs_tol=1e-3)
    before = _steps(count=3)
    want_a = sum(v[0].item() * w for v, w in before) / sum(w for _, w in before)
    assert math.isclose(restored.get_smoothed_values()["enc1_a"], round(want_a, 3), abs_tol=1e-3)


@pytest.mark.parametrize("state, message", [
    ({"sum": 1.0}, "entries"),
    ({"sum": 1.0, "weight": 2.0, "extra": 1}, "entries"),
    ({"sum": "1", "weight": 2.0}, "not a number"),
    ({"sum": 1.0, "weight": [2.0]}, "not a number"),
    ({"sum": 1.0, "weight": 2.0, "round": 10 ** 9}, "round"),
])
def test_a_checkpoint_with_a_malformed_metric_meter_is_refused(state, message):
    checkpoint = {"model": {}, "extra_state": {"metrics": {"train": [(10, "enc1_a", "LocalityMetricMeter", state)]}}}
    with pytest.raises(MalformedCheckpointError, match=message):
        check_structure(checkpoint, "ckpt.pt")
    good = {"model": {}, "extra_state": {"metrics": {"train": [
        (10, "enc1_a", "LocalityMetricMeter", {"sum": 1.0, "weight": 2.0, "round": 3})]}}}
    check_structure(good, "ckpt.pt")


def test_masked_means_equal_masked_mean_for_each():
    values = torch.randn(3, 2, 4, 5)  # M x B x H x Tq
    keep = torch.tensor([[True, True, False, True, True], [False, True, True, True, False]])[:, None]  # B x 1 x Tq
    got = masked_means(values, keep)
    want = torch.stack([masked_mean(v, keep) for v in values])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(masked_means(list(values), None), values.reshape(3, -1).mean(1))
    assert masked_means(values, torch.zeros_like(keep)).eq(0).all()  # no real token: 0, as masked_mean


def test_log_metrics_refuses_a_tensor_of_another_length():
    with pytest.raises(ValueError, match="2 names need a tensor of 2 values"):
        _Module().train().log_metrics(("a", "b"), torch.rand(3))
