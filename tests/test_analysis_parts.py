"""The analysis tools' parts that need no trained checkpoint (fairseq_localness.analysis):
BLEU broken down by length and n-gram against hand-computed scores, the console
script, learning curves and efficiency over several runs per system (mean and band),
the probing classifier on learnable and random-label tasks, the corpus's probing
files, subword-to-word alignment and the Jensen-Shannon divergence. The tools on
checkpoints trained through fairseq-train: tests/test_analysis.py."""
import math
import random

import pytest
import torch

from conftest import assert_png, get_tiny_data, run_fairseq

from fairseq_localness.analysis import bleu_breakdown, corpus_probes, efficiency, learning_curves, probing
from fairseq_localness.analysis.cli_args import AnalysisError
from fairseq_localness.analysis.outputs import read_csv
from fairseq_localness.analysis.segmentation import align_pieces_to_words, words_from_pieces


def test_subword_to_word_alignment():
    assert align_pieces_to_words(["\u2581Ka", "lu", "."], ["Kalu", "."]) == [0, 0, 1]
    assert align_pieces_to_words(["\u2581ta", "\u2581somal."], ["ta", "somal", "."]) == [0, 1]
    assert align_pieces_to_words(["\u2581ta", "<unk>"], ["ta", "x"]) is None
    assert words_from_pieces(["\u2581ta", "\u2581so", "mal", "."]) == [0, 1, 1, 1]
    assert words_from_pieces(["ta", "so@@", "mal", "."]) == [0, 1, 1, 2]


def test_js_divergence_of_identical_distributions_is_zero():
    from fairseq_localness.modules.dual_context import js_divergence

    p = torch.softmax(torch.randn(3, 5, 7, dtype=torch.float64), -1)
    assert torch.allclose(js_divergence(p, p), torch.zeros(3, 5, dtype=torch.float64), atol=1e-12)
    one_hot_a, one_hot_b = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert float(js_divergence(one_hot_a, one_hot_b)) == pytest.approx(math.log(2))


def _bleu_files(tmp_path):
    """Six 4-word references; 'base' = the references, 'other' = the last word of each
    sentence wrong, so p1..p4 = 3/4, 2/3, 1/2, 0 exactly. Source lengths 3, 3, 7, 7, 7, 12."""
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(200)]
    refs = [" ".join(rng.sample(vocab, 4)) for _ in range(6)]
    other = [" ".join(r.split()[:3] + [f"x{k}"]) for k, r in enumerate(refs)]
    srcs = [" ".join(["s"] * n) for n in (3, 3, 7, 7, 7, 12)]
    paths = {}
    for name, lines in (("ref", refs), ("src", srcs), ("base", refs), ("other", other)):
        paths[name] = tmp_path / f"{name}.txt"
        paths[name].write_text("\n".join(lines) + "\n")
    # the same hypotheses as fairseq-generate output, sentencepiece-segmented, out of order
    gen = []
    for i in (3, 0, 5, 1, 4, 2):
        pieces = " ".join("\u2581" + w for w in other[i].split())
        gen += [f"S-{i}\tsrc", f"H-{i}\t-0.5\t{pieces}", f"D-{i}\t-0.5\t{pieces}"]
    paths["gen"] = tmp_path / "generate.out"
    paths["gen"].write_text("\n".join(gen) + "\n")
    return paths


def test_bleu_breakdown_by_length_and_ngram_with_known_scores(tmp_path):
    f = _bleu_files(tmp_path)
    out = tmp_path / "bleu"
    summary = bleu_breakdown.main(bleu_breakdown.get_parser().parse_args(
        ["--ref", str(f["ref"]), "--src", str(f["src"]), "--hyp", f"base={f['base']}", "--hyp",
         f"other={f['other']}", "--hyp", f"gen={f['gen']}", "--remove-bpe", "sentencepiece", "--buckets", "5,10",
         "--output-dir", str(out), "--no-progress"]))
    for png in ("bleu_by_length.png", "bleu_by_ngram.png"):
        assert_png(out / png)
    length = read_csv(out / "bleu_by_length.csv")
    assert [(r["bucket"], r["sentences"]) for r in length if r["system"] == "base"] == [
        ("<5", "2"), ("5-10", "3"), (">=10", "1")]
    assert all(float(r["bleu"]) == pytest.approx(100.0) for r in length if r["system"] == "base")
    ngram = {(r["system"], int(r["n"])): r for r in read_csv(out / "bleu_by_ngram.csv")}
    p = [75.0, 200 / 3, 50.0, 0.0]
    for n in range(1, 5):
        for system in ("other", "gen"):  # the generate output, desegmented, is the same system
            r = ngram[(system, n)]
            assert float(r["precision"]) == pytest.approx(p[n - 1], abs=1e-3)
            assert float(r["precision_delta"]) == pytest.approx(p[n - 1] - 100.0, abs=1e-3)
        assert float(ngram[("base", n)]["bleu_n"]) == pytest.approx(100.0)
    for n in (1, 2, 3):  # BLEU-n = BP * geometric mean of p_1..p_n, BP = 1 (same lengths)
        geo = math.exp(sum(math.log(x / 100) for x in p[:n]) / n) * 100
        assert float(ngram[("other", n)]["bleu_n"]) == pytest.approx(geo, abs=1e-3)
        assert float(ngram[("other", n)]["bleu_n_delta"]) == pytest.approx(geo - 100, abs=1e-3)
    assert summary["baseline"] == "base" and "tok:13a" in summary["signature"]
    assert summary["overall"]["gen"]["bleu"] == pytest.approx(summary["overall"]["other"]["bleu"])


