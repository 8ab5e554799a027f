"""``--bf16``'s fp32 master weights flat, and one multi-tensor copy per sync
(fairseq_localness.compat.mixed_precision), on real ``Trainer`` updates on the CPU."""
import copy

import pytest
import torch
from model_utils import OperatorCalls

from conftest import TINY_MODEL_ARGS, run_fairseq, train_command


def _trainer(data, *flags, arch="transformer", seed=1):
    """A fairseq ``Trainer`` as fairseq-train builds it (``--bf16 --cpu``), and its
    first batch."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    import fairseq_localness  # noqa: F401
    from fairseq_localness.compat.bf16 import bf16_device

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data.data_bin, "--task", "translation", "--arch", arch, "--optimizer", "adam", "--lr", "1e-3",
        "--source-lang", data.src, "--target-lang", data.tgt, "--max-tokens", "1024", "--bf16", "--cpu",
        "--seed", str(seed), "--num-workers", "0", *TINY_MODEL_ARGS, *flags])
    cfg = convert_namespace_to_omegaconf(args)
    assert bf16_device(cfg, xla_available=False, cuda_available=False) == "cpu"
    for section in (cfg.common, cfg.optimizer, cfg.distributed_training, cfg.model):
        section.tpu = False  # what the package's --bf16 fix does in call_main
    utils.set_torch_seed(seed)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=1024).next_epoch_itr(shuffle=False)
    return trainer, next(batches)


def _params(trainer):
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_bf16_keeps_one_flat_master_and_syncs_it_in_one_call_each_way(tiny_data_bin):
    """``--bf16`` off a TPU: one flat fp32 master (fairseq: one per tensor), whose
    syncs are one ``_foreach_copy_`` each; an update's operator calls do not grow
    with the number of parameter tensors the way per-tensor masters' did (fairseq's:
    about 12 per tensor)."""
    trainer, batch = _trainer(tiny_data_bin)
    trainer.train_step([batch])
    optimizer = trainer.optimizer
    tensors = list(trainer.model.parameters())
    assert optimizer.has_flat_params and list(optimizer.fp32_params) == [None]
    assert optimizer.fp32_params[None].numel() == sum(p.numel() for p in tensors)
    with OperatorCalls() as update:
        trainer.train_step([batch])
    assert update.names.count("copy_") < len(tensors) // 4
    assert update.names.count("addcdiv_") == 1  # Adam's step of the flat master
    trainer.train_step([batch])  # the gradients of a new update, then the two syncs
    optimizer._needs_sync = True
    with OperatorCalls() as sync:
        optimizer._sync_fp16_grads_to_fp32()
        optimizer._sync_fp32_params_to_fp16()
    assert [name for name in sync.names if name not in ("slice", "view", "reshape", "detach", "alias")] == [
        "_foreach_copy_", "_foreach_copy_"]


def test_flat_updates_equal_fairseqs_per_tensor_masters(tiny_data_bin):
    """Three ``--bf16`` updates with the flat master give the same weights as with
    fairseq's per-tensor masters (``--fp16-no-flatten-grads``, which keeps them): the
    same element-wise Adam."""
    flat, batch = _trainer(tiny_data_bin)
    per_tensor, _ = _trainer(tiny_data_bin, "--fp16-no-flatten-grads")
    assert not per_tensor.optimizer.has_flat_params
    for a, b in zip(_params(flat), _params(per_tensor)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for _ in range(3):
        flat.train_step([batch])
        per_tensor.train_step([batch])
    for a, b in zip(_params(flat), _params(per_tensor)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_parameter_without_a_gradient_gets_zeros(tiny_data_bin):
    """A parameter that got no gradient has zeros in the flat gradient, as fairseq's
    copied zeros (not the stale gradient of an earlier update)."""
    trainer, batch = _trainer(tiny_data_bin)
    trainer.train_step([batch])
    optimizer = trainer.optimizer
    first = next(iter(trainer.model.parameters()))
    for p in trainer.model.parameters():
        p.grad = torch.ones_like(p)
    first.grad = None
    optimizer.fp32_params[None].grad.fill_(7.0)
    optimizer._needs_sync = True
    optimizer._sync_fp16_grads_to_fp32()
    grad = optimizer.fp32_params[None].grad
    assert grad[: first.numel()].eq(0).all() and grad[first.numel():].eq(1).all()


def _resumed_both_ways(data, saved_model: dict, saved_state: dict) -> dict:
    """Two trainers resumed from one model and optimizer state, with a flat master
    ("flat") and with per-tensor ones ("per_tensor")."""
    resumed = {}
    for name, flags in (("flat", ()), ("per_tensor", ("--fp16-no-flatten-grads",))):
        trainer, _ = _trainer(data, *flags)
        trainer.model.load_state_dict(saved_model)
        trainer.optimizer.load_state_dict(copy.deepcopy(saved_state))  # (as from a file: nothing shared)
        resumed[name] = trainer
    return resumed


def test_resuming_a_per_tensor_state_into_a_flat_master(tiny_data_bin):
    """An optimizer state saved with per-tensor masters (a ``--bf16`` run before the
    fix) loads into a flat master: Adam's moments joined in the parameters' order, the
    step count kept; the next update equals the per-tensor run's, resumed the same
    way."""
    run, batch = _trainer(tiny_data_bin, "--fp16-no-flatten-grads")
    for _ in range(2):
        run.train_step([batch])
    saved_model, saved_state = run.model.state_dict(), run.optimizer.state_dict()
    per_tensor_moments = [saved_state["state"][i]["exp_avg"].reshape(-1) for i in range(len(saved_state["state"]))]

    resumed = _resumed_both_ways(tiny_data_bin, saved_model, saved_state)
    flat_state = resumed["flat"].optimizer.state_dict()["state"][0]
    torch.testing.assert_close(flat_state["exp_avg"], torch.cat(per_tensor_moments), rtol=0, atol=0)
    assert flat_state["step"] == saved_state["state"][0]["step"] == 2
    for trainer in resumed.values():
        trainer.train_step([batch])
    for a, b in zip(_params(resumed["flat"]), _params(resumed["per_tensor"])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_resuming_a_flat_state_into_per_tensor_masters(tiny_data_bin):
    """The other way: a flat state (a ``--bf16`` run now) resumed with
    ``--fp16-no-flatten-grads`` is split into the tensors' states, and the next update
    equals the flat run's, resumed the same way."""
    run, batch = _trainer(tiny_data_bin)
    for _ in range(2):
        run.train_step([batch])
    saved_model, saved_state = run.model.state_dict(), run.optimizer.state_dict()
    assert len(saved_state["param_groups"][0]["params"]) == 1
    resumed = _resumed_both_ways(tiny_data_bin, saved_model, saved_state)
    per_tensor = resumed["per_tensor"].optimizer.state_dict()["state"]
    shapes = [p.shape for p in resumed["per_tensor"].model.parameters()]
    assert [tuple(per_tensor[i]["exp_avg"].shape) for i in range(len(shapes))] == [tuple(s) for s in shapes]
    torch.testing.assert_close(torch.cat([per_tensor[i]["exp_avg"].reshape(-1) for i in range(len(shapes))]),
                               saved_state["state"][0]["exp_avg"], rtol=0, atol=0)
    for trainer in resumed.values():
        trainer.train_step([batch])
    for a, b in zip(_params(resumed["flat"]), _params(resumed["per_tensor"])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


CUDA = pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"))


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_flat_syncs_equal_fairseqs_own(dtype, device):
    """The two multi-tensor syncs of a flat master give what fairseq's per-tensor
    copies give (its own functions, which the fix keeps as ``__wrapped__``), in fp16
    (whose sync is the only part of ``--fp16`` the fix changes) and bf16, with a
    parameter without a gradient and a non-contiguous gradient; on a GPU the flat
    master is fairseq's own (keyed by the CUDA device)."""
    from types import SimpleNamespace

    from fairseq.optim.fp16_optimizer import FP16Optimizer, _FP16OptimizerMixin

    from fairseq_localness.compat.mixed_precision import _cpu_flat_params

    g = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*shape, generator=g).to(device, dtype))
              for shape in ((3, 4), (5,), (2, 2, 2))]
    params[0].grad = torch.randn(4, 3, generator=g).to(device, dtype).t()  # non-contiguous
    params[2].grad = torch.randn(2, 2, 2, generator=g).to(device, dtype)
    originals = [p.detach().clone() for p in params]
    results = []
    for sync in ("fix", "fairseq"):
        if device == "cpu":  # (fairseq builds no flat fp16 master on a CPU; the fix's bf16 one, for both)
            flat = _cpu_flat_params(params)
        else:
            flat = FP16Optimizer.build_fp32_params(SimpleNamespace(), params, flatten=True)
        (key,) = flat  # the parameters' device index: None on a CPU
        flat[key].grad.fill_(5.0)
        optimizer = SimpleNamespace(fp16_params=params, fp32_params=flat, _needs_sync=True, has_flat_params=True)
        grads = _FP16OptimizerMixin._sync_fp16_grads_to_fp32
        if sync == "fairseq":
            params[0].grad = params[0].grad.contiguous()  # (fairseq's view(-1) needs it)
        (grads if sync == "fix" else grads.__wrapped__)(optimizer)
        results.append(flat[key].grad.clone())
        with torch.no_grad():
            flat[key].mul_(3.0)
        copies = _FP16OptimizerMixin._sync_fp32_params_to_fp16
        (copies if sync == "fix" else copies.__wrapped__)(optimizer)
        results.append(torch.cat([p.detach().reshape(-1).float() for p in params]))
        with torch.no_grad():  # the same weights for the second round
            for p, original in zip(params, originals):
                p.copy_(original)
    torch.testing.assert_close(results[0], results[2], rtol=0, atol=0)
    torch.testing.assert_close(results[1], results[3], rtol=0, atol=0)
    assert results[0][12:17].eq(0).all()  # the parameter without a gradient


