"""The analysis tools (fairseq_localness.analysis) on tiny checkpoints trained through
the real fairseq-train CLI: each writes its CSV/JSON and PNG, and the numbers are
checked where a value is known (a gate forced to a constant, Gaussian centres and
windows forced to I/2, FI units forced to identical distributions, masks of the
HySAN branches). The tools' parts that need no checkpoint (BLEU breakdown, several
runs per system, the probing classifier, alignment): tests/test_analysis_parts.py."""
import json
import math
import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from conftest import TinyData, assert_png, get_tiny_data, run_fairseq, train_command

from fairseq_localness.analysis.batches import batch_iterator
from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import AnalysisError
from fairseq_localness.analysis.outputs import read_csv
from fairseq_localness.analysis.plotting import pyplot
from fairseq_localness.analysis.segmentation import Segmenter, encode_lines
from fairseq_localness.analysis import (
    divergence,
    efficiency,
    gates,
    heatmaps,
    learning_curves,
    logs,
    pos_tags,
    probing,
    window_sweep,
    windows,
)

SYSTEMS = {  # name -> (arch, extra fairseq-train args)
    "hybrid": ("hybrid_transformer_tiny", ["--hybrid-encoder-layers", "all"]),
    "localness": ("localness_transformer_tiny", []),
    "hysan": ("hysan_transformer_tiny", []),
    "dc": ("dc_transformer_tiny", ["--dc-mode", "enc"]),
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one torch thread is fastest, and keeps parallel test runs apart."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Trained:
    def __init__(self, root: str, data: TinyData):
        self.root, self.data = root, data

    def checkpoint(self, name: str) -> str:
        return os.path.join(self.root, name, "checkpoint_last.pt")

    def log(self, name: str) -> str:
        return os.path.join(self.root, name, "train.log")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Trained:
    """One tiny checkpoint per model (one update each), trained two at a time."""
    data = get_tiny_data()
    root = str(tmp_path_factory.mktemp("analysis_ckpts"))

    def train(name):
        arch, extra = SYSTEMS[name]
        save_dir = os.path.join(root, name)
        proc = run_fairseq("fairseq-train", train_command(arch, data, save_dir, extra, max_update=1))
        with open(os.path.join(save_dir, "train.log"), "w") as f:
            f.write(proc.stdout + proc.stderr)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(train, name) for name in SYSTEMS]:
            future.result()
    return Trained(root, data)


def edited_checkpoint(src: str, dst: str, edit) -> str:
    """Copy a checkpoint, applying ``edit(state_dict)`` to its weights."""
    state = torch.load(src, map_location="cpu", weights_only=False)
    edit(state["model"])
    torch.save(state, dst)
    return dst


def valid_source_tokens(data: TinyData):
    """Real source tokens (with EOS) of every valid sentence, from the binarized data."""
    from fairseq.data import Dictionary, data_utils

    d = Dictionary.load(os.path.join(data.data_bin, "dict.src.txt"))
    ds = data_utils.load_indexed_dataset(os.path.join(data.data_bin, "valid.src-tgt.src"), d)
    return [ds[i] for i in range(len(ds))], d