def test_analysis_console_script(tmp_path, capsys):
    from fairseq_localness.analysis.__main__ import cli_main

    assert cli_main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(t in out for t in ("gates", "probing", "divergence", "bleu_breakdown"))
    assert cli_main(["nope"]) == 2 and "unknown tool 'nope'" in capsys.readouterr().err
    f = _bleu_files(tmp_path)
    run_fairseq("fairseq-localness-analysis", ["bleu-breakdown", "--ref", f["ref"], "--src", f["src"],
                                               "--hyp", f["base"], "--hyp", f["other"], "--output-dir",
                                               tmp_path / "o", "--no-progress"])
    rows = read_csv(tmp_path / "o" / "bleu_by_ngram.csv")
    assert {r["system"] for r in rows} == {"base", "other"}  # named after the files
    with pytest.raises(SystemExit) as exit_info:  # an input error: a message and status 2, no traceback
        bleu_breakdown.cli_main(["--ref", str(f["ref"]), "--src", str(f["src"]), "--hyp", f"a={f['base']}",
                                 "--baseline", "nope", "--output-dir", str(tmp_path / "p")])
    assert exit_info.value.code == 2 and "--baseline 'nope'" in capsys.readouterr().err


def _seed_log(path, params, valid, ups):
    """A JSON-format log: validation loss per update, and training speed."""
    lines = [f"2026 | INFO | fairseq_cli.train | num. shared model params: {params:,} (num. trained: {params:,})"]
    for u, v in valid:
        lines.append(f'2026 | INFO | valid | {{"epoch": 1, "valid_loss": "{v}", "valid_num_updates": "{u}"}}')
    for x in ups:
        lines.append(f'2026 | INFO | train_inner | {{"epoch": 1, "loss": "5", "ups": "{x}", "wps": "{100 * x}", '
                     f'"num_updates": "10"}}')
    lines.append("2026 | INFO | fairseq_cli.train | done training in 10.0 seconds")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_several_runs_per_system_give_mean_and_band(tmp_path):
    """learning_curves and efficiency: the same NAME several times is one system's runs
    (its seeds): the mean over them with the standard deviation as band / error bar."""
    a1 = _seed_log(tmp_path / "a1.log", 1000, [(10, 6.0), (20, 5.0)], [1.0, 3.0])  # ups mean 2
    a2 = _seed_log(tmp_path / "a2.log", 1000, [(10, 4.0), (20, 3.0)], [4.0])  # ups 4
    b1 = _seed_log(tmp_path / "b1.log", 1500, [(5, 7.0), (15, 5.0), (25, 3.0)], [1.0])
    b2 = _seed_log(tmp_path / "b2.log", 1500, [(10, 6.0), (20, 4.0)], [1.0])
    out = tmp_path / "curves"
    best = learning_curves.main(learning_curves.get_parser().parse_args(
        ["--log", f"a={a1}", "--log", f"b={b1}", "--log", f"a={a2}", "--log", f"b={b2}", "--output-dir", str(out)]))
    assert_png(out / "learning_curves.png")
    assert best["a"]["runs"] == 2 and best["a"]["best_loss"] == 4.0 and best["a"]["best_loss_sd"] == pytest.approx(
        math.sqrt(2.0))  # best losses 5 and 3
    assert [r["best_loss_update"] for r in best["a"]["per_run"]] == [20, 20]
    means = {(r["system"], int(r["num_updates"])): r for r in read_csv(out / "learning_curves_mean.csv")}
    assert float(means[("a", 10)]["mean"]) == 5.0
    assert float(means[("a", 10)]["sd"]) == pytest.approx(math.sqrt(2), rel=1e-5)  # CSV: 6 digits
    # b's runs validated at different updates: interpolated onto the updates in their common range
    assert sorted(u for s, u in means if s == "b") == [10, 15, 20]
    assert float(means[("b", 15)]["mean"]) == pytest.approx((5.0 + 5.0) / 2)  # b2 at 15: between 6 and 4
    assert float(means[("b", 10)]["mean"]) == pytest.approx((6.0 + 6.0) / 2)  # b1 at 10: between 7 and 5
    rows = read_csv(out / "learning_curves.csv")
    assert {(r["system"], r["run"]) for r in rows} == {("a", "1"), ("a", "2"), ("b", "1"), ("b", "2")}
    assert learning_curves.mean_band([[(1, 2.0)]]) == [(1, 2.0, 0.0, 1)]

    out = tmp_path / "eff"
    result = efficiency.main(efficiency.get_parser().parse_args(
        ["--system", f"a={a1}", "--system", f"a={a2}", "--system", f"b={b1}", "--system", f"b={b2}",
         "--output-dir", str(out)]))
    assert_png(out / "efficiency.png")
    rows = {r["system"]: r for r in result["rows"]}
    assert rows["a"]["runs"] == 2 and rows["a"]["ups"] == 3.0 and rows["a"]["ups_sd"] == pytest.approx(math.sqrt(2))
    assert rows["b"]["speed_ratio"] == pytest.approx(1 / 3) and rows["b"]["speed_ratio_sd"] == 0.0
    assert rows["b"]["params_delta"] == 500
    assert "| a | 2 | 1,000 |" in (out / "efficiency.md").read_text()
    assert "3.000 ± 1.414" in (out / "efficiency.md").read_text()
    assert len(read_csv(out / "efficiency_runs.csv")) == 4
    with pytest.raises(AnalysisError, match="different parameter counts"):
        efficiency.main(efficiency.get_parser().parse_args(
            ["--system", f"a={a1}", "--system", f"a={b1}", "--output-dir", str(tmp_path / "x")]))
    with pytest.raises(AnalysisError, match="is given twice"):
        efficiency.main(efficiency.get_parser().parse_args(
            ["--system", f"a={a1}", "--system", f"a={a1}", "--output-dir", str(tmp_path / "x")]))


