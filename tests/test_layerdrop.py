"""LayerDrop pruning (Fan et al. 2019) of every model whose locality sits in some
layers only: fairseq's ``--encoder-layers-to-keep`` / ``--decoder-layers-to-keep``
(e.g. ``fairseq-generate --model-overrides``) keep a subset of the trained layers, and
each kept layer keeps the attention it was trained with and its parameters.

In process: a pruned model built and loaded the way fairseq loads a checkpoint
(``load_state_dict(..., model_cfg=args)``, which runs ``prune_state_dict``) has, at
each kept position, the module types and parameter values of the full model's layer,
and computes what the full model computes with the other layers removed. Through
the command line: a tiny model trained with LayerDrop is decoded by fairseq-generate
with a subset of its layers.
"""
import ast
import os

import pytest
import torch
from torch import nn

from conftest import USER_DIR, get_tiny_data, parse_hypotheses, run_fairseq, train_command
from model_utils import build_model, command_line_error, parse_model_args, random_batch, size_args
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.modules import MultiheadAttention

from fairseq_localness.models._locality import OptionError
from fairseq_localness.modules.observe import Observable

SIZES = size_args(layers=3, dim=16, ffn=32, heads=2) + ["--dropout", "0", "--attention-dropout", "0"]

# model -> (architecture, its options selecting some layers of each side)
MODELS = {
    "localness": ("localness_transformer_tiny", [
        "--localness-encoder-layers", "3", "--localness-decoder-layers", "1",
        "--localness-enc-dec-layers", "1"]),
    "hybrid": ("hybrid_transformer_tiny", ["--hybrid-encoder-layers", "1-2", "--hybrid-decoder-layers", "2-3"]),
    "hysan": ("hysan_transformer_tiny", ["--hysan-encoder-layers", "3", "--hysan-decoder-layers", "1,2"]),
    "dc_enc": ("dc_transformer_tiny", ["--dc-mode", "enc", "--dc-encoder-layers", "2"]),
    "dc_dec": ("dc_transformer_tiny", ["--dc-mode", "dec", "--dc-decoder-layers", "1,3"]),
    "dc_full": ("dc_transformer_tiny", ["--dc-mode", "full", "--dc-encoder-layers", "1", "--dc-decoder-layers", "3"]),
}
LAYERDROP = ["--encoder-layerdrop", "0.5", "--decoder-layerdrop", "0.5"]
# (encoder layers to keep, decoder layers to keep): each side keeps a layer that the
# model's options select and one they leave to fairseq, at other positions than trained
KEEP = ("1,2", "0,2")
SIDES = ("encoder", "decoder")


def _kept(keep: str):
    return [int(i) for i in keep.split(",")]


def _submodule_types(layer: nn.Module):
    return [(name, type(module).__name__) for name, module in layer.named_modules()]


def _has_locality(layer: nn.Module) -> bool:
    """Whether the layer's self- or encoder-decoder attention is not fairseq's own."""
    return any(type(getattr(layer, name, None)) not in (MultiheadAttention, type(None))
               for name in ("self_attn", "encoder_attn"))


def _build_pair(model: str, keep=KEEP):
    """The full model (LayerDrop on, eval mode) and the pruned one loaded from its state
    dict as fairseq loads a checkpoint with --model-overrides."""
    arch, options = MODELS[model]
    extra = SIZES + LAYERDROP + options
    full, task = build_model(arch, extra)
    args = parse_model_args(arch, extra)
    args.encoder_layers_to_keep, args.decoder_layers_to_keep = keep
    pruned = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    pruned.load_state_dict(full.state_dict(), strict=True, model_cfg=args)
    return full, pruned.eval(), task


@pytest.mark.parametrize("model", MODELS)
def test_kept_layers_keep_their_attention_and_parameters(model):
    full, pruned, _ = _build_pair(model)
    located = 0
    for side, keep in zip(SIDES, KEEP):
        full_layers, pruned_layers = getattr(full, side).layers, getattr(pruned, side).layers
        assert len(pruned_layers) == len(_kept(keep)) == getattr(pruned, side).num_layers
        for position, trained in enumerate(_kept(keep)):
            ours, theirs = pruned_layers[position], full_layers[trained]
            assert _submodule_types(ours) == _submodule_types(theirs), (side, trained)
            full_params = dict(theirs.named_parameters())
            assert [n for n, _ in ours.named_parameters()] == list(full_params)
            for name, value in ours.named_parameters():
                assert torch.equal(value, full_params[name]), (side, trained, name)
            located += _has_locality(ours)
            # the kept layer is labelled by its position in the pruned model
            labels = {m.metric_prefix for m in ours.modules() if isinstance(m, Observable)}
            assert labels <= {f"enc{position + 1}", f"dec{position + 1}_self", f"dec{position + 1}_cross"}
    # each model keeps at least one layer with its own attention and one without
    n_kept = sum(len(_kept(k)) for k in KEEP)
    assert 0 < located < n_kept, located