# --------------------------------------------------------------------------- gates (Xu Fig. 3-4)
def test_gates_of_a_forced_constant_gate_per_layer_and_pos(trained, tmp_path):
    data = trained.data
    constants = [0.2, 0.5, 0.8]

    def force(model):
        for i, c in enumerate(constants):
            model[f"encoder.layers.{i}.self_attn.fusion.gate.weight"].zero_()
            model[f"encoder.layers.{i}.self_attn.fusion.gate.bias"].fill_(math.log(c / (1 - c)))

    ckpt = edited_checkpoint(trained.checkpoint("hybrid"), str(tmp_path / "forced.pt"), force)
    tags, words = str(tmp_path / "valid.pos"), str(tmp_path / "valid.words")
    tagged = pos_tags.main(pos_tags.get_parser().parse_args(
        ["--input", os.path.join(data.raw_dir, "valid.src"), "--output", tags, "--words-output", words]))
    assert all(t != "X" for sent in tagged for t in sent)  # every word of the corpus is in the lexicon
    out = tmp_path / "gates"
    summary = gates.main(gates.get_parser().parse_args(
        [data.data_bin, "--path", ckpt, "--split", "valid", "--pos-tags", tags, "--pos-words", words,
         "--output-dir", str(out), "--no-progress", "--batch-size", "5"]))
    for f in ("gates_per_layer.png", "gates_per_pos.png"):
        assert_png(out / f)
    sources, _ = valid_source_tokens(data)
    rows = read_csv(out / "gates_per_layer.csv")
    assert [r["layer"] for r in rows] == ["enc1", "enc2", "enc3"]
    for r, c in zip(rows, constants):
        assert float(r["mean"]) == pytest.approx(c, abs=1e-6)
        assert float(r["std"]) == pytest.approx(0.0, abs=1e-5)
        assert int(r["tokens"]) == sum(len(s) for s in sources)  # every real token, EOS included, no padding
    pos_rows = read_csv(out / "gates_per_pos.csv")
    n_words = sum(len(t) for t in tagged)
    assert summary["pos_skipped"] == 0 and summary["pos_sentences"] == len(sources)
    for layer, c in zip(("enc1", "enc2", "enc3"), constants):
        layer_rows = [r for r in pos_rows if r["layer"] == layer]
        assert {r["tag"] for r in layer_rows} == {"DET", "ADJ", "NOUN", "PROPN", "VERB", "ADP", "PRON", "PUNCT"} \
            & {t for sent in tagged for t in sent}
        assert sum(int(r["words"]) for r in layer_rows) == n_words
        assert all(float(r["mean"]) == pytest.approx(c, abs=1e-6) for r in layer_rows)
    assert json.load(open(out / "gates.json"))["sentences"] == len(sources)
    # Xu Fig. 4: bars from 0 (the gate's range), so their lengths compare
    fig = gates.per_pos_figure([dict(r, mean=float(r["mean"]), words=int(r["words"])) for r in pos_rows], "enc3", "t")
    assert fig.axes[0].get_ylim() == (0.0, 1.0)
    assert [round(b.get_height(), 6) for b in fig.axes[0].patches] == [0.8] * len({r["tag"] for r in pos_rows})
    pyplot().close(fig)


def test_gates_of_a_trained_model_match_the_recorded_masked_mean(trained, tmp_path):
    """Cutting to real tokens per sentence gives the same mean as the module's own
    padding mask over whole batches (``mean_gate_per_layer``)."""
    from fairseq_localness.analysis.gates import mean_gate_per_layer
    from fairseq_localness.modules.observe import AttentionRecorder

    data = trained.data
    summary = gates.main(gates.get_parser().parse_args(
        [data.data_bin, "--path", trained.checkpoint("hybrid"), "--output-dir", str(tmp_path), "--no-progress",
         "--batch-size", "3"]))
    model, cfg, task, _ = load_checkpoint(trained.checkpoint("hybrid"), data.data_bin, cpu=True)
    _, itr = batch_iterator(task, "valid", 16)
    with AttentionRecorder(model) as rec, torch.no_grad():
        for sample in itr:
            model(**sample["net_input"])
    expected = mean_gate_per_layer(rec.records)
    got = {r["module"]: r["mean"] for r in summary["per_layer"]}
    assert set(got) == set(expected) and len(got) == 3
    for name in expected:
        assert got[name] == pytest.approx(expected[name], abs=1e-6)
    assert len({round(v, 4) for v in got.values()}) == 3  # trained gates differ per layer


