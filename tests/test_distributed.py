"""scripts/train.sh on several processes: a two-process data-parallel run on the CPU
(torchrun + gloo) of a few updates, its checkpoint, resuming it, the update-frequency
computation for an effective batch size, precision choices and multi-node command
lines; and the import-time fixes that make fairseq's distributed training work on CPU."""
import re

import pytest

from conftest import run_script
from model_utils import size_args

MODEL = size_args(layers=1, dim=16, ffn=32, heads=2)


def commands(stderr):
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


def train_args(data, save_dir, max_update, *extra_opts):
    return ["--arch", "transformer", "--data-bin", data.data_bin, "--save-dir", save_dir,
            "--max-update", str(max_update), "--src", data.src, "--tgt", data.tgt,
            "--cpu", "--gpus", "2", "--effective-tokens", "2000", *extra_opts, "--",
            *MODEL, "--max-tokens", "512", "--num-workers", "0", "--log-interval", "1",
            "--warmup-updates", "1"]


def num_updates(checkpoint):
    import torch

    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return state["optimizer_history"][-1]["num_updates"]


@pytest.fixture(scope="module")
def two_process_run(tiny_data_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("dist") / "ckpts"
    p = run_script("train.sh", train_args(tiny_data_bin, save_dir, 2))
    return save_dir, p


def test_two_process_cpu_run_writes_a_loadable_checkpoint(two_process_run, tiny_data_bin):
    save_dir, p = two_process_run
    log = p.stdout + p.stderr
    cmd = [c for c in commands(p.stderr) if "torch.distributed.run" in c]
    assert len(cmd) == 1, commands(p.stderr)
    assert "--nproc_per_node 2 --standalone -m fairseq_cli.train" in cmd[0]
    assert "--cpu --distributed-world-size 2 --distributed-backend gloo" in cmd[0]
    # --effective-tokens 2000 with --max-tokens 512 on 2 processes: 500 x 2 x 2
    assert "--update-freq 2 = ceil(2000 / (512 max tokens x 2)), --max-tokens 500 = floor(2000 / (2 x 2))" in p.stderr
    assert "--max-tokens 500 --update-freq 2" in cmd[0]
    assert "training on 2 devices" in log
    assert "'distributed_world_size': 2" in log and "'update_freq': [2]" in log and "'max_tokens': 500" in log
    assert "distributed init (rank 1): env://" in log
    checkpoint = save_dir / "checkpoint_last.pt"
    assert checkpoint.is_file()
    assert num_updates(checkpoint) == 2

    import fairseq_localness  # noqa: F401  (the checkpoint-loading fix)
    from fairseq import checkpoint_utils

    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": tiny_data_bin.data_bin})
    assert len(models) == 1 and cfg.distributed_training.distributed_world_size == 2
    assert cfg.common.cpu and cfg.optimization.update_freq == [2]
    assert models[0].encoder.embed_tokens.embedding_dim == 16


def test_rerun_resumes_from_the_last_checkpoint(two_process_run, tiny_data_bin):
    """The same command with a larger --max-update continues from update 2 (rank 0
    reads the checkpoint and sends it to rank 1)."""
    save_dir, _ = two_process_run
    p = run_script("train.sh", train_args(tiny_data_bin, save_dir, 3))
    log = p.stdout + p.stderr
    assert f"resuming from {save_dir}/checkpoint_last.pt" in p.stderr
    assert "Loaded checkpoint" in log and "(epoch 1 @ 2 updates)" in log
    # train.sh logs JSON records: "num_updates": "3"
    assert re.search(r'"num_updates": "?3"?', log) and not re.search(r'"num_updates": "?1"?[,}]', log)
    assert num_updates(save_dir / "checkpoint_last.pt") == 3


def test_multi_node_command_line(tiny_data_bin, tmp_path):
    """--dry-run: torchrun's node options, the world size over all nodes and the
    update frequency for it; nothing is trained or written."""
    save_dir = tmp_path / "ckpts"
    p = run_script("train.sh", [
        "--arch", "transformer", "--data-bin", tiny_data_bin.data_bin, "--save-dir", save_dir,
        "--max-update", "10", "--src", "src", "--tgt", "tgt", "--cpu", "--gpus", "2", "--nodes", "2",
        "--node-rank", "1", "--master-addr", "10.1.2.3", "--master-port", "29555",
        "--effective-tokens", "32768", "--dry-run", "--", "--max-tokens", "1024"])
    assert ("torch.distributed.run --nproc_per_node 2 --nnodes 2 --node_rank 1 --master_addr 10.1.2.3 "
            "--master_port 29555 -m fairseq_cli.train") in p.stdout
    assert "--distributed-world-size 4 --distributed-backend gloo" in p.stdout
    assert "--max-tokens 1024 --update-freq 8" in p.stdout
    assert "--update-freq 8 = ceil(32768 / (1024 max tokens x 4)), --max-tokens 1024" in p.stderr
    assert "precision: fp32" in p.stderr
    assert commands(p.stderr) == [] and not save_dir.exists()


def _cuda_available():
    import torch

    return torch.cuda.is_available()


BASE = "--arch transformer --data-bin BIN --save-dir NEW --max-update 2 --src src --tgt tgt"
BAD = {
    "fp16_on_cpu": ("--cpu --gpus 2 --precision fp16", ["--precision fp16: not possible with --cpu"]),
    "fp16_flag_on_cpu": ("--cpu -- --fp16", ["--fp16 (after --): not possible with --cpu"]),
    "bad_precision": ("--precision fp8", ["--precision: expected one of: auto fp32 fp16 bf16; got 'fp8'"]),
    "update_freq_twice": ("--effective-tokens 4000 -- --update-freq 4",
                          ["--effective-tokens: sets --update-freq itself"]),
    "bad_effective_tokens": ("--effective-tokens lots", ["--effective-tokens: expected a whole number >= 1"]),
    "bad_gpus": ("--gpus -1", ["--gpus: expected a whole number >= 0, got '-1'"]),
    "nodes_without_master": ("--cpu --gpus 2 --nodes 2 --node-rank 1", ["--nodes 2: expected --master-addr HOST"]),
    "nodes_without_gpus": ("--nodes 2 --master-addr h", ["--nodes 2: expected --gpus N"]),
    "node_rank_too_big": ("--cpu --gpus 2 --nodes 2 --node-rank 2 --master-addr h",
                          ["--node-rank: expected 0 .. 1 (--nodes 2), got 2"]),
    "bad_port": ("--cpu --gpus 2 --master-port 70000", ["--master-port: expected a TCP port"]),
    "gpus_without_gpus": ("--gpus 2", ["--gpus 2: this machine has 0 CUDA GPU(s)", "or --cpu"]),
    "precision_twice": ("--precision fp32 -- --fp16", ["--precision fp32: conflicts with --fp16"]),
}
NEEDS_NO_GPU = {"gpus_without_gpus"}


@pytest.mark.parametrize("case", list(BAD))
def test_impossible_choices_fail_before_training(case, tiny_data_bin, tmp_path):
    opts, fragments = BAD[case]
    if case in NEEDS_NO_GPU and _cuda_available():
        pytest.skip("this machine has CUDA GPUs")
    new = tmp_path / "new"
    argv = [{"BIN": tiny_data_bin.data_bin, "NEW": str(new)}.get(a, a) for a in f"{BASE} {opts}".split()]
    p = run_script("train.sh", argv, check=False)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.startswith("train.sh: error: "), p.stderr
    for fragment in fragments:
        assert fragment in p.stderr, (fragment, p.stderr)
    assert commands(p.stderr) == [] and not new.exists()


# --------------------------------------------------------------------------- compat fixes
@pytest.mark.skipif(_cuda_available(), reason="checks the CPU-only path")
def test_torchrun_environment_on_cpu(monkeypatch):
    import fairseq_localness  # noqa: F401
    from fairseq.dataclass.configs import DistributedTrainingConfig
    from fairseq.distributed import utils as dist_utils

    from fairseq_localness.compat.cpu_distributed import patch_cpu_distributed

    patch_cpu_distributed()  # idempotent
    assert dist_utils._infer_torch_distributed_launch_init.__wrapped__ is not None
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999", "WORLD_SIZE": "4", "RANK": "3",
                 "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    cfg = DistributedTrainingConfig(distributed_world_size=4, tpu=False)
    dist_utils.infer_init_method(cfg)  # fairseq's own: ZeroDivisionError without the fix
    assert cfg.distributed_init_method == "env://"
    assert (cfg.distributed_world_size, cfg.distributed_rank, cfg.device_id) == (4, 3, 0)
    assert cfg.distributed_no_spawn


DDP_SCRIPT = r"""
import argparse, sys
import torch
import torch.distributed as dist
import fairseq_localness  # noqa: F401  (the fix)
from fairseq.models.distributed_fairseq_model import DistributedFairseqModel

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
try:
    args = argparse.Namespace(
        tpu=False, ddp_backend="pytorch_ddp", device_id=0, broadcast_buffers=False, bucket_cap_mb=25,
        find_unused_parameters=False, gradient_as_bucket_view=False, ddp_comm_hook="none")
    wrapped = DistributedFairseqModel(args, torch.nn.Linear(3, 2), dist.group.WORLD, torch.device("cpu"))
    out = wrapped(torch.ones(4, 3))
    out.sum().backward()
    print("output shape", tuple(out.shape), flush=True)
    # the wrapper (DDP's reducer and its threads) goes before the group it uses: destroyed
    # after it, at the interpreter's exit, it aborted the process now and then (exit status
    # -6, "terminate called without an active exception")
    del wrapped, out
finally:
    dist.destroy_process_group()
"""


def test_ddp_wrapper_accepts_a_cpu_model(tmp_path):
    """fairseq's pytorch_ddp wrapper passes device_ids=[0]; torch refuses that for a
    CPU model unless the fix drops it (a one-process gloo group). The group is made
    in a subprocess with a time limit: never in the pytest process (see conftest)."""
    import sys

    from conftest import run_command, tool_env

    proc = run_command([sys.executable, "-c", DDP_SCRIPT, tmp_path / "store"], env=tool_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "output shape (4, 2)" in proc.stdout


MAIN_SCRIPT = r"""
import sys
import torch.distributed as dist
import fairseq_localness  # noqa: F401  (the fix)
from fairseq.dataclass.configs import FairseqConfig
from fairseq.distributed import utils as dist_utils

cfg = FairseqConfig()
dt = cfg.distributed_training
dt.distributed_world_size, dt.distributed_rank, dt.distributed_backend = 1, 0, "gloo"
dt.distributed_init_method = "file://" + sys.argv[1]
cfg.common.cpu = True
seen = []
dist_utils.distributed_main(0, lambda cfg: seen.append(dist.is_initialized()), cfg, {})
print("inside", seen, "after", dist.is_initialized())
"""


def test_training_processes_destroy_their_process_group(tmp_path):
    """fairseq's distributed_main (training, then its barrier) leaves the group to the
    interpreter's exit, where gloo can abort a finished run (exit status -6); with
    the fix the group is gone when it returns. A one-process gloo group in a
    subprocess, through fairseq's own function."""
    import sys

    from conftest import run_command, tool_env

    proc = run_command([sys.executable, "-c", MAIN_SCRIPT, tmp_path / "store"], env=tool_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "inside [True] after False" in proc.stdout


def test_process_groups_are_refused_in_the_pytest_process(tmp_path):
    import torch.distributed as dist

    with pytest.raises(RuntimeError, match="in a subprocess"):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    assert not dist.is_initialized()


def test_distributed_utils_load_trusted_checkpoints():
    import fairseq_localness  # noqa: F401
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as dist_utils

    from fairseq_localness.compat import checkpoint_loading

    for module in (checkpoint_utils, dist_utils):
        assert getattr(module.torch, checkpoint_loading._MARK, False), module.__name__
