"""localness_transformer through the real command lines: train + generate for every
window strategy and size preset, the training metrics, and the per-token dump."""
import json
import os

import pytest

from conftest import USER_DIR, get_tiny_data, run_fairseq, train_and_generate


@pytest.mark.parametrize(
    "window,extra",
    [
        ("query", ["--localness-decoder-layers", "1", "--localness-enc-dec-layers", "2"]),
        ("fixed", []),
        ("layer", ["--localness-decoder-layers", "all"]),
        ("head", ["--localness-rel-pos", "--localness-rel-pos-k", "4"]),
    ],
)
def test_train_and_generate_each_window_strategy(window, extra, tmp_path):
    run = train_and_generate("localness_transformer_tiny", ["--localness-window", window, *extra], tmp_path)
    # the per-layer Gaussian statistics are training metrics
    for name in ("enc1_centre_offset", "enc1_window", "enc3_window"):
        assert name in run.train_log, f"{name} missing from the training log"
    if "--localness-decoder-layers" in extra:
        assert "dec1_self_window" in run.train_log


@pytest.mark.parametrize("preset", ["iwslt_de_en", "wmt_en_de"])
def test_train_and_generate_size_presets(preset, tmp_path):
    run = train_and_generate(f"localness_transformer_{preset}", [], tmp_path, model_args=[], max_update=1, beam=1)
    assert "enc3_window" in run.train_log


def test_big_preset_trains_through_the_cli(tmp_path):
    data = get_tiny_data()
    proc = run_fairseq("fairseq-train", [
        data.data_bin, "--user-dir", USER_DIR, "--task", "translation", "--arch",
        "localness_transformer_vaswani_wmt_en_de_big", "--optimizer", "adam", "--lr", "1e-4",
        "--max-tokens", "256", "--max-update", "1", "--no-save", "--num-workers", "0",
        "--log-format", "simple", "--log-interval", "1", "--no-progress-bar",
        "--save-dir", str(tmp_path),
    ])
    log = proc.stdout + proc.stderr
    assert "done training" in log and "enc1_window" in log


def test_dump_writes_centres_and_windows_of_real_tokens(tmp_path):
    data = get_tiny_data()
    run = train_and_generate("localness_transformer_tiny", [], tmp_path)
    out = tmp_path / "stats.jsonl"
    run_fairseq("fairseq-localness-dump", [data.data_bin, "--path", run.checkpoint, "--split", "valid",
                                           "--max-sentences", "5", "--output", out])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    modules = {r["module"] for r in rows}
    assert modules == {f"encoder.layers.{i}.self_attn.branches.0" for i in range(3)}
    assert len({r["id"] for r in rows}) == 5 and len(rows) == 15
    for r in rows:
        P, D, I = r["stats"]["P"], r["stats"]["D"], r["stats"]["I"]
        assert len(P) == 4 and len(D) == 4  # heads
        n = len(I)
        assert all(len(head) == n for head in P)
        assert all(v == n for v in I)  # real length of the sentence, no padding rows
        assert all(0 < p < n for head in P for p in head)
        assert all(1.0 <= d <= n for head in D for d in head)


def test_dump_rejects_a_missing_checkpoint(tmp_path):
    data = get_tiny_data()
    proc = run_fairseq("fairseq-localness-dump", [data.data_bin, "--path", tmp_path / "nope.pt",
                                                  "--output", tmp_path / "x.jsonl"], check=False)
    assert proc.returncode != 0
    assert "--path checkpoint" in proc.stderr and "does not exist" in proc.stderr
    assert not os.path.exists(tmp_path / "x.jsonl")