def test_gates_reads_hysan_branch_gates_and_refuses_a_model_without_gates(trained, tmp_path):
    data = trained.data
    gates.main(gates.get_parser().parse_args(
        [data.data_bin, "--path", trained.checkpoint("hysan"), "--output-dir", str(tmp_path), "--no-progress"]))
    rows = read_csv(tmp_path / "gates_per_layer.csv")
    series = {(r["layer"], r["series"]) for r in rows}
    assert ("enc1", "backward") in series and ("enc3", "local1") in series and ("dec2_self", "forward") in series
    assert not any(r["layer"].startswith("dec") and r["series"] == "backward" for r in rows)
    assert all(0.0 < float(r["mean"]) < 1.0 for r in rows)
    assert_png(tmp_path / "gates_per_layer.png")
    with pytest.raises(AnalysisError, match="records no gates"):
        gates.main(gates.get_parser().parse_args(
            [data.data_bin, "--path", trained.checkpoint("localness"), "--output-dir", str(tmp_path / "x"),
             "--no-progress"]))




# --------------------------------------------------------------------------- windows (Yang Fig. 2-3)
def test_windows_per_layer_and_head_with_known_centres_and_windows(trained, tmp_path):
    data = trained.data

    def half(model):  # U_p = U_d = 0  =>  P = I / 2, D = F + (I - F) / 2 with the floor F = 1 (eq. 6-9)
        for i in range(3):
            model[f"encoder.layers.{i}.self_attn.branches.0.u_p.weight"].zero_()
            model[f"encoder.layers.{i}.self_attn.branches.0.u_d.weight"].zero_()

    ckpt = edited_checkpoint(trained.checkpoint("localness"), str(tmp_path / "half.pt"), half)
    out = tmp_path / "windows"
    windows.main(windows.get_parser().parse_args(
        [data.data_bin, "--path", trained.checkpoint("localness"), "--path", ckpt, "--labels", "trained", "half",
         "--output-dir", str(out), "--no-progress", "--max-points", "50"]))
    for f in ("windows.png", "heads.png"):
        assert_png(out / f)
    sources, _ = valid_source_tokens(data)
    lengths = [len(s) for s in sources]
    rows = {(r["model"], r["layer"]): r for r in read_csv(out / "windows_per_layer.csv")}
    assert {layer for _, layer in rows} == {"enc1", "enc2", "enc3"}
    expected_window = sum(n * (n + 1) / 2 for n in lengths) / sum(lengths)  # mean of (I + 1)/2 over the tokens
    expected_rel = sum((n + 1) / 2 for n in lengths) / sum(lengths)  # mean of D / I
    for layer in ("enc1", "enc2", "enc3"):
        half_row, trained_row = rows[("half", layer)], rows[("trained", layer)]
        assert int(half_row["values"]) == 4 * sum(lengths)  # heads x real tokens
        assert float(half_row["window_rel_mean"]) == pytest.approx(expected_rel, abs=1e-6)
        assert float(half_row["centre_rel_mean"]) == pytest.approx(0.5, abs=1e-6)
        assert float(half_row["window_mean"]) == pytest.approx(expected_window, rel=1e-5)
        assert 0.0 < float(trained_row["window_rel_mean"]) < 1.0
        assert abs(float(trained_row["window_rel_mean"]) - 0.5) > 1e-4
    heads = [r for r in read_csv(out / "windows_per_head.csv") if r["model"] == "half"]
    assert len(heads) == 12 and all(float(r["window_mean"]) == pytest.approx(expected_window, rel=1e-5) for r in heads)
    points = read_csv(out / "windows_points.csv")
    assert len(points) == 2 * 3 * 50
    for p in points:
        assert 0.0 < float(p["P"]) < float(p["I"]) and 1.0 <= float(p["D"]) <= float(p["I"])
        if p["model"] == "half":
            assert float(p["D"]) == pytest.approx((float(p["I"]) + 1) / 2, rel=1e-6)  # F + (I - F) / 2