@pytest.mark.parametrize("model", MODELS)
def test_pruned_model_computes_the_full_model_without_the_dropped_layers(model):
    full, pruned, task = _build_pair(model)
    for side, keep in zip(SIDES, KEEP):
        module = getattr(full, side)
        module.layers = nn.ModuleList([module.layers[i] for i in _kept(keep)])
        module.num_layers = len(module.layers)
    src, lengths, prev, _ = random_batch(task, [6, 4, 5])
    with torch.no_grad():
        torch.testing.assert_close(pruned(src, lengths, prev)[0], full(src, lengths, prev)[0])


def test_the_issue_case_hybrid_all_layers_keep_one():
    """2 + 2 hybrid layers, kept: encoder layer 0, decoder layer 1 (the reported case)."""
    arch = "hybrid_transformer_tiny"
    extra = size_args(2, 16, 32, 2) + LAYERDROP + ["--hybrid-encoder-layers", "1-2", "--hybrid-decoder-layers", "1-2"]
    full, task = build_model(arch, extra)
    args = parse_model_args(arch, extra)
    args.encoder_layers_to_keep, args.decoder_layers_to_keep = 0, "1"  # an int, as a literal override gives
    pruned = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    pruned.load_state_dict(full.state_dict(), model_cfg=args)
    assert len(pruned.encoder.layers) == len(pruned.decoder.layers) == 1
    assert _submodule_types(pruned.encoder.layers[0]) == _submodule_types(full.encoder.layers[0])
    assert torch.equal(pruned.decoder.layers[0].self_attn.q_proj.weight, full.decoder.layers[1].self_attn.q_proj.weight)


@pytest.mark.parametrize("keep, message", [
    ("3", "--encoder-layers-to-keep '3': layer 3 is out of range; the model has 3 encoder layers (allowed: 0..2)"),
    ("0,x", "--encoder-layers-to-keep '0,x': cannot parse 'x'"),
    ("1,1", "--encoder-layers-to-keep '1,1': layer 1 is listed more than once"),
])
def test_bad_layers_to_keep_are_refused_naming_the_option(keep, message):
    arch, options = MODELS["hybrid"]
    args = parse_model_args(arch, SIZES + options)
    args.encoder_layers_to_keep = keep
    with pytest.raises(OptionError) as error:
        ARCH_MODEL_REGISTRY[arch].build_model(args, build_model(arch, SIZES)[1])
    assert message in str(error.value)


def test_bad_layers_to_keep_on_the_command_line_are_an_argparse_error(capsys):
    arch, options = MODELS["dc_full"]
    err = command_line_error(arch, SIZES + options + ["--decoder-layers-to-keep", "0,5"], capsys)
    assert "error: --decoder-layers-to-keep '0,5': layer 5 is out of range; the model has 3 decoder layers" in err


# through the command line: one run per model (dc_full covers both sides of the DC
# model; its enc and dec modes are the same code on one side, checked above)
@pytest.mark.parametrize("model", ["localness", "hybrid", "hysan", "dc_full"])
def test_generate_keeps_a_subset_of_the_trained_layers(model, tmp_path):
    """fairseq-train with LayerDrop, fairseq-generate with --model-overrides keeping
    some layers of each side; every test sentence is translated, and the checkpoint
    loaded the same way has the kept layers' parameters."""
    from fairseq import checkpoint_utils

    arch, options = MODELS[model]
    data = get_tiny_data()
    save_dir = str(tmp_path / "checkpoints")
    run_fairseq("fairseq-train", train_command(arch, data, save_dir, LAYERDROP + options,
                                               model_args=SIZES, max_update=2))
    checkpoint = os.path.join(save_dir, "checkpoint_last.pt")
    overrides = {"encoder_layers_to_keep": KEEP[0], "decoder_layers_to_keep": KEEP[1]}
    gen = run_fairseq("fairseq-generate", [
        data.data_bin, "--user-dir", USER_DIR, "--task", "translation", "--source-lang", data.src,
        "--target-lang", data.tgt, "--path", checkpoint, "--gen-subset", "test", "--beam", "2",
        "--batch-size", "6", "--max-len-a", "1.2", "--max-len-b", "4", "--model-overrides", repr(overrides),
    ])
    assert "Pruning model to specified layer configuration" in gen.stderr + gen.stdout
    assert len(parse_hypotheses(gen.stdout)) == len(data.lines("test", data.src))

    (full,), _ = checkpoint_utils.load_model_ensemble([checkpoint])
    (pruned,), _ = checkpoint_utils.load_model_ensemble([checkpoint], arg_overrides=ast.literal_eval(repr(overrides)))
    for side, keep in zip(SIDES, KEEP):
        assert len(getattr(pruned, side).layers) == len(_kept(keep))
        for position, trained in enumerate(_kept(keep)):
            ours, theirs = getattr(pruned, side).layers[position], getattr(full, side).layers[trained]
            assert _submodule_types(ours) == _submodule_types(theirs)
            for (name, a), (_, b) in zip(ours.named_parameters(), theirs.named_parameters()):
                assert torch.equal(a, b), (side, trained, name)
