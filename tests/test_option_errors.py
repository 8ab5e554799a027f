"""Model options as a user mistypes them: every error is argparse-style (exit status
2, one line naming the option and what is allowed, no traceback, nothing created);
options a variant does not use are refused on the command line and only warned about
when a saved model is loaded; layer defaults adapt to shallow models."""
import logging
import os

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from conftest import TINY_MODEL_ARGS, get_tiny_data, run_fairseq, run_script, train_command
from fairseq_localness.models._locality import OptionError
from model_utils import TINY, ToyTask, build_model, parse_model_args, random_batch

# (arch, extra args, message)
REFUSED = {
    "infinite_window": ("localness_transformer", ["--localness-window", "fixed", "--localness-fixed-window", "inf"],
                        "--localness-fixed-window must be a finite number > 0 (got inf)"),
    "nan_window": ("hybrid_transformer", ["--hybrid-variant", "neighbor", "--hybrid-min-window", "nan"],
                   "--hybrid-min-window must be a finite number >= 0 (got nan)"),
    "floor_above_head_max": ("localness_transformer", ["--localness-window", "head", "--localness-min-window", "60"],
                             "--localness-min-window 60.0 must be below --localness-head-window-max 50.0"),
    "hybrid_floor_above_head_max": (
        "hybrid_transformer", ["--hybrid-variant", "neighbor", "--hybrid-neighbor-window", "head",
                               "--hybrid-head-window-max", "4", "--hybrid-min-window", "5"],
        "--hybrid-min-window 5.0 must be below --hybrid-head-window-max 4.0"),
    "floor_with_fixed_window": ("localness_transformer", ["--localness-window", "fixed", "--localness-min-window", "0.5"],
                                "--localness-min-window floors learned windows only"),
    "divergence_without_dc": ("dc_transformer", ["--dc-mode", "none", "--dc-log-divergence"],
                              "--dc-log-divergence has no effect with --dc-mode none"),
    "kernel_without_dc": ("dc_transformer", ["--dc-mode", "none", "--dc-kernel-size", "3"],
                          "--dc-kernel-size has no effect with --dc-mode none"),
    "reduction_without_gate": ("hysan_transformer", ["--hysan-fusion", "sum", "--hysan-gate-reduction", "8"],
                               "--hysan-gate-reduction applies to --hysan-fusion gated only (got --hysan-fusion sum)"),
    "gate_bias_without_gate": ("hysan_transformer", ["--hysan-fusion", "concat", "--hysan-gate-bias"],
                               "--hysan-gate-bias applies to --hysan-fusion gated only"),
    "branches_without_layers": ("hysan_transformer", ["--hysan-decoder-layers", "none",
                                                      "--hysan-decoder-branches", "local2"],
                                "--hysan-decoder-branches has no effect: --hysan-decoder-layers selects no layer"),
    "fixed_window_with_query": ("localness_transformer", ["--localness-fixed-window", "5"],
                                "--localness-fixed-window applies to --localness-window fixed only "
                                "(got --localness-window query)"),
    "head_max_with_layer": ("localness_transformer", ["--localness-window", "layer",
                                                      "--localness-head-window-max", "20"],
                            "--localness-head-window-max applies to --localness-window head only"),
    "rel_pos_k_without_rel_pos": ("localness_transformer", ["--localness-rel-pos-k", "8"],
                                  "--localness-rel-pos-k applies with --localness-rel-pos only"),
    "window_without_gaussian_layers": ("localness_transformer", ["--localness-encoder-layers", "none",
                                                                 "--localness-window", "head"],
                                       "--localness-window has no effect: no layer has the Gaussian bias"),
    "window_m_with_neighbor": ("hybrid_transformer", ["--hybrid-variant", "neighbor", "--hybrid-window-m", "3"],
                               "--hybrid-window-m applies to --hybrid-variant gate, concat or local_pattern only "
                               "(got --hybrid-variant neighbor)"),
    "fixed_window_with_gate": ("hybrid_transformer", ["--hybrid-fixed-window", "4"],
                               "--hybrid-fixed-window applies to --hybrid-variant local_h only"),
    "neighbor_window_with_gate": ("hybrid_transformer", ["--hybrid-neighbor-window", "head"],
                                  "--hybrid-neighbor-window applies to --hybrid-variant neighbor only"),
    "variant_without_layers": ("hybrid_transformer", ["--hybrid-encoder-layers", "none", "--hybrid-variant", "concat"],
                               "--hybrid-variant has no effect: --hybrid-encoder-layers and --hybrid-decoder-layers "
                               "select no layer"),
    "heads_do_not_divide": ("localness_transformer", ["--encoder-attention-heads", "3"],
                            "--encoder-attention-heads 3: must divide --encoder-embed-dim 32 "
                            "(allowed: 1, 2, 4, 8, 16, 32)"),
    "decoder_heads_do_not_divide": ("dc_transformer", ["--decoder-attention-heads", "5"],
                                    "--decoder-attention-heads 5: must divide --decoder-embed-dim 32"),
    "layers_on_an_empty_encoder": ("hybrid_transformer", ["--encoder-layers", "0", "--hybrid-encoder-layers", "1"],
                                   "--hybrid-encoder-layers '1': this side has no layers; the only allowed value "
                                   "is 'none'"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_on_the_command_line(case, capsys):
    arch, extra, message = REFUSED[case]
    with pytest.raises(SystemExit) as exit_info:
        parse_model_args(arch, TINY + extra)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert err.count("\n") == 1 and ": error: " in err  # one line, argparse-style


@pytest.mark.parametrize("arch,saved,message", [
    ("dc_transformer", {"dc_mode": "none", "dc_log_divergence": True}, "--dc-log-divergence has no effect"),
    ("hysan_transformer", {"hysan_fusion": "sum", "hysan_gate_reduction": 8},
     "--hysan-gate-reduction applies to --hysan-fusion gated only"),
])
def test_options_without_effect_only_warn_when_a_saved_model_is_built(arch, saved, message, caplog):
    """A checkpoint saved before these checks existed still loads: fairseq's config
    of a model carries _name, and the model is built with a warning."""
    args = parse_model_args(arch, TINY)
    for name, value in saved.items():
        setattr(args, name, value)
    args._name = arch
    with caplog.at_level(logging.WARNING):
        model = ARCH_MODEL_REGISTRY[arch].build_model(args, ToyTask())
    assert model is not None
    assert any(message in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_invalid_values_still_fail_when_a_saved_model_is_built():
    args = parse_model_args("localness_transformer", TINY)
    args.localness_fixed_window = float("inf")
    args.localness_window = "fixed"
    args._name = "localness_transformer"
    with pytest.raises(OptionError, match="--localness-fixed-window must be a finite number > 0"):
        ARCH_MODEL_REGISTRY["localness_transformer"].build_model(args, ToyTask())


def test_hybrid_default_layers_adapt_to_a_one_layer_encoder():
    model, task = build_model("hybrid_transformer", TINY + ["--encoder-layers", "1"])
    assert type(model.encoder.layers[0].self_attn).__name__ == "AttentionCore"
    src, lens, prev, _ = random_batch(task, [5, 3])
    assert model(src, lens, prev)[0].isfinite().all()
    model, _ = build_model("hybrid_transformer", TINY)  # 3 layers: the paper's lowest two
    assert [type(layer.self_attn).__name__ for layer in model.encoder.layers] == \
        ["AttentionCore", "AttentionCore", "MultiheadAttention"]


@pytest.mark.parametrize("arch", ["localness_transformer", "hybrid_transformer", "hysan_transformer",
                                  "dc_transformer"])
def test_an_empty_encoder_is_no_error_with_the_default_layers(arch, capsys):
    """--encoder-layers 0 with the defaults: no layer of that side to change, and no
    range the user never typed ('1-0') in an error."""
    model, task = build_model(arch, TINY + ["--encoder-layers", "0"])
    assert len(model.encoder.layers) == 0
    src, lens, prev, _ = random_batch(task, [4, 2])
    assert model(src, lens, prev)[0].isfinite().all()
    assert "1-0" not in capsys.readouterr().err


def test_fairseq_train_stops_before_creating_the_save_dir(tmp_path):
    data = get_tiny_data()
    save_dir = tmp_path / "ckpts"
    proc = run_fairseq("fairseq-train", train_command(
        "localness_transformer", data, str(save_dir), ["--encoder-attention-heads", "3"]), check=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("fairseq-train: error: --encoder-attention-heads 3: must divide --encoder-embed-dim 32 "
            "(allowed: 1, 2, 4, 8, 16, 32)") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not save_dir.exists()


@pytest.mark.parametrize("arch,extra,message", [
    ("localness_transformer", ["--encoder-attention-heads", "3"],
     "--encoder-attention-heads 3: must divide --encoder-embed-dim 32"),
    ("transformer", ["--decoder-attention-heads", "3"], "--decoder-attention-heads 3: must divide --decoder-embed-dim"),
    ("dc_transformer", ["--dc-mode", "none", "--dc-log-divergence"], "--dc-log-divergence has no effect"),
    ("transformer", ["--no-such-option", "1"], "unrecognized arguments: --no-such-option 1"),
])
def test_train_sh_reports_option_errors_in_one_line_before_anything_runs(arch, extra, message, tmp_path):
    data = get_tiny_data()
    save_dir = tmp_path / "ckpts"
    p = run_script("train.sh", ["--arch", arch, "--data-bin", data.data_bin, "--save-dir", save_dir,
                                "--max-update", "1", "--src", "src", "--tgt", "tgt", "--cpu", "--",
                                *TINY_MODEL_ARGS, *extra], check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    first = p.stderr.splitlines()[0]
    assert first.startswith("train.sh: error: ") and message in first, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert not any(line.startswith("+ ") for line in p.stderr.splitlines())
    assert not save_dir.exists() and os.listdir(tmp_path) == []