def test_probe_classifier_learns_a_separable_task_and_not_random_labels():
    g = torch.Generator().manual_seed(0)
    n, dim = {"tr": 600, "va": 200, "te": 400}, 16
    centres = torch.randn(3, dim, generator=g) * 3
    xs, ys, rand = {}, {}, {}
    for s, k in n.items():
        ys[s] = torch.randint(0, 3, (k,), generator=g)
        xs[s] = centres[ys[s]] + torch.randn(k, dim, generator=g)
        rand[s] = torch.randint(0, 2, (k,), generator=g)
    cfg = probing.ProbeConfig(max_epochs=50)
    good = probing.train_probe(xs["tr"], ys["tr"], xs["va"], ys["va"], xs["te"], ys["te"], cfg)
    assert good["test_acc"] > 95.0 and good["valid_acc"] > 95.0
    chance = probing.train_probe(xs["tr"], rand["tr"], xs["va"], rand["va"], xs["te"], rand["te"], cfg)
    assert abs(chance["test_acc"] - 50.0) < 10.0
    assert chance["epochs"] < cfg.max_epochs  # early stopping ended it
    assert 1 <= chance["best_epoch"] <= chance["epochs"]


def test_corpus_probes_are_senteval_files_labelled_from_the_grammar(tmp_path):
    from fairseq_localness.analysis.pos_tags import lexicon, tag_sentence
    from fairseq_localness.corpus import read_corpus, tokenize

    data = get_tiny_data()
    corpus_probes.main(corpus_probes.get_parser().parse_args(
        ["--corpus-dir", data.raw_dir, "--output-dir", str(tmp_path)]))
    corpus = read_corpus(data.raw_dir)
    originals = [r for split in ("train", "valid", "test") for r in corpus[split]]
    table = lexicon("src")
    for name in ("sentence_length", "word_content", "bigram_shift", "subj_number", "obj_number", "odd_man_out"):
        task = probing.read_task(name, str(tmp_path / f"{name}.txt"), "x")  # SentEval's format
        assert all(task.sentences[s] for s in probing.SPLITS)
    lines = [line.split("\t") for line in (tmp_path / "subj_number.txt").read_text().splitlines()]
    assert [split for split, _, _ in lines] == ["tr"] * 200 + ["va"] * 16 + ["te"] * 12
    assert [label for _, label, _ in lines] == ["NNS" if r["subject_number"] == "pl" else "NN" for r in originals]
    shifted = [line.split("\t") for line in (tmp_path / "bigram_shift.txt").read_text().splitlines()]
    assert {label for _, label, _ in shifted} == {"I", "O"}
    for (_, label, text), rec in zip(shifted, originals):
        words = tokenize(text)
        diff = [i for i, (a, b) in enumerate(zip(words, rec["src"])) if a != b]
        if label == "O":
            assert words == rec["src"]
        else:  # two adjacent words swapped, the full stop untouched (or a swap of two equal words)
            assert diff == [] or (len(diff) == 2 and diff[1] == diff[0] + 1 and words[-1] == "."
                                  and words[diff[0]] == rec["src"][diff[1]])
    lengths = [line.split("\t")[1] for line in (tmp_path / "sentence_length.txt").read_text().splitlines()]
    assert lengths[0] == corpus_probes._length_label(len(originals[0]["src"]))
    obj = corpus_probes.main_object_number
    words = "ta dovan ke lupi en bakorek zemu Kalu .".split()
    assert obj(words, tag_sentence(words, table)) == "NN"
    words = "Kalu lupi ta somal bakorek nu ta dovan .".split()
    assert obj(words, tag_sentence(words, table)) == "NNS"
