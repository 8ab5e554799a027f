"""``--bf16`` without a TPU (fairseq_localness.compat.bf16): where a
config trains (CUDA GPU, CPU or TPU) for every combination of flags and machine, the
dtype and device of a real ``Trainer`` on the CPU, and ``train.sh --precision bf16``
end to end. None of it needs a GPU."""
import logging
import os

import pytest
import torch

from conftest import TINY_MODEL_ARGS, run_script


def _cfg(*flags, data="/dev/null"):
    """A fairseq-train config as ``fairseq-train`` builds it."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_localness  # noqa: F401

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        data, "--task", "translation", "--arch", "transformer", "--optimizer", "adam", "--lr", "1e-3",
        "--source-lang", "src", "--target-lang", "tgt", "--max-tokens", "1024", *flags])
    return convert_namespace_to_omegaconf(args)


def _tpu_flags(cfg):
    return [cfg.common.tpu, cfg.optimizer.tpu, cfg.distributed_training.tpu, cfg.model.tpu]


# flags, torch_xla installed, CUDA available -> device
CASES = {
    "bf16_on_gpu": (["--bf16"], False, True, "cuda"),
    "bf16_on_cpu_machine": (["--bf16"], False, False, "cpu"),
    "bf16_cpu_flag_with_gpu": (["--bf16", "--cpu"], False, True, "cpu"),
    "bf16_cpu_flag_with_xla": (["--bf16", "--cpu"], True, False, "cpu"),
    "memory_efficient_bf16_on_gpu": (["--memory-efficient-bf16"], False, True, "cuda"),
    "bf16_with_xla_is_tpu": (["--bf16"], True, True, "tpu"),
    "fp32_on_gpu": ([], False, True, "cuda"),
    "fp16_on_gpu": (["--fp16"], False, True, "cuda"),
    "explicit_tpu_is_kept": (["--tpu"], False, True, "tpu"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_device_selection(case):
    from fairseq_localness.compat.bf16 import bf16_device

    flags, xla, cuda, expected = CASES[case]
    cfg = _cfg(*flags)
    if "--bf16" in flags or "--memory-efficient-bf16" in flags:
        assert cfg.common.bf16 and all(_tpu_flags(cfg)), "fairseq's --bf16 no longer implies --tpu"
    assert bf16_device(cfg, xla_available=xla, cuda_available=cuda) == expected
    # every copy of the flag agrees with the device: a TPU run keeps all of them
    assert _tpu_flags(cfg) == [expected == "tpu"] * 4
    assert cfg.common.bf16 == any("bf16" in f for f in flags)


def _trainer_step(cfg, seen):
    """fairseq-train's main, reduced to one update: task, model, criterion, Trainer."""
    from fairseq import tasks
    from fairseq.trainer import Trainer

    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=1024).next_epoch_itr(shuffle=False)
    log = trainer.train_step([next(batches)])
    masters = trainer.optimizer.fp32_params  # flat: one per device (compat.mixed_precision)
    seen.update(device=trainer.device, dtypes={p.dtype for p in trainer.model.parameters()},
                optimizer=type(trainer.optimizer).__name__, flat=isinstance(masters, dict),
                master=[p.dtype for p in (masters.values() if isinstance(masters, dict) else masters)],
                loss=log["loss"])


def test_trainer_trains_in_bf16_on_the_cpu(tiny_data_bin):
    """``--bf16 --cpu`` through fairseq's ``call_main``: the Trainer is on the CPU
    (fairseq alone asks torch_xla for a TPU and fails), its model in bfloat16 with
    fp32 master weights, and an update gives a finite loss."""
    from fairseq.distributed import utils as distributed_utils

    cfg = _cfg("--bf16", "--cpu", "--arch", "localness_transformer", *TINY_MODEL_ARGS,
               "--num-workers", "0", data=tiny_data_bin.data_bin)
    seen = {}
    distributed_utils.call_main(cfg, _trainer_step, seen=seen)
    assert seen["device"] == torch.device("cpu")
    assert seen["dtypes"] == {torch.bfloat16}
    assert seen["optimizer"] == "FP16Optimizer" and set(seen["master"]) == {torch.float32} and seen["flat"]
    assert torch.isfinite(torch.tensor(float(seen["loss"])))


def test_call_main_on_a_gpu_without_native_bf16_warns(monkeypatch, caplog):
    """On a (simulated) CUDA GPU of compute capability 7.0, ``--bf16`` leaves the TPU
    off, trains on the GPU and warns that bfloat16 is emulated there."""
    from fairseq.distributed import utils as distributed_utils

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    monkeypatch.setattr("fairseq_localness.compat.bf16.torch_xla_available", lambda: False)
    cfg = _cfg("--bf16")
    seen = []
    with caplog.at_level(logging.INFO, logger="fairseq_localness.compat.bf16"):
        distributed_utils.call_main(cfg, lambda c: seen.append(_tpu_flags(c)))
    assert seen == [[False] * 4]
    assert "training in bfloat16 on the CUDA (no TPU: torch_xla is not installed)" in caplog.text
    assert "Tesla V100-SXM2-16GB has no native bfloat16 arithmetic (compute capability 7.0" in caplog.text


def test_train_sh_precision_bf16_on_the_cpu(tiny_data_bin, tmp_path):
    """``train.sh --precision bf16 --cpu`` passes ``--bf16`` and trains (it was an
    error while fairseq's --bf16 meant a TPU)."""
    save_dir = tmp_path / "ckpts"
    p = run_script("train.sh", [
        "--arch", "hysan_transformer", "--data-bin", tiny_data_bin.data_bin, "--save-dir", save_dir,
        "--max-update", "1", "--src", "src", "--tgt", "tgt", "--cpu", "--precision", "bf16", "--",
        *TINY_MODEL_ARGS, "--max-tokens", "512", "--num-workers", "0", "--log-interval", "1"])
    assert "precision: --bf16 (--precision bf16; CPU)" in p.stderr
    assert "training in bfloat16 on the CPU (no TPU: --cpu)" in p.stdout + p.stderr
    assert os.path.isfile(save_dir / "checkpoint_last.pt")