def test_a_state_that_cannot_be_joined_says_what_to_do():
    from fairseq_localness.compat.mixed_precision import _joined_state

    shapes = [torch.Size([3]), torch.Size([2, 2])]
    state = {"state": {0: {"step": 1, "exp_avg": torch.zeros(3)}}, "param_groups": [{"params": [0, 1], "lr": 1}]}
    with pytest.raises(ValueError, match="2 parameter tensors, the model 3 .*--reset-optimizer"):
        _joined_state(state, shapes + [torch.Size([5])])
    two_groups = dict(state, param_groups=[{"params": [0]}, {"params": [1]}])
    with pytest.raises(ValueError, match="2 parameter groups.*--fp16-no-flatten-grads"):
        _joined_state(two_groups, shapes)
    joined = _joined_state(state, shapes)  # a tensor without state: zeros
    torch.testing.assert_close(joined["state"][0]["exp_avg"], torch.zeros(7))
    assert joined["param_groups"] == [{"params": [0], "lr": 1}]
    transposed = {"state": {0: {"exp_avg": torch.zeros(3)}, 1: {"exp_avg": torch.zeros(4)}},
                  "param_groups": [{"params": [0, 1]}]}
    with pytest.raises(ValueError, match="not of the parameter's shape"):
        _joined_state(transposed, shapes)