# --------------------------------------------------------------------------- divergence (DC Fig. 4)
def test_divergence_per_layer_is_zero_when_both_fi_units_attend_alike(trained, tmp_path):
    data = trained.data

    def uniform(model):  # keys = 0 in both FI units: both distributions uniform over the real keys
        for i in range(3):
            for unit in ("fi_local", "fi_global"):
                model[f"encoder.layers.{i}.self_attn.{unit}.k_proj.weight"].zero_()
                model[f"encoder.layers.{i}.self_attn.{unit}.k_proj.bias"].zero_()

    ckpt = edited_checkpoint(trained.checkpoint("dc"), str(tmp_path / "uniform.pt"), uniform)
    out = tmp_path / "div"
    summary = divergence.main(divergence.get_parser().parse_args(
        [data.data_bin, "--path", trained.checkpoint("dc"), "--path", ckpt, "--labels", "f=2", "uniform",
         "--output-dir", str(out), "--no-progress", "--batch-size", "4"]))
    assert_png(out / "divergence.png")
    rows = {(r["model"], r["layer"]): float(r["dv"]) for r in read_csv(out / "divergence.csv")}
    assert set(rows) == {(m, l) for m in ("f=2", "uniform") for l in ("enc1", "enc2", "enc3", "E_d_encoder")}
    for layer in ("enc1", "enc2", "enc3", "E_d_encoder"):
        assert rows[("uniform", layer)] == pytest.approx(0.0, abs=1e-9)
        assert 1e-6 < rows[("f=2", layer)] <= math.log(2)
    e_d = sum(rows[("f=2", l)] for l in ("enc1", "enc2", "enc3")) / 3  # eq. 13
    assert rows[("f=2", "E_d_encoder")] == pytest.approx(e_d, rel=1e-5)
    assert summary["head_reduce"] == "max"
    with pytest.raises(AnalysisError, match="dc_transformer"):
        divergence.main(divergence.get_parser().parse_args(
            [data.data_bin, "--path", trained.checkpoint("hybrid"), "--output-dir", str(tmp_path / "x"),
             "--no-progress"]))


# --------------------------------------------------------------------------- heatmaps (Song Fig. 5)
def test_heatmaps_show_each_branch_with_its_mask(trained, tmp_path):
    data = trained.data
    out = tmp_path / "heat"
    result = heatmaps.main(heatmaps.get_parser().parse_args(
        [data.data_bin, "--path", trained.checkpoint("hysan"), "--path", trained.checkpoint("hybrid"),
         "--labels", "hysan", "hybrid", "--ids", "0", "3", "--sentence", "ta somal dovan lupi Kalu.",
         "--bpe", "sentencepiece", "--sentencepiece-model", data.spm_model, "--layer", "1",
         "--output-dir", str(out), "--no-progress"]))
    names = [s["sentence"] for s in result["sentences"]]
    assert names == ["valid0", "valid3", "s1"]
    for name in names:
        assert_png(out / f"heatmaps_{name}.png")
    saved = json.load(open(out / "heatmaps.json"))
    sources, d = valid_source_tokens(data)
    assert saved["sentences"][1]["tokens"] == [d[t] for t in sources[3].tolist()]
    for sent in saved["sentences"]:
        n = len(sent["tokens"])
        hysan, hybrid = sent["models"]["hysan"], sent["models"]["hybrid"]
        assert set(hysan) == {"global", "forward", "backward", "local1"} and set(hybrid) == {"global", "local"}
        allowed = {
            "global": lambda i, j: True, "forward": lambda i, j: j <= i, "backward": lambda i, j: j >= i,
            "local1": lambda i, j: abs(i - j) <= 1, "local": lambda i, j: abs(i - j) <= 1,
        }
        for maps in (hysan, hybrid):
            for branch, m in maps.items():
                assert len(m) == n and all(len(row) == n for row in m)
                for i, row in enumerate(m):
                    assert sum(row) == pytest.approx(1.0, abs=1e-4)
                    for j, v in enumerate(row):
                        if not allowed[branch](i, j):
                            assert v == 0.0, f"{branch}[{i}][{j}] = {v} outside its mask"
    # every panel has its colorbar, from 0 to the panel's largest weight
    import torch as _torch

    maps = {label: {b: _torch.tensor(m) for b, m in saved["sentences"][0]["models"][label].items()}
            for label in ("hysan", "hybrid")}
    fig = heatmaps.sentence_figure(saved["sentences"][0]["tokens"], maps, ["hysan", "hybrid"], "t", 40)
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.images]
    assert len(panels) == 6 and len(bars) == 6
    for ax, bar in zip(panels, bars):
        lo, hi = ax.images[0].get_clim()
        assert lo == 0.0 and hi == pytest.approx(float(ax.images[0].get_array().max()))
        assert bar.get_ylim() == pytest.approx((lo, hi))
    pyplot().close(fig)
    with pytest.raises(AnalysisError, match="--layer 4"):
        heatmaps.main(heatmaps.get_parser().parse_args(
            [data.data_bin, "--path", trained.checkpoint("hysan"), "--ids", "0", "--layer", "4",
             "--output-dir", str(tmp_path / "x"), "--no-progress"]))


