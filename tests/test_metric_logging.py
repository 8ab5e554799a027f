"""The modules' training metrics: one operator per call on the device, read by fairseq's
meters at its log intervals, with the means fairseq's own ``AverageMeter`` gives."""
import math
import pickle

import pytest
import torch
from torch import nn

from fairseq.logging import meters, metrics
from model_utils import OperatorCalls

import fairseq_localness  # noqa: F401  (registers the meter)
from fairseq_localness.checkpoint.errors import MalformedCheckpointError
from fairseq_localness.checkpoint.settings import check_structure
from fairseq_localness.modules.observe import LocalityMetricMeter, Observable, masked_mean, weighted_means


class _Module(nn.Module, Observable):
    metric_prefix = "enc1"


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


def test_one_operator_per_call_and_open_aggregator_whatever_the_metrics():
    """After the first call, a call with four metrics under three open aggregators (as
    in fairseq-train's training step) runs one operator per aggregator (its sums'
    ``add_``); fairseq's ``log_scalar`` runs two per metric and aggregator."""
    module = _Module().train()
    names = ("a", "b", "c", "d")
    values = torch.rand(4)
    with metrics.aggregate(new_root=True), metrics.aggregate("x_ops"), metrics.aggregate("y_ops"):
        module.log_metrics(names, values)
        doubled = values * 2
        ops = OperatorCalls()
        with ops:
            module.log_metrics(names, doubled)
        theirs = OperatorCalls()
        for name, value in zip(names, values):  # (first calls create the meters)
            metrics.log_scalar(f"z_{name}", value)
        with theirs:
            for name, value in zip(names, values):
                metrics.log_scalar(f"z_{name}", value)
    assert [name for name in ops.names if name != "detach"] == ["add_"] * 3  # (detach: a view, no kernel)
    assert [name for name in theirs.names if name != "unbind"] == ["mul", "add"] * len(names) * 3


def _both_ways(steps):
    """Run ``steps`` (a list of ("log", values, weight), ("reset", name),
    ("enter", name), ("leave",)) through log_metrics and through fairseq's log_scalar;
    return both aggregators' smoothed values by name."""
    results = []
    for ours in (True, False):
        module = _Module().train()
        stack, seen = [], {}
        for step in steps:
            if step[0] == "enter":  # (named aggregators live on: a name of their own per way)
                named = f"both_ways_{step[1]}_{'ours' if ours else 'theirs'}"
                ctx = metrics.aggregate(new_root=True) if step[1] == "root" else metrics.aggregate(named)
                stack.append(ctx)
                seen[step[1]] = ctx.__enter__()
            elif step[0] == "leave":
                stack.pop().__exit__(None, None, None)
            elif step[0] == "reset":
                seen[step[1]].reset()
            elif ours:
                module.log_metrics(("a", "b"), step[1], step[2], round=6)
            else:
                for name, value in zip("ab", step[1]):
                    metrics.log_scalar(f"enc1_{name}", value, step[2], round=6)
        results.append({name: agg.get_smoothed_values() for name, agg in seen.items()})
    return results


def test_a_meter_counts_only_the_steps_its_aggregator_was_open_for():
    """A nested new root (a tool's pass inside a training run) takes the steps logged
    while it is open, and the outer aggregator does not, as with fairseq's meters."""
    t = torch.tensor
    ours, theirs = _both_ways([("enter", "outer"), ("log", t([1.0, 2.0]), 1.0), ("enter", "root"),
                               ("log", t([5.0, 6.0]), 2.0), ("leave",), ("log", t([3.0, 1.0]), 1.0), ("leave",)])
    assert ours == theirs and ours["outer"]["enc1_a"] == 2.0 and ours["root"]["enc1_b"] == 6.0


def test_a_non_finite_value_stays_in_its_interval():
    """An infinite value (an fp16 overflow) makes its own interval's mean infinite or
    NaN, as fairseq's meter does, and the next interval is finite again."""
    t = torch.tensor
    ours, theirs = _both_ways([("enter", "root"), ("enter", "inner"), ("log", t([float("inf"), 1.0]), 1.0),
                               ("reset", "inner"), ("log", t([2.0, 3.0]), 1.0)])
    assert ours["inner"] == theirs["inner"] == {"enc1_a": 2.0, "enc1_b": 3.0}
    assert math.isinf(ours["root"]["enc1_a"]) and math.isinf(theirs["root"]["enc1_a"])


def test_two_modules_logging_the_same_name_are_averaged_together():
    """Two modules with the same label (two models in one process) feed one meter:
    the weighted mean over both, as fairseq's meter gives, with no sync per step."""
    first, second = _Module().train(), _Module().train()
    with metrics.aggregate(new_root=True) as ours:
        first.log_metrics(("a",), torch.tensor([1.0]), 1.0)
        second.log_metrics(("a",), torch.tensor([4.0]), 2.0)
        ops = OperatorCalls()
        with ops:
            first.log_metrics(("a",), torch.tensor([1.0]), 1.0)
            second.log_metrics(("a",), torch.tensor([4.0]), 2.0)
    assert "_local_scalar_dense" not in ops.names
    assert ours.get_smoothed_values()["enc1_a"] == 3.0  # (1 + 8 + 1 + 8) / 6