@pytest.mark.parametrize("bad", ["entry_not_a_dict", "params_a_tensor", "ids_not_ints", "ids_twice", "stray_state",
                                 "too_many_keys", "a_list_value", "a_long_tensor_value"])
def test_the_resume_check_refuses_a_per_tensor_state_it_cannot_join(tiny_data_bin, bad):
    """A per-tensor state from a checkpoint that cannot be joined into the run's flat
    master is refused with the checkpoint's error, its layout checked before anything
    is joined (the join runs before the check's own layout checks)."""
    from fairseq_localness.checkpoint.errors import MalformedCheckpointError
    from fairseq_localness.checkpoint.resume import check_optimizer_state

    trainer, batch = _trainer(tiny_data_bin)
    trainer.train_step([batch])
    count = len(list(trainer.model.parameters()))
    ids = list(range(count))
    state = {"state": {i: {"step": 1} for i in ids}, "param_groups": [{"params": ids}]}
    if bad == "entry_not_a_dict":
        state["state"][0] = "abc"
    elif bad == "params_a_tensor":
        state["param_groups"][0]["params"] = torch.zeros(2)
    elif bad == "ids_not_ints":
        state["param_groups"][0]["params"] = ["a"] * count
    elif bad == "ids_twice":
        state["param_groups"][0]["params"] = [0] * count
    elif bad == "stray_state":
        state["state"][count + 5] = {"step": 1}
    elif bad == "too_many_keys":
        state["state"][0] = {f"k{i}": 1 for i in range(1000)}
    elif bad == "a_list_value":
        state["state"][0]["exp_avg"] = [torch.zeros(1)]
    elif bad == "a_long_tensor_value":
        state["state"][0]["exp_avg"] = torch.zeros(2_000_000, dtype=torch.uint8)
    with pytest.raises(MalformedCheckpointError, match="fp32 master weights"):
        check_optimizer_state(trainer.optimizer, state, "x.pt")


