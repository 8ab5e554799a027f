"""Checkpoints load on torch >= 2.6 (``torch.load`` defaults to ``weights_only=True``)
in every entry point a user touches: fairseq-generate, fairseq-interactive, resumed
fairseq-train, the hub interface, and checkpoint averaging.

Each entry point is driven through its real command line (or a fresh interpreter for
the hub interface), so the test sees exactly what a user sees: without
``fairseq_localness.compat.checkpoint_loading`` each of them dies with ``Unsupported
global: argparse.Namespace``. ``test_plain_torch_load_refuses_fairseq_checkpoints`` keeps
that premise checked: if a future torch loads these files by default, it fails and
says the other tests no longer prove anything. (That nothing but the weights and
``argparse.Namespace`` is unpickled is tested in test_checkpoint_safety.py.)

fairseq-generate and the hub interface, given a sentence longer than the model
accepts, translate its beginning with a warning naming it (fairseq-interactive's is
tested in test_faults.py).
"""
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

from conftest import USER_DIR, parse_hypotheses, run_fairseq, tool_env, train_command

from fairseq_localness.checkpoint import torch_load_checkpoint

MAX_POSITIONS = 40


@pytest.fixture(scope="module")
def trained(tiny_data_bin, tmp_path_factory):
    """A transformer trained 2 updates, with a checkpoint after each update; it
    accepts sentences of up to MAX_POSITIONS tokens (every sentence of the tiny test
    set)."""
    save_dir = str(tmp_path_factory.mktemp("trained") / "checkpoints")
    run_fairseq("fairseq-train", train_command(
        "transformer", tiny_data_bin, save_dir, max_update=2,
        extra_args=["--save-interval-updates", "1", "--no-epoch-checkpoints",
                    "--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS),
                    "--skip-invalid-size-inputs-valid-test"],
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
    state = torch_load_checkpoint(os.path.join(save_dir, "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 3


HUB_SCRIPT = r"""
import sys
from fairseq.models.transformer import TransformerModel
save_dir, data_bin, spm_model, user_dir, *sentences = sys.argv[1:]
model = TransformerModel.from_pretrained(
    save_dir, checkpoint_file="checkpoint_last.pt", data_name_or_path=data_bin,
    user_dir=user_dir, bpe="sentencepiece", sentencepiece_model=spm_model,
    beam=2, max_len_a=1.5, max_len_b=5,
)
for translation in model.translate(sentences):
    print("TRANSLATION:", translation)
"""


def test_hub_interface_loads_checkpoint_and_translates_an_over_long_sentence(trained, tiny_data_bin):
    """A fresh interpreter that imports only fairseq: ``user_dir=`` alone must suffice.
    The second sentence is longer than the model accepts: its beginning is
    translated, with a warning naming it, instead of a stop."""
    data = tiny_data_bin
    first = data.lines("test", "src")[0]
    long = " ".join([first] * 3)
    n_tokens = len(data.lines("test", "src", segmented=True)[0].split()) * 3 + 1
    assert n_tokens > MAX_POSITIONS
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, trained, data.data_bin, data.spm_model, USER_DIR, first, long],
        capture_output=True, text=True, env=tool_env(), timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("TRANSLATION:") == 2
    assert (f"input sentence 2 has {n_tokens} tokens (with the end of sentence), more than the model accepts "
            f"(max_positions={MAX_POSITIONS}); translating its first {MAX_POSITIONS - 1}") in proc.stderr
    assert "input sentence 1 " not in proc.stderr


def test_the_hub_says_where_it_looked_for_a_missing_dictionary(trained, tiny_data_bin):
    """from_pretrained with the default data_name_or_path ('.', the checkpoint's folder,
    which holds no dictionaries): fairseq's FileNotFoundError, naming the dictionary,
    the folder, the option and what it expects; the same call with the data-bin
    loads."""
    import fairseq_localness  # noqa: F401
    from fairseq.models.transformer import TransformerModel

    kwargs = dict(checkpoint_file="checkpoint_last.pt", bpe="sentencepiece",
                  sentencepiece_model=tiny_data_bin.spm_model)
    with pytest.raises(FileNotFoundError) as missing:
        TransformerModel.from_pretrained(trained, **kwargs)
    assert missing.value.filename == os.path.join(trained, f"dict.{tiny_data_bin.src}.txt")
    assert str(missing.value).startswith(
        f"[Errno 2] no dictionary dict.{tiny_data_bin.src}.txt in {trained!r}, where data_name_or_path='.' points, "
        "relative to the model's folder: the task reads its dictionaries from there, not from the checkpoint; "
        "expected data_name_or_path= the data-bin the model was trained on"), str(missing.value)
    # a folder given as it is: named as given
    with pytest.raises(FileNotFoundError) as missing:
        TransformerModel.from_pretrained(trained, data_name_or_path=trained, **kwargs)
    assert f"where data_name_or_path={trained!r} points: the task" in str(missing.value)
    model = TransformerModel.from_pretrained(trained, data_name_or_path=tiny_data_bin.data_bin, **kwargs)
    assert model.translate(tiny_data_bin.lines("test", "src")[0])


def test_fairseq_generate_translates_the_beginning_of_an_over_long_test_sentence(trained, tiny_data_bin, tmp_path):
    """Sentence 2 of the test set (source and reference), repeated, is longer than the
    model accepts: fairseq-generate translates its first MAX_POSITIONS - 1 tokens with
    a warning naming it, translates every other sentence, and keeps the reference
    whole (decoding does not read it)."""
    data = tiny_data_bin
    seg = {lang: data.lines("test", lang, segmented=True) for lang in ("src", "tgt")}
    for lang in seg:
        seg[lang][2] = " ".join([seg[lang][2]] * (MAX_POSITIONS // len(seg[lang][2].split()) + 2))
        with open(tmp_path / f"test.{lang}", "w", encoding="utf-8") as f:
            f.write("\n".join(seg[lang]) + "\n")
    n_src, n_tgt = len(seg["src"][2].split()) + 1, len(seg["tgt"][2].split()) + 1
    assert n_src > MAX_POSITIONS and n_tgt > MAX_POSITIONS
    data_bin = tmp_path / "bin"
    run_fairseq("fairseq-preprocess", [
        "--source-lang", "src", "--target-lang", "tgt", "--testpref", tmp_path / "test", "--destdir", data_bin,
        "--srcdict", os.path.join(data.data_bin, "dict.src.txt"),
        "--tgtdict", os.path.join(data.data_bin, "dict.tgt.txt"), "--workers", "1"])
    proc = run_fairseq("fairseq-generate", [
        data_bin, "--user-dir", USER_DIR, "--source-lang", "src", "--target-lang", "tgt",
        "--path", os.path.join(trained, "checkpoint_last.pt"), "--gen-subset", "test",
        "--beam", "2", "--batch-size", "4", "--max-len-a", "1.5", "--max-len-b", "5"])
    assert (f"sentence 2 of 'test' (S-2/H-2 in the output, line 3 of its text) has {n_src} tokens (with the end "
            f"of sentence), more than the model accepts (max_positions={MAX_POSITIONS}); translating its first "
            f"{MAX_POSITIONS - 1} and the end of sentence") in proc.stderr
    assert proc.stderr.count("more than the model accepts") == 1
    assert len(parse_hypotheses(proc.stdout)) == 12
    lines = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if line[:2] in ("S-", "T-"))
    assert lines["S-2"].split() == seg["src"][2].split()[:MAX_POSITIONS - 1]
    assert lines["T-2"].split() == seg["tgt"][2].split()  # the whole reference


def test_average_cli_loads_checkpoints(trained, tmp_path):
    out = tmp_path / "avg.pt"
    run_fairseq("fairseq-localness-average", [
        "--inputs", trained, "--num-update-checkpoints", "2", "--output", out,
    ])
    a = torch_load_checkpoint(os.path.join(trained, "checkpoint_1_1.pt"))["model"]
    b = torch_load_checkpoint(os.path.join(trained, "checkpoint_1_2.pt"))["model"]
    avg = torch_load_checkpoint(str(out))
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