# --------------------------------------------------------------------------- logs (Song Fig. 4; Param./Speed)
SIMPLE_LOG = """\
2026-01-01 00:00:00 | INFO | fairseq_cli.train | num. shared model params: 1,234,567 (num. trained: 1,234,567)
2026-01-01 00:00:01 | INFO | train_inner | epoch 001:     10 / 40 loss=7.5, nll_loss=7.1, wps=1000, ups=0.5, num_updates=10, lr=0.001
2026-01-01 00:00:02 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 6.5 | nll_loss 6.2 | bleu 3.25 | num_updates 20
2026-01-01 00:00:03 | INFO | train_inner | epoch 002:     10 / 40 loss=6.5, nll_loss=6.1, wps=3000, ups=1.5, num_updates=30, lr=0.001
2026-01-01 00:00:04 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 5.5 | nll_loss 5.2 | bleu 9.5 | num_updates 40 | best_loss 5.5
2026-01-01 00:00:05 | INFO | fairseq_cli.train | done training in 123.4 seconds
"""
JSON_LOG = """\
2026-01-01 00:00:00 | INFO | fairseq_cli.train | num. shared model params: 1,000,000 (num. trained: 1,000,000)
2026-01-01 00:00:02 | INFO | valid | {"epoch": 1, "valid_loss": "6.0", "valid_bleu": "5.0", "valid_num_updates": "20"}
2026-01-01 00:00:03 | INFO | train | {"epoch": 1, "train_loss": "6.9", "train_wps": "480", "train_ups": "0.24", "train_num_updates": "20"}
"""