def test_a_checkpoint_of_fairseqs_own_meters_is_taken_over():
    """A checkpoint written when these metrics went through fairseq's ``AverageMeter``
    restores those meters; the next logged step takes each over, keeping its sum and
    count, and the means go on as fairseq's would."""
    with metrics.aggregate(new_root=True) as old:
        metrics.log_scalar("enc1_a", torch.tensor(1.0), 1, round=3)
        metrics.log_scalar("enc1_b", torch.tensor(2.0), 1, round=3)
        state = old.state_dict()
    module = _Module().train()
    with metrics.aggregate(new_root=True) as agg:
        agg.load_state_dict(state)
        for _ in range(2):
            module.log_metrics(("a", "b"), torch.tensor([4.0, 5.0]))
        values = agg.get_smoothed_values()
        kinds = {type(agg[key]).__name__ for key in agg}
    assert values == {"enc1_a": 3.0, "enc1_b": 4.0} and kinds == {"LocalityMetricMeter"}


def test_validation_under_inference_mode_then_without_it():
    """Sums made in a pass under ``torch.inference_mode`` take later passes without it."""
    module = _Module().eval()
    with metrics.aggregate(new_root=True) as agg:
        with torch.inference_mode():
            module.log_metrics(("a",), torch.tensor([1.0]))
        with torch.no_grad():
            module.log_metrics(("a",), torch.tensor([3.0]))
    assert agg.get_smoothed_values()["enc1_a"] == 2.0


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
    ({"sum": 10 ** 400, "weight": 2.0}, "not a number a float holds"),
    ({"sum": 1.0, "weight": float("nan")}, "weight is not a finite number >= 0"),
    ({"sum": 1.0, "weight": -1.0}, "weight is not a finite number >= 0"),
    ({"sum": torch.tensor([1 + 2j]), "weight": 2.0}, "not a real number"),
    ({"sum": torch.empty(1, device="meta"), "weight": 2.0}, "not a real number"),
])
def test_a_checkpoint_with_a_malformed_metric_meter_is_refused(state, message):
    checkpoint = {"model": {}, "extra_state": {"metrics": {"train": [(10, "enc1_a", "LocalityMetricMeter", state)]}}}
    with pytest.raises(MalformedCheckpointError, match=message):
        check_structure(checkpoint, "ckpt.pt")
    good = {"model": {}, "extra_state": {"metrics": {"train": [
        (10, "enc1_a", "LocalityMetricMeter", {"sum": 1.0, "weight": 2.0, "round": 3}),
        (10, "enc1_b", "LocalityMetricMeter", {"sum": float("nan"), "weight": 2.0, "round": 3})]}}}
    check_structure(good, "ckpt.pt")  # (a NaN sum: an overflow step, kept by fairseq's meters too)


def test_weighted_means_with_the_real_tokens_weights_equal_masked_mean_for_each():
    """weighted_means with the weights of the real tokens (``1 / count`` at each, as the
    attention context gives them, shared by the layers of a pass) equals masked_mean
    per value; without weights, the plain means; no real token gives 0 as masked_mean."""
    from fairseq_localness.modules.context import AttentionContext

    values = torch.randn(3, 2, 4, 5)  # M x B x H x Tq
    padding = torch.tensor([[False, False, True, False, False], [True, False, False, False, True]])
    ctx = AttentionContext(query_input=None, q=torch.zeros(2, 4, 5, 8), k=torch.zeros(2, 4, 5, 8),
                           key_padding_mask=padding, causal=False, self_attention=True)
    weights = ctx.query_weights()
    keep = (~padding)[:, None]  # B x 1 x Tq
    got = weighted_means(values, weights[:, None])
    torch.testing.assert_close(got, torch.stack([masked_mean(v, keep) for v in values]))
    torch.testing.assert_close(weighted_means(list(values), None), values.reshape(3, -1).mean(1))
    gates = torch.rand(4, 5, 2, 6)  # L x Tq x B x C
    torch.testing.assert_close(weighted_means(gates, ctx.query_weights(transposed=True).unsqueeze(-1)),
                               torch.stack([masked_mean(g, keep[:, 0].t().unsqueeze(-1)) for g in gates]))
    everything = torch.ones_like(padding)
    empty = AttentionContext(query_input=None, q=torch.zeros(2, 4, 5, 8), k=torch.zeros(2, 4, 5, 8),
                             key_padding_mask=everything, causal=False, self_attention=True)
    assert weighted_means(values, empty.query_weights()[:, None]).eq(0).all()
    # the same mask's weights, made once for every layer of the pass
    again = AttentionContext(query_input=None, q=torch.zeros(2, 4, 5, 8), k=torch.zeros(2, 4, 5, 8),
                             key_padding_mask=padding, causal=False, self_attention=True)
    assert again.query_weights() is weights and again.k_pos is ctx.k_pos


def test_log_metrics_refuses_a_tensor_of_another_length():
    with pytest.raises(ValueError, match="2 names need a tensor of 2 values"):
        _Module().train().log_metrics(("a", "b"), torch.rand(3))


def test_a_pass_under_inference_mode_with_a_padding_mask():
    """A mask made under ``torch.inference_mode`` has no version counter: what the
    layers derive from it is made per call, not kept, and the pass runs."""
    from fairseq_localness.modules.attention import AttentionCore
    from fairseq_localness.modules.gaussian import GaussianLocalness

    core = AttentionCore(16, 4, self_attention=True, branches=[GaussianLocalness(16, 4)]).eval()
    x = torch.randn(5, 2, 16)
    with torch.inference_mode():
        pad = torch.zeros(2, 5, dtype=torch.bool)
        pad[1, :2] = True
        out = core(x, x, x, key_padding_mask=pad)[0]
    with torch.no_grad():
        want = core(x, x, x, key_padding_mask=pad.clone())[0]
    torch.testing.assert_close(out, want)