@pytest.mark.parametrize("bad", ["wrong_size", "entry_not_a_dict", "a_list_value", "stray_state"])
def test_the_resume_check_refuses_a_flat_state_it_cannot_split(tiny_data_bin, bad):
    """The same for a flat state resumed into per-tensor masters
    (``--fp16-no-flatten-grads``)."""
    from fairseq_localness.checkpoint.errors import MalformedCheckpointError
    from fairseq_localness.checkpoint.resume import check_optimizer_state

    trainer, batch = _trainer(tiny_data_bin, "--fp16-no-flatten-grads")
    trainer.train_step([batch])
    total = sum(p.numel() for p in trainer.model.parameters())
    state = {"state": {0: {"step": 1, "exp_avg": torch.zeros(total)}}, "param_groups": [{"params": [0]}]}
    if bad == "wrong_size":
        state["state"][0]["exp_avg"] = torch.zeros(total + 1)
    elif bad == "entry_not_a_dict":
        state["state"][0] = "abc"
    elif bad == "a_list_value":
        state["state"][0]["exp_avg"] = [torch.zeros(1)]
    elif bad == "stray_state":
        state["state"][7] = {"step": 1}
    with pytest.raises(MalformedCheckpointError, match="fp32 master weights"):
        check_optimizer_state(trainer.optimizer, state, "x.pt")


def test_fairseq_train_resumes_across_the_two_layouts(tiny_data_bin, tmp_path):
    """Through fairseq-train: a ``--bf16`` run (flat master) resumed with
    ``--fp16-no-flatten-grads`` (its optimizer state split into the tensors'), then
    without it again (joined), each resuming from the last checkpoint and going on to
    its number of updates."""
    save_dir = tmp_path / "ckpts"
    for updates, extra, said in ((2, [], None), (4, ["--fp16-no-flatten-grads"], "split"), (6, [], "joined")):
        proc = run_fairseq("fairseq-train", train_command(
            "hysan_transformer", tiny_data_bin, str(save_dir), ["--bf16", "--cpu", *extra], max_update=updates))
        log = proc.stdout + proc.stderr
        assert f"@ {updates} updates" in log, log[-2000:]  # (fairseq's line for the checkpoint it saved)
        if said:
            assert f"the optimizer state {said} to the fp32 master's layout" in log
