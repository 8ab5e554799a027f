"""What a resumed fairseq-train takes from its checkpoint is checked before a step.

A checkpoint_last.pt forged with an impossible update count, iterator position,
optimizer state or scheduler state is refused in one line naming the file and the
value, before any update: through fairseq's own resume (``checkpoint_utils.
load_checkpoint`` on a ``Trainer``, as ``fairseq-train`` calls it, several rows in
one process) and through ``fairseq-train`` itself under a 1.5 GB memory limit. The
real checkpoint resumes through the same code (fairseq_localness.checkpoint.resume).
"""
import os
import shutil

import pytest
import torch

import forge
from conftest import get_tiny_data, run_command, run_fairseq, tool_env, tool_path, train_command

from fairseq_localness.checkpoint import CheckpointError

SMALL_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
               "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
MEMORY_LIMIT = 1536 << 20  # bytes of address space for a refused resume


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A transformer trained 2 updates (mid-epoch: its iterator position is 2)."""
    data = get_tiny_data()
    save_dir = str(tmp_path_factory.mktemp("resume") / "run")
    run_fairseq("fairseq-train", train_command("transformer", data, save_dir, [], SMALL_MODEL, 2))
    return {"path": os.path.join(save_dir, "checkpoint_last.pt"), "data": data}


def _history(key, value):
    return lambda st: st["optimizer_history"][-1].__setitem__(key, value)


def _iterator(key, value):
    return lambda st: st["extra_state"]["train_iterator"].__setitem__(key, value)


def _group(key, value):
    return lambda st: st["last_optimizer_state"]["param_groups"][0].__setitem__(key, value)


def _moment(st):
    moments = st["last_optimizer_state"]["state"]
    moments[sorted(moments)[0]]["exp_avg"] = torch.zeros(3, 5)


def _first_moment(key, value):
    def change(st):
        moments = st["last_optimizer_state"]["state"]
        moments[sorted(moments)[0]][key] = value(moments[sorted(moments)[0]][key])
    return change


def _extra_group(st):
    groups = st["last_optimizer_state"]["param_groups"]
    groups.append(dict(groups[0], params=[]))


ROWS = {  # name: (change to the state, what the one line says)
    "num_updates = 2**40": (_history("num_updates", 2 ** 40), "its optimizer_history[0]'s num_updates = "
                            "1099511627776 is not an integer in 0 .. 2**31"),
    "num_updates = -1000": (_history("num_updates", -1000), "num_updates = -1000 is not an integer in 0 .. 2**31"),
    "a string as the scheduler's best": (
        lambda st: st["optimizer_history"][-1]["lr_scheduler_state"].__setitem__("best", "x"),
        "lr_scheduler_state's best = 'x' is not a number"),
    "iterations_in_epoch = 10**9": (_iterator("iterations_in_epoch", 10 ** 9), "its extra_state's train_iterator "
                                    "iterations_in_epoch = 1000000000 is past the epoch's"),
    "epoch 0": (_iterator("epoch", 0), "train_iterator epoch = 0 is not an integer in 1 .. 2**31"),
    "a string in betas": (_group("betas", ("a", "b")), "its last_optimizer_state's param_groups[0] betas = "
                          "('a', 'b') is not of the kind the run's optimizer has"),
    "a beta of 1": (_group("betas", (0.9, 1.0)), "param_groups[0] betas = 1.0 is not a finite number >= 0 and < 1"),
    "amsgrad switched on": (_group("amsgrad", True), "param_groups[0] amsgrad = True, the run's optimizer False"),
    "a NaN learning rate": (_group("lr", float("nan")), "param_groups[0] lr = nan is not a finite number"),
    "a moment of another shape": (_moment, "exp_avg is a tensor of shape [3, 5], its parameter's is"),
    "a negative second moment": (_first_moment("exp_avg_sq", lambda v: v.fill_(-1.0)),
                                 "exp_avg_sq holds 1,664 values that are not finite or are negative (of 1,664)"),
    "a NaN step": (_first_moment("step", lambda v: torch.tensor(float("nan"))),
                   "step holds 1 values that are not finite or are negative"),
    "a second parameter group": (_extra_group, "has 2 parameter groups, the run's optimizer 1"),
    "a loss scale of 0": (lambda st: st["last_optimizer_state"].__setitem__("loss_scale", 0),
                          "its last_optimizer_state's loss_scale is 0"),
}


def _trainer(data, save_dir):
    """A Trainer for the run fairseq-train would make of ``save_dir`` (the model of
    the real checkpoint, Adam, inverse square root)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    args = options.parse_args_and_arch(options.get_training_parser(),
                                       train_command("transformer", data, save_dir, [], SMALL_MODEL, 5))
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return cfg, Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))


