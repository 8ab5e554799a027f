"""Checkpoints load on torch >= 2.6 (``torch.load`` defaults to ``weights_only=True``)
in every entry point a user touches: fairseq-generate, fairseq-interactive, resumed
fairseq-train, the hub interface, and checkpoint averaging.

Each entry point is driven through its real command line (or a fresh interpreter for
the hub interface), so the test sees exactly what a user sees: without
``fairseq_localness.compat`` each of them dies with ``Unsupported global:
argparse.Namespace``. ``test_plain_torch_load_refuses_fairseq_checkpoints`` keeps
that premise checked: if a future torch loads these files by default, it fails and
says the other tests no longer prove anything.
"""
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import USER_DIR, parse_hypotheses, run_fairseq, tool_env, train_command


@pytest.fixture(scope="module")
def trained(tiny_data_bin, tmp_path_factory):
    """A transformer trained 2 updates, with a checkpoint after each update."""
    save_dir = str(tmp_path_factory.mktemp("trained") / "checkpoints")
    run_fairseq("fairseq-train", train_command(
        "transformer", tiny_data_bin, save_dir, max_update=2,
        extra_args=["--save-interval-updates", "1", "--no-epoch-checkpoints"],
    ))
    return save_dir


def test_plain_torch_load_refuses_fairseq_checkpoints(trained):
    """The premise of this file: torch's default cannot read a fairseq checkpoint."""
    if "weights_only" not in torch.load.__code__.co_varnames:
        pytest.skip("torch without weights_only")
    with pytest.raises(pickle.UnpicklingError, match="Unsupported global|weights_only"):
        torch.load(os.path.join(trained, "checkpoint_last.pt"))


def test_fairseq_generate_loads_checkpoint(trained, tiny_data_bin):
    data = tiny_data_bin
    proc = run_fairseq("fairseq-generate", [
        data.data_bin, "--user-dir", USER_DIR, "--source-lang", "src", "--target-lang", "tgt",
        "--path", os.path.join(trained, "checkpoint_last.pt"), "--gen-subset", "test",
        "--beam", "2", "--batch-size", "8", "--max-len-a", "1.5", "--max-len-b", "5",
    ])
    # every test sentence, also those of the last, smaller batch (12 = 8 + 4)
    assert len(parse_hypotheses(proc.stdout)) == len(data.lines("test", "src")) == 12


def test_fairseq_interactive_loads_checkpoint(trained, tiny_data_bin):
    data = tiny_data_bin
    # raw text in, through the sentencepiece model, as a user would type it
    sentences = data.lines("test", "src")[:3]
    proc = run_fairseq("fairseq-interactive", [
        data.data_bin, "--user-dir", USER_DIR, "--source-lang", "src", "--target-lang", "tgt",
        "--path", os.path.join(trained, "checkpoint_last.pt"), "--beam", "2",
        "--bpe", "sentencepiece", "--sentencepiece-model", data.spm_model,
        "--buffer-size", "2", "--batch-size", "2", "--max-len-a", "1.5", "--max-len-b", "5",
    ], input="\n".join(sentences) + "\n")
    assert len(parse_hypotheses(proc.stdout)) == 3
    assert sum(line.startswith("S-") for line in proc.stdout.splitlines()) == 3


def test_resumed_training_loads_checkpoint(trained, tiny_data_bin, tmp_path):
    save_dir = str(tmp_path / "checkpoints")
    shutil.copytree(trained, save_dir)
    proc = run_fairseq("fairseq-train", train_command("transformer", tiny_data_bin, save_dir, max_update=3))
    log = proc.stdout + proc.stderr
    assert "Loaded checkpoint" in log and "@ 2 updates" in log, log[-3000:]
    state = torch.load(os.path.join(save_dir, "checkpoint_last.pt"), weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == 3


HUB_SCRIPT = r"""
import sys
from fairseq.models.transformer import TransformerModel
save_dir, data_bin, spm_model, user_dir, sentence = sys.argv[1:]
model = TransformerModel.from_pretrained(
    save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=data_bin,
    user_dir=user_dir, bpe="sentencepiece", sentencepiece_model=spm_model,
    beam=2, max_len_a=1.5, max_len_b=5,
)
print("TRANSLATION:", model.translate(sentence))
"""


def test_hub_interface_loads_checkpoint(trained, tiny_data_bin):
    """A fresh interpreter that imports only fairseq: ``user_dir=`` alone must suffice."""
    data = tiny_data_bin
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, trained, data.data_bin, data.spm_model, USER_DIR,
         data.lines("test", "src")[0]],
        capture_output=True, text=True, env=tool_env(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRANSLATION:" in proc.stdout


def test_average_cli_loads_checkpoints(trained, tmp_path):
    out = tmp_path / "avg.pt"
    run_fairseq("fairseq-localness-average", [
        "--inputs", trained, "--num-update-checkpoints", "2", "--output", out,
    ])
    a = torch.load(os.path.join(trained, "checkpoint_1_1.pt"), weights_only=False)["model"]
    b = torch.load(os.path.join(trained, "checkpoint_1_2.pt"), weights_only=False)["model"]
    avg = torch.load(out, weights_only=False)
    assert list(avg["model"]) == list(b)
    for k in b:
        expected = ((a[k].double() + b[k].double()) / 2).to(b[k].dtype)
        assert torch.equal(avg["model"][k], expected), k
    # everything else comes from the newest input, as with fairseq's script
    assert avg["optimizer_history"][-1]["num_updates"] == 2


# --------------------------------------------------------------------------- renamed parameters
def test_old_parameter_names_are_mapped_when_a_state_dict_is_loaded(monkeypatch):
    """A parameter renamed in the code keeps its checkpoints: the model's
    ``renamed_parameters`` maps the old names in ``upgrade_state_dict_named``, which
    fairseq's ``load_state_dict`` (and so every checkpoint loader) calls first. The hook
    leaves a current state dict alone, and refuses one that holds both names."""
    from fairseq_localness.models.hybrid_transformer import HybridTransformerModel
    from model_utils import TINY, build_model, random_batch

    saved, task = build_model("hybrid_transformer", TINY, seed=1)
    src, lens, prev, _ = random_batch(task, [5, 3], seed=2)
    with torch.no_grad():
        expected = saved(src, lens, prev)[0]
    current = saved.state_dict()
    # the state dict as an older version would have written it, with the gate under another name
    old = {k.replace(".fusion.gate.", ".fusion.old_gate."): v.clone() for k, v in current.items()}
    assert sum(".fusion.old_gate." in k for k in old) == 4  # weight and bias, encoder layers 1-2

    fresh, _ = build_model("hybrid_transformer", TINY, seed=2)
    with pytest.raises(RuntimeError, match="old_gate"):  # without the mapping: unexpected keys
        fresh.load_state_dict(dict(old))
    monkeypatch.setattr(HybridTransformerModel, "renamed_parameters", {r"\.fusion\.old_gate\.": ".fusion.gate."})
    fresh.load_state_dict(dict(old))
    with torch.no_grad():
        torch.testing.assert_close(fresh(src, lens, prev)[0], expected)

    unchanged = dict(current)
    fresh.upgrade_state_dict(unchanged)  # a current state dict: nothing to rename
    assert list(unchanged) == list(current)
    both = dict(current, **{k: v for k, v in old.items() if ".old_gate." in k})
    with pytest.raises(KeyError, match="has both"):
        fresh.upgrade_state_dict(both)