def test_log_parsing_learning_curves_and_efficiency(trained, tmp_path):
    (tmp_path / "a.log").write_text(SIMPLE_LOG)
    (tmp_path / "b.log").write_text(JSON_LOG)
    a, b = logs.parse_log(str(tmp_path / "a.log")), logs.parse_log(str(tmp_path / "b.log"))
    assert (a.params, a.train_seconds, a.last_update) == (1234567, 123.4, 40)
    assert [(r["num_updates"], r["bleu"], r["loss"]) for r in a.of_kind("valid")] == [(20, 3.25, 6.5), (40, 9.5, 5.5)]
    assert [r["wps"] for r in a.of_kind("train_inner")] == [1000, 3000]
    assert b.params == 1000000 and b.of_kind("valid") == [
        {"kind": "valid", "epoch": 1.0, "loss": 6.0, "bleu": 5.0, "num_updates": 20.0}]
    assert b.of_kind("train")[0]["wps"] == 480
    assert logs._parse_record("train_inner", '{"epoch": 1, "loss": "7.0", "ups": "0.25", "num_updates": "10"}') == {
        "kind": "train_inner", "epoch": 1.0, "loss": 7.0, "ups": 0.25, "num_updates": 10.0}

    out = tmp_path / "curves"
    best = learning_curves.main(learning_curves.get_parser().parse_args(
        ["--log", f"a={tmp_path / 'a.log'}", "--log", f"b={tmp_path / 'b.log'}",
         "--log", f"hysan={os.path.dirname(trained.log('hysan'))}", "--train-loss", "--output-dir", str(out)]))
    assert_png(out / "learning_curves.png")
    assert best["a"]["best_bleu"] == 9.5 and best["a"]["best_bleu_update"] == 40 and best["b"]["best_loss"] == 6.0
    assert best["hysan"]["last_update"] == 1 and "best_loss" in best["hysan"]
    rows = read_csv(out / "learning_curves.csv")
    assert ("a", "valid", "40", "bleu", "9.5") in {(r["system"], r["subset"], r["num_updates"], r["metric"], r["value"])
                                                   for r in rows}

    out = tmp_path / "eff"
    result = efficiency.main(efficiency.get_parser().parse_args(
        ["--system", f"base={tmp_path / 'b.log'}", "--system", f"a={tmp_path / 'a.log'}",
         "--system", f"hybrid={trained.log('hybrid')}", "--system", f"dc={trained.log('dc')}",
         "--output-dir", str(out)]))
    assert_png(out / "efficiency.png")
    rows = {r["system"]: r for r in result["rows"]}
    assert rows["a"]["params_delta"] == 234567 and rows["a"]["params_delta_pct"] == pytest.approx(23.4567)
    assert rows["a"]["wps"] == 2000 and rows["a"]["speed_ratio"] == pytest.approx(1.0 / 0.24)  # (0.5 + 1.5) / 2
    assert rows["base"]["ups"] == pytest.approx(0.24)  # epoch-level records when there are no train_inner ones
    # the tiny DC model has 8 d^2 + 7 d = 8,416 more parameters per layer than the hybrid one's
    # 3 gated layers (d + 1 each) over the same transformer (d = 32, 3 layers)
    assert rows["dc"]["params"] - rows["hybrid"]["params"] == 3 * (8 * 32 * 32 + 7 * 32) - 3 * 33
    assert "| hybrid |" in (out / "efficiency.md").read_text()