def _resume(data, save_dir):
    from fairseq import checkpoint_utils

    cfg, trainer = _trainer(data, save_dir)
    return trainer, checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)


def test_the_real_checkpoint_resumes_through_the_checks(real, tmp_path):
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    shutil.copy(real["path"], save_dir / "checkpoint_last.pt")
    trainer, (extra_state, epoch_itr) = _resume(real["data"], str(save_dir))
    assert trainer.get_num_updates() == 2 and epoch_itr.iterations_in_epoch == 2
    assert trainer.optimizer.optimizer.state  # Adam's moments, loaded


def test_a_forged_resume_is_refused_before_a_step(real, tmp_path):
    """Each row in a save directory of its own, resumed as fairseq-train resumes."""
    for name, (change, fragment) in ROWS.items():
        save_dir = tmp_path / name.replace(" ", "_")
        save_dir.mkdir()
        path = forge.with_state(real["path"], save_dir / "checkpoint_last.pt", change)
        cfg, trainer = _trainer(real["data"], str(save_dir))
        from fairseq import checkpoint_utils

        with pytest.raises(CheckpointError) as e:
            checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
        message = str(e.value)
        assert message.startswith(f"refusing to load checkpoint '{path}': ") and "\n" not in message, (name, message)
        assert fragment in message, (name, message)
        assert trainer.get_num_updates() in (0, 2), name  # no forged count taken (2: the real one, read before)


def test_scheduler_states_as_fairseq_writes_them_pass():
    """Numbers or None; the composite optimizer's: one such dict per optimizer."""
    from fairseq_localness.checkpoint.resume import check_scheduler_state

    check_scheduler_state({"best": None}, "f")
    check_scheduler_state({"best": 2.5, "last_epoch": 3}, "f")
    check_scheduler_state({"encoder": {"best": 1.0}, "decoder": {"lr": 0.1}}, "f")
    with pytest.raises(CheckpointError, match="lr_scheduler_state's decoder's lr = 'x' is not a number"):
        check_scheduler_state({"encoder": {"best": 1.0}, "decoder": {"lr": "x"}}, "f")


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_a_checkpoint_last_that_is_not_a_file_is_refused_before_training(real, tmp_path, kind):
    """fairseq would start from scratch in silence (not a file: no checkpoint), then
    fail at its first save."""
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    last = save_dir / "checkpoint_last.pt"
    last.mkdir() if kind == "directory" else os.mkfifo(last)
    cfg, trainer = _trainer(real["data"], str(save_dir))
    from fairseq import checkpoint_utils

    with pytest.raises(CheckpointError, match=f"refusing to load checkpoint '{last}': it is a"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)


@pytest.mark.parametrize("row, fragment", [
    ("num_updates = 2**40", ROWS["num_updates = 2**40"][1]), ("directory", "it is a directory, not a regular file")])
def test_fairseq_train_refuses_a_forged_resume_in_one_line(real, tmp_path, row, fragment):
    """Through fairseq-train under a 1.5 GB memory limit: one line, no traceback, no update."""
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    if row == "directory":
        (save_dir / "checkpoint_last.pt").mkdir()
    else:
        forge.with_state(real["path"], save_dir / "checkpoint_last.pt", ROWS[row][0])
    cmd = ["prlimit", f"--as={MEMORY_LIMIT}", "--", tool_path("fairseq-train"),
           *train_command("transformer", real["data"], str(save_dir), [], SMALL_MODEL, 5)]
    proc = run_command(cmd, env=tool_env(), timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "train_inner" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fairseq-train: error: ")]
    assert len(errors) == 1 and f"refusing to load checkpoint '{save_dir}/checkpoint_last.pt': " in errors[0], errors
    assert fragment in errors[0], errors


def test_a_resume_that_fairseq_cannot_do_is_one_line_that_says_so():
    """A failure within fairseq's resume (a scheduler's state of another kind: KeyError
    'best') is one line naming the file and the resume, not the model's build."""
    import fairseq_localness  # noqa: F401  (installs the one-line failures)
    from fairseq import trainer

    from fairseq_localness.checkpoint import MalformedCheckpointError

    with pytest.raises(MalformedCheckpointError, match=r"^refusing to load checkpoint 'x\.pt': fairseq cannot resume "
                                                       r"training from it \(AttributeError: "):
        trainer.Trainer.load_checkpoint(object(), "x.pt")
