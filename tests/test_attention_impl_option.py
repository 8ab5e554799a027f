"""``--attention-impl``: the kernel setting of every model's attention sublayers, as a
fairseq option. It reaches every core the options build and none of fairseq's own
modules, is checked like the other model options (on the command line, and when a
saved model is built), is stored in checkpoints, and is changed at generation with
``--model-overrides``; the kernels it names compute what the reference computes."""
import os

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from conftest import USER_DIR, get_tiny_data, parse_hypotheses, run_fairseq, train_command
from fairseq_localness.models._locality import OptionError
from fairseq_localness.modules.attention import AttentionCore
from fairseq_localness.modules.kernels import dense
from fairseq_localness.modules.kernels.choice import ATTENTION_IMPLS
from model_utils import TINY, ToyTask, build_model, command_line_error, parse_model_args, random_batch

# one system per model, each with cores on both sides where the model has them
MODELS = {
    "localness": ("localness_transformer", ["--localness-decoder-layers", "1"]),
    "rel_pos": ("localness_transformer", ["--localness-rel-pos"]),
    "hybrid": ("hybrid_transformer", ["--hybrid-decoder-layers", "1-2"]),
    "hysan": ("hysan_transformer", []),
    "full_dc": ("dc_transformer", ["--dc-mode", "full"]),
}


def _cores(model):
    return [m for m in model.modules() if isinstance(m, AttentionCore)]


@pytest.mark.parametrize("system", list(MODELS))
@pytest.mark.parametrize("impl", ATTENTION_IMPLS)
def test_every_core_gets_the_setting(system, impl):
    arch, options = MODELS[system]
    model, _ = build_model(arch, TINY + options + ["--attention-impl", impl])
    cores = _cores(model)
    assert cores and {core.attention_impl for core in cores} == {impl}


@pytest.mark.parametrize("system", list(MODELS))
def test_the_default_is_auto(system):
    arch, options = MODELS[system]
    args = parse_model_args(arch, TINY + options)
    assert args.attention_impl == "auto"
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, ToyTask())
    assert {core.attention_impl for core in _cores(model)} == {"auto"}


def test_a_checkpoint_without_the_option_builds_with_auto():
    """A model saved before the option existed: its config has no attention_impl."""
    args = parse_model_args("hysan_transformer", TINY)
    del args.attention_impl
    args._name = "hysan_transformer"
    model = ARCH_MODEL_REGISTRY["hysan_transformer"].build_model(args, ToyTask())
    assert {core.attention_impl for core in _cores(model)} == {"auto"}


def test_an_unknown_value_is_an_argparse_error(capsys):
    err = command_line_error("localness_transformer", ["--attention-impl", "triton"], capsys)
    assert "--attention-impl" in err and "invalid choice: 'triton'" in err
    for impl in ATTENTION_IMPLS:
        assert repr(impl) in err


def test_an_unknown_value_from_model_overrides_names_the_option():
    """--model-overrides bypasses argparse's choices: the model's own check names it."""
    args = parse_model_args("localness_transformer", TINY)
    args.attention_impl = "triton"
    args._name = "localness_transformer"
    with pytest.raises(OptionError, match=r"--attention-impl 'triton': unknown kernel setting; allowed: auto, sdpa, "
                                          r"eager, flex, dense"):
        ARCH_MODEL_REGISTRY["localness_transformer"].build_model(args, ToyTask())


@pytest.mark.parametrize("arch,options", [
    ("localness_transformer", ["--localness-encoder-layers", "none"]),
    ("hybrid_transformer", ["--hybrid-encoder-layers", "none"]),
    ("dc_transformer", ["--dc-mode", "none"]),
])
def test_refused_where_no_attention_is_replaced(arch, options, capsys):
    err = command_line_error(arch, options + ["--attention-impl", "dense"], capsys)
    assert err.count("--attention-impl") == 1, err  # one message, not one per check
    assert "--attention-impl has no effect: the options replace no attention of fairseq's transformer" in err
    # the default is no error there
    model, _ = build_model(arch, TINY + options)
    assert not _cores(model)


def test_a_saved_model_without_replaced_attention_only_warns(caplog):
    args = parse_model_args("localness_transformer", TINY + ["--localness-encoder-layers", "none"])
    args.attention_impl = "dense"
    args._name = "localness_transformer"
    with caplog.at_level("WARNING"):
        model = ARCH_MODEL_REGISTRY["localness_transformer"].build_model(args, ToyTask())
    assert not _cores(model)
    assert any("--attention-impl has no effect" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("system", ["localness", "hysan"])
def test_dense_runs_dense_and_equals_eager(system, monkeypatch):
    """The option reaches the kernels: with dense every self-attention pass of the
    model's cores is a dense call, and the loss and gradients are eager's."""
    arch, options = MODELS[system]
    calls = []
    for name in ("dense_attention", "dense_windows"):
        original = getattr(dense, name)
        monkeypatch.setattr(dense, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    results = {}
    for impl in ("eager", "dense"):
        model, task = build_model(arch, TINY + options + ["--attention-impl", impl], seed=3)
        model.train()
        src, lens, prev, tgt = random_batch(task, [7, 4, 6], seed=5)
        calls.clear()
        out = model(src, lens, prev)[0]
        loss = torch.nn.functional.cross_entropy(out.flatten(0, 1), tgt.flatten())
        loss.backward()
        results[impl] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        assert bool(calls) == (impl == "dense"), (impl, calls)
    (loss_e, grads_e), (loss_d, grads_d) = results["eager"], results["dense"]
    torch.testing.assert_close(loss_d, loss_e, atol=1e-5, rtol=1e-5)
    assert len(grads_d) == len(grads_e)
    for gd, ge in zip(grads_d, grads_e):
        torch.testing.assert_close(gd, ge, atol=1e-5, rtol=1e-4)


def test_train_with_dense_generate_with_an_override(tmp_path):
    """Through the real CLI: fairseq-train with --attention-impl dense stores it in the
    checkpoint; fairseq-generate loads it as stored, and --model-overrides changes it
    (the hypotheses of a model's kernels agree)."""
    from fairseq import checkpoint_utils

    data = get_tiny_data()
    save_dir = str(tmp_path / "checkpoints")
    run_fairseq("fairseq-train", train_command("localness_transformer", data, save_dir,
                                               ["--attention-impl", "dense", "--localness-decoder-layers", "1"]))
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    (stored,), cfg = checkpoint_utils.load_model_ensemble([checkpoint])
    assert cfg.model.attention_impl == "dense"
    assert {core.attention_impl for core in _cores(stored)} == {"dense"}
    overrides = {"attention_impl": "eager"}
    (overridden,), _ = checkpoint_utils.load_model_ensemble([checkpoint], arg_overrides=overrides)
    assert {core.attention_impl for core in _cores(overridden)} == {"eager"}

    hypotheses = []
    for extra in ([], ["--model-overrides", repr(overrides)]):
        gen = run_fairseq("fairseq-generate", [
            data.data_bin, "--user-dir", USER_DIR, "--task", "translation", "--source-lang", data.src,
            "--target-lang", data.tgt, "--path", checkpoint, "--gen-subset", "test", "--beam", "2",
            "--batch-size", "6", "--max-len-a", "1.2", "--max-len-b", "4", *extra,
        ])
        hypotheses.append(parse_hypotheses(gen.stdout))
    assert len(hypotheses[0]) == len(data.lines("test", data.src))
    assert hypotheses[0] == hypotheses[1]