# --------------------------------------------------------------------------- window sweep (Xu Fig. 2)
def test_window_sweep_trains_missing_settings_and_reports_bleu_and_gates(trained, tmp_path):
    from conftest import TINY_MODEL_ARGS

    data = trained.data
    root = tmp_path / "sweep"
    os.makedirs(root / "m1")
    shutil.copy(trained.checkpoint("hybrid"), root / "m1" / "checkpoint_last.pt")  # trained with m = 1
    out = tmp_path / "out"
    args = window_sweep.parse_args(
        [data.data_bin, "--save-root", str(root), "--window-m", "0", "1", "--checkpoint", "checkpoint_last.pt",
         "--post-process", "sentencepiece", "--beam", "2", "--generate-args", "--max-len-a 1.2 --max-len-b 3",
         "--output-dir", str(out), "--no-progress", "--",
         "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "1024", "--max-update", "1", "--num-workers", "0",
         "--log-format", "simple", "--hybrid-encoder-layers", "all", *TINY_MODEL_ARGS])
    summary = window_sweep.main(args)
    assert_png(out / "sweep.png")
    rows = read_csv(out / "sweep.csv")
    assert [(r["window_m"], r["window_size"]) for r in rows] == [("0", "1"), ("1", "3")]
    assert os.path.isfile(root / "m0" / "train.log") and not os.path.exists(root / "m1" / "train.log")
    state = torch.load(root / "m0" / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["cfg"]["model"].hybrid_window_m == 0
    for r in rows:
        assert 0.0 <= float(r["bleu"]) <= 100.0
        layer_gates = [float(r[f"gate_enc{i}"]) for i in (1, 2, 3)]
        assert all(0.0 < g < 1.0 for g in layer_gates)
        assert float(r["gate_mean"]) == pytest.approx(sum(layer_gates) / 3, rel=1e-5)
        assert os.path.isfile(root / f"m{r['window_m']}" / "generate-valid.txt")
    m1_gates = gates.main(gates.get_parser().parse_args(
        [data.data_bin, "--path", str(root / "m1" / "checkpoint_last.pt"), "--output-dir", str(tmp_path / "g"),
         "--no-progress"]))
    assert float(rows[1]["gate_enc1"]) == pytest.approx(m1_gates["per_layer"][0]["mean"], rel=1e-5)
    assert summary["train_args"][0] == "--optimizer"


# --------------------------------------------------------------------------- probing (Xu Tables 3-4, DC Table 4)
def _probing_file(path, labeller, seed):
    """SentEval format; class A = adjectives of the corpus, class B = names."""
    from fairseq_localness import corpus as K

    rng = random.Random(seed)
    lines = []
    for split, k in (("tr", 160), ("va", 60), ("te", 200)):
        for _ in range(k):
            y = rng.random() < 0.5
            words = [rng.choice(K.NAMES if y else [a[0] for a in K.ADJECTIVES]) for _ in range(rng.randint(3, 8))]
            lines.append(f"{split}\t{labeller(y, rng)}\t{' '.join(words)}")
    path.write_text("\n".join(lines) + "\n")


def test_probing_on_a_frozen_encoder(trained, tmp_path):
    data = trained.data
    senteval = tmp_path / "senteval"
    senteval.mkdir()
    _probing_file(senteval / "sentence_length.txt", lambda y, rng: "B" if y else "A", 1)  # trivially learnable
    _probing_file(senteval / "bigram_shift.txt", lambda y, rng: rng.choice("IO"), 2)  # random labels
    out = tmp_path / "probe"
    summary = probing.main(probing.get_parser().parse_args(
        [data.data_bin, "--path", trained.checkpoint("hybrid"), "--senteval-dir", str(senteval),
         "--bpe", "sentencepiece", "--sentencepiece-model", data.spm_model, "--output-dir", str(out),
         "--no-progress", "--max-epochs", "40"]))
    assert_png(out / "probing.png")
    rows = {r["task"]: r for r in read_csv(out / "probing.csv")}
    assert set(rows) == {"SentLen", "BShift"}
    assert rows["SentLen"]["group"] == "surface" and rows["BShift"]["group"] == "syntactic"
    assert float(rows["SentLen"]["test_acc"]) >= 90.0
    assert abs(float(rows["BShift"]["test_acc"]) - 50.0) <= 15.0
    assert (rows["SentLen"]["train"], rows["SentLen"]["valid"], rows["SentLen"]["test"]) == ("160", "60", "200")
    groups = {r["group"]: float(r["test_acc"]) for r in read_csv(out / "probing_groups.csv")}
    assert groups == pytest.approx({"surface": float(rows["SentLen"]["test_acc"]),
                                    "syntactic": float(rows["BShift"]["test_acc"])})
    assert summary["classifier"]["hidden"] == 50

    # the sentence vector ignores padding: alone == in a batch with longer sentences
    model, cfg, task, _ = load_checkpoint(trained.checkpoint("hybrid"), data.data_bin, cpu=True)
    seg = Segmenter("sentencepiece", data.spm_model)
    sents = ["ta somal dovan lupi Kalu.", "en bakorek nuki en silebek dar en bakorek nu ta dovan ke lupi Kalu."]
    alone = probing.sentence_vectors(model, task.source_dictionary, sents[:1], seg, show_progress=False)
    batched = probing.sentence_vectors(model, task.source_dictionary, sents, seg, show_progress=False)
    assert torch.allclose(alone[0], batched[0], atol=1e-5)
    tokens, _ = encode_lines(sents[:1], task.source_dictionary, seg)
    enc = model.encoder(tokens[0][None], src_lengths=torch.tensor([tokens[0].numel()]))
    assert torch.allclose(alone[0], enc["encoder_out"][0][:, 0].mean(0), atol=1e-5)  # mean of the last layer

    bad = tmp_path / "bad.txt"
    bad.write_text("train\tA\tsome sentence\n")
    with pytest.raises(AnalysisError, match="tr\\|va\\|te"):
        probing.read_task("Bad", str(bad), "other")


