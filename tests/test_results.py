"""fairseq-localness-results (fairseq_localness/cli/results.py): mean and standard
deviation over seeds, the paired bootstrap on seed-pooled outputs (equal to sacreBLEU's
paired bootstrap with one seed; the seed-to-seed spread enters it with several), the
demo and reproduce tables, bad inputs."""
import json
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

from conftest import tool_env
from fairseq_localness.cli import results as R
from fairseq_localness.cli import results_runs, results_stats, results_tables
from fairseq_localness.corpus import CorpusConfig, generate_corpus

REFS = [" ".join(e.tgt[:-1]) + "." for e in
        generate_corpus(CorpusConfig(train_size=1, valid_size=1, test_size=300))["test"]]


def corrupt(rate: float, seed: int, refs=REFS):
    """The references with the word before the full stop dropped from a share ``rate``
    of the sentences (drawn with ``seed``)."""
    rng = random.Random(seed)
    out = []
    for r in refs:
        w = r[:-1].split()
        out.append(" ".join(w[:-1] if rng.random() < rate and len(w) > 1 else w) + ".")
    return out


def stats(hyps, refs=REFS):
    return np.asarray(BLEU()._extract_corpus_statistics(hyps, [refs]), dtype=np.int64)


def test_summary_is_mean_and_sample_sd():
    s = results_stats.summarize([1.0, 2.0, None, 6.0])
    assert (s.mean, s.n, s.min, s.max) == (3.0, 3, 1.0, 6.0)
    assert s.sd == pytest.approx(((4 + 1 + 9) / 2) ** 0.5)
    assert results_stats.summarize([5.0]).sd is None and results_stats.summarize([None]).mean is None


def test_one_seed_is_sacrebleus_paired_bootstrap():
    """With one seed per side: the same resamples, BLEU and p-value as sacreBLEU's
    --paired-bs (PairedTest, its default seed 12345)."""
    from sacrebleu.significance import PairedTest

    base, system = corrupt(0.5, 1), corrupt(0.35, 2)
    ours = results_stats.paired_bootstrap(BLEU(), [stats(system)], [stats(base)], samples=300, seed=12345)
    test = PairedTest([("base", base), ("system", system)], {"BLEU": BLEU()}, [REFS], test_type="bs",
                      n_samples=300)
    _, theirs = test()
    base_res, sys_res = theirs["BLEU"]
    assert ours["baseline_bleu"] == pytest.approx(base_res.score)
    assert ours["bleu"] == pytest.approx(sys_res.score)
    assert ours["p_value"] == pytest.approx(sys_res.p_value)
    assert ours["delta"] > 0 and ours["p_value"] < 0.05 and ours["ci95"][0] > 0


def test_identical_systems_are_not_different():
    """(sacreBLEU's count of strictly larger differences would give p = 1 / 201 here)"""
    s = [stats(corrupt(0.3, k)) for k in (1, 2)]
    res = results_stats.paired_bootstrap(BLEU(), s, s, samples=200, resample_seeds=False)
    assert res["delta"] == 0 and res["p_value"] == 1.0
    res = results_stats.paired_bootstrap(BLEU(), s, s, samples=200)
    assert res["delta"] == 0 and res["p_value"] > 0.05
    assert results_stats.verdict(res["delta"], res["p_value"], 0.05) == "n.s."
    assert results_stats.verdict(0.0, 0.001, 0.05) == "n.s." and results_stats.verdict(-0.5, 0.001, 0.05) == "worse"


def test_the_seed_spread_enters_the_test():
    """A baseline whose seeds spread widely (20-80% of sentences damaged) against a
    system whose seeds agree (40% each): better on the pooled sentences for these
    seeds, but within the baseline's seed-to-seed spread. Resampling the sentences only
    calls it significant; resampling the seeds too does not."""
    base = [stats(corrupt(r, 10 + k)) for k, r in enumerate([0.2, 0.5, 0.8])]
    system = [stats(corrupt(0.4, 20 + k)) for k in range(3)]
    fixed = results_stats.paired_bootstrap(BLEU(), system, base, samples=500, resample_seeds=False)
    resampled = results_stats.paired_bootstrap(BLEU(), system, base, samples=500)
    assert fixed["delta"] == resampled["delta"] > 0.5
    # the observed statistic is the difference of the mean over seeds of each seed's BLEU
    mean = lambda side: np.mean([BLEU()._compute_score_from_stats(list(s.sum(0))).score for s in side])
    assert resampled["delta"] == pytest.approx(mean(system) - mean(base))
    assert fixed["p_value"] < 0.01 and resampled["p_value"] > 0.05
    assert resampled["ci95"][0] < 0 < resampled["ci95"][1]


# --------------------------------------------------------------------------- the command line
def make_run(root, system, seed, hyps, params=1000, seconds=10.0, ups=2.0, phen=None, refs=REFS):
    d = os.path.join(root, "systems", system, f"seed{seed}")
    os.makedirs(os.path.join(d, "eval"))
    with open(os.path.join(d, "eval", "hyp.detok"), "w") as f:
        f.write("\n".join(hyps) + "\n")
    score = BLEU().corpus_score(hyps, [refs])
    with open(os.path.join(d, "eval", "bleu.json"), "w") as f:  # as sacrebleu writes it: one decimal
        json.dump({"name": "BLEU", "score": round(score.score, 1), "signature": "nrefs:1|tok:13a|test"}, f)
    if phen is not None:
        with open(os.path.join(d, "eval", "phenomena.json"), "w") as f:
            json.dump({p: {"checks": 10, "accuracy": a} for p, a in phen.items()}, f)
    with open(os.path.join(d, "train.log"), "w") as f:
        f.write(f"2026 | INFO | fairseq_cli.train | num. shared model params: {params:,} (num. trained: {params:,})\n"
                f'2026 | INFO | train | {{"epoch": 1, "train_loss": "5.0", "train_ups": "{ups}", '
                f'"train_num_updates": "300"}}\n'
                f"2026 | INFO | fairseq_cli.train | done training in {seconds} seconds\n")
    return os.path.relpath(d, root)


def demo_like(root, rates, phen=True):
    """RUNS.tsv of systems -> {seed: damage rate} and their files."""
    lines = ["system\tseed\tdir\tarch"]
    for system, seeds in rates.items():
        for seed, rate in seeds.items():
            d = make_run(root, system, seed, corrupt(rate, 100 * seed + len(system)), params=1000 + len(system),
                         seconds=10.0 + seed, phen={"gender": 0.9, "reorder": 0.5 + rate / 10} if phen else None)
            lines.append(f"{system}\t{seed}\t{d}\tarch_{system}")
    path = os.path.join(root, "runs.tsv")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    ref = os.path.join(root, "ref.txt")
    with open(ref, "w") as f:
        f.write("\n".join(REFS) + "\n")
    return path, ref


def args(*argv):
    return R.get_parser().parse_args([str(a) for a in argv])


def test_demo_table_with_seeds(tmp_path, capsys):
    runs, ref = demo_like(str(tmp_path), {"transformer": {1: 0.5, 2: 0.55, 3: 0.45},
                                         "good": {1: 0.1, 2: 0.12, 3: 0.08},
                                         "same": {1: 0.5, 2: 0.55, 3: 0.45}})
    out = tmp_path / "out"
    result = R.run(args("--runs", runs, "--ref", ref, "--baseline", "transformer", "--out", out, "--samples", 300,
                        "--note", "a note"))
    table = (out / "results.md").read_text()
    assert table == capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0] == ("| system | arch | params | seeds | BLEU | reorder | gender | train time (s) | Δ BLEU | p "
                        "| vs transformer | seeds better / worse |")
    by = {e["system"]: e for e in result["systems"]}
    bleus = [BLEU().corpus_score(corrupt(r, 100 * s + 11), [REFS]).score for s, r in ((1, 0.5), (2, 0.55), (3, 0.45))]
    t = by["transformer"]["summary"]["bleu"]
    assert t["mean"] == pytest.approx(np.mean(bleus)) and t["sd"] == pytest.approx(np.std(bleus, ddof=1))
    assert t["n"] == 3 and [r["bleu"] for r in by["transformer"]["runs"]] == pytest.approx(bleus)
    row = next(l for l in lines if l.startswith("| transformer |"))
    assert f"| {t['mean']:.2f} ± {t['sd']:.2f} |" in row and row.endswith("| - | - | baseline | - |")
    assert "| 12.0 ± 1.0 |" in row  # train time of seeds 1-3: 11, 12, 13 s
    good = by["good"]["comparison"]
    assert good["pooled"]["verdict"] == "better" and good["seeds_better"] == 3 and good["seeds_tested"] == 3
    assert good["delta_mean"] == pytest.approx(good["pooled"]["delta"])
    assert next(l for l in lines if l.startswith("| good |")).endswith("| better | 3 / 0 of 3 |")
    same = by["same"]["comparison"]
    assert same["pooled"]["verdict"] == "n.s." and same["pooled"]["p_value"] > 0.05
    assert "reorder" in by["good"]["phenomena"] and by["good"]["phenomena"]["gender"]["mean"] == pytest.approx(90)
    assert "a note" in table and "BLEU: sacrebleu nrefs:1|tok:13a|test" in table
    # every seed's numbers: below the table, in results.json and results.tsv
    assert "| good | 2 | 1,004 |" in table
    saved = json.loads((out / "results.json").read_text())
    assert [r["seed"] for r in saved["systems"][1]["runs"]] == [1, 2, 3]
    assert saved["systems"][1]["runs"][0]["dir"] == "systems/good/seed1"
    assert saved["test"]["resample_seeds"] is True and saved["test"]["samples"] == 300
    tsv = (out / "results.tsv").read_text().splitlines()
    assert tsv[0].split("\t")[:5] == ["system", "seed", "arch", "params", "bleu"] and len(tsv) == 10


def test_one_seed_table_has_no_spread(tmp_path, capsys):
    runs, ref = demo_like(str(tmp_path), {"transformer": {1: 0.5}, "good": {1: 0.1}}, phen=False)
    R.run(args("--runs", runs, "--ref", ref, "--baseline", "transformer", "--samples", 200))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| system | arch | params | BLEU | train time (s) | Δ BLEU | p | vs transformer |"
    assert "±" not in "\n".join(lines) and "Per seed" not in "\n".join(lines)
    assert lines[3].startswith("| good | arch_good | 1,004 |") and lines[3].endswith("| better |")
    assert not (tmp_path / "results.md").exists()  # no --out: printed only


@pytest.mark.parametrize("change, message", [
    (lambda t: t.replace("system\tseed", "name\tseed"), "the header has no column system"),
    (lambda t: t + "good\t1\tsystems/good/seed1\tarch_good\n", "system 'good' seed 1 appears twice"),
    (lambda t: t.replace("good\t1\t", "good\tone\t"), "seed 'one': expected a whole number"),
    (lambda t: t + "bad\t1\n", "expected 4 tab-separated fields"),
])
def test_bad_manifests_fail_cleanly(tmp_path, change, message):
    runs, ref = demo_like(str(tmp_path), {"transformer": {1: 0.5}, "good": {1: 0.1}}, phen=False)
    with open(runs) as f:
        text = f.read()
    with open(runs, "w") as f:
        f.write(change(text))
    with pytest.raises(results_runs.ResultsError) as e:
        R.run(args("--runs", runs, "--ref", ref, "--out", tmp_path / "out"))
    assert message in str(e.value)
    assert not (tmp_path / "out").exists()


def test_command_line_error_is_a_message_and_status_2(tmp_path):
    runs, ref = demo_like(str(tmp_path), {"transformer": {1: 0.5}, "good": {1: 0.1}}, phen=False)
    p = subprocess.run([sys.executable, "-m", "fairseq_localness.cli.results", "--runs", runs, "--ref", ref,
                        "--baseline", "nope", "--out", str(tmp_path / "out")], capture_output=True, text=True,
                       env=tool_env())
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1] == (
        "fairseq-localness-results: error: --runs %s: system 'transformer': baseline 'nope' is not one of the systems "
        "(transformer, good)" % runs)
    assert not (tmp_path / "out").exists()


def test_inconsistent_files_fail_cleanly(tmp_path):
    runs, ref = demo_like(str(tmp_path), {"transformer": {1: 0.5}, "good": {1: 0.1}}, phen=False)
    short = tmp_path / "short.txt"
    short.write_text("one line\n")
    with pytest.raises(results_runs.ResultsError, match="has 300 lines but the reference .*short.txt has 1"):
        R.run(args("--runs", runs, "--ref", short, "--baseline", "transformer"))
    other = tmp_path / "other.txt"
    other.write_text("\n".join(corrupt(0.9, 5)) + "\n")  # the score files were not computed against it
    with pytest.raises(results_runs.ResultsError, match="reports BLEU .* but .* scores"):
        R.run(args("--runs", runs, "--ref", other, "--baseline", "transformer"))


# --------------------------------------------------------------------------- the reproduce layout
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_reproduce_metrics_are_named_as_in_the_one_seed_table():
    """The reproduce drivers' BLEU kinds (the 'metric' column they write) have the names
    the one-seed table (scripts/reproduce/results_table.py) gives them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table",
                                                  os.path.join(REPO, "scripts", "reproduce", "results_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    assert results_tables.METRIC_NAMES == table.KIND


def test_reproduce_layout(tmp_path, capsys):
    """--layout reproduce as the drivers' --seeds write it: the paper's numbers next to
    ours (mean ± sd), the extra column, '(shared emb.)', the notes of each
    configuration; the test columns only with --significance, and no test without."""
    root = str(tmp_path)
    lines = ["system\tseed\tdir\textra_score\tbaseline\tpair\tmetric\textra_metric\tpaper_bleu\tpaper_params"
             "\tshares_embeddings\tconfig\tpaper_metric\ttest\ttraining"]
    for system, rates, params, base in (("base", (0.5, 0.45), 60_000_000, ""), ("ours", (0.1, 0.15), 60_500_000, "base")):
        for seed, rate in enumerate(rates, start=1):
            d = make_run(root, system, seed, corrupt(rate, seed), params=params)
            with open(os.path.join(root, d, "eval", "tok_bleu.json"), "w") as f:
                json.dump({"score": 30.0 + seed}, f)
            lines.append(f"{system}\t{seed}\t{d}\teval/tok_bleu.json\t{base}\ten-de\tnist\ttok-compound\t27.5\t"
                         f"{'88.0M' if system == 'base' else '+0.4M'}\t1\tcfg\tcased NIST BLEU\tnewstest2014\t"
                         "100 updates")
    runs = tmp_path / "runs.tsv"
    runs.write_text("\n".join(lines) + "\n")
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(REFS) + "\n")
    result = R.run(args("--runs", runs, "--ref", ref, "--layout", "reproduce", "--significance", "--samples", 200,
                        "--title", "Table"))
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("| row | pair | metric | seeds | paper BLEU | our BLEU | delta | tok. BLEU, compound split "
                      "(extra) | paper params | our params | Δ vs. baseline | p (vs. baseline) | vs. baseline "
                      "| seeds better / worse |")
    base = next(l for l in out if l.startswith("| base |"))
    assert "| NIST BLEU (mteval-v13a = sacreBLEU 13a) | 2 of 2 | 27.5 |" in base
    assert "| 31.50 ± 0.71 | 88.0M | 60.00M (shared emb.) | - | - | baseline | - |" in base
    ours = next(l for l in out if l.startswith("| ours |"))
    assert "| +0.4M | +0.50M |" in ours and ours.endswith("| better | 2 / 0 of 2 |")
    assert ('cfg (2 rows): BLEU as the paper states it: "cased NIST BLEU"; main column: NIST BLEU (mteval-v13a = '
            'sacreBLEU 13a); extra column: tok. BLEU, compound split. Test set: newstest2014. Training: 100 updates.'
            in out)
    assert any(l.startswith("(shared emb.): our run shares one embedding matrix") for l in out)
    assert [r["extra"] for r in result["systems"][1]["runs"]] == [31.0, 32.0]
    # without --significance (the paper reports no test): no test is run or shown
    result = R.run(args("--runs", runs, "--ref", ref, "--layout", "reproduce", "--samples", 200))
    text = capsys.readouterr().out
    assert all(e["comparison"] is None for e in result["systems"])
    assert "vs. baseline" not in text and "p:" not in text and "Per seed:" in text


def test_a_failed_seed_is_marked_failed(tmp_path, capsys):
    """A run without results whose directory has FAILED (written by the table job of the
    drivers' --slurm when a job of that row and seed failed): 'failed' in the seeds
    column, the per-seed table and the notes, with the reason; the mean is over the
    seeds that have results. A row whose every seed failed shows 'failed' as its BLEU."""
    root = str(tmp_path)
    lines = ["system\tseed\tdir\tbaseline\tpair\tmetric\tpaper_bleu"]
    for system, seed in (("base", 1), ("base", 2), ("ours", 1), ("ours", 2), ("gone", 1), ("gone", 2)):
        if (system, seed) in (("ours", 2), ("gone", 1), ("gone", 2)):
            d = os.path.join("systems", system, f"seed{seed}")
            os.makedirs(os.path.join(root, d))
            with open(os.path.join(root, d, "FAILED"), "w") as f:
                f.write(f"train job 4{seed}: exit status 3: a failure\n")
        else:
            d = make_run(root, system, seed, corrupt(0.3, seed))
        lines.append(f"{system}\t{seed}\t{d}\t{'base' if system != 'base' else ''}\ten-de\tsacrebleu\t27.0")
    runs = tmp_path / "runs.tsv"
    runs.write_text("\n".join(lines) + "\n")
    ref = tmp_path / "ref.txt"
    ref.write_text("\n".join(REFS) + "\n")
    result = R.run(args("--runs", runs, "--ref", ref, "--layout", "reproduce", "--samples", 50, "--title", "T"))
    out = capsys.readouterr().out.splitlines()
    ours = next(l for l in out if l.startswith("| ours |"))
    assert re.match(r"\| ours \| en-de \| sacreBLEU \| 1 of 2, 1 failed \| 27\.0 \| \d+\.\d\d \| ", ours), ours
    gone = next(l for l in out if l.startswith("| gone |"))
    assert "| 0 of 2, 2 failed | 27.0 | failed | - |" in gone
    assert "failed: ours seed 2: train job 42: exit status 3: a failure" in out
    assert "failed: gone seed 1: train job 41: exit status 3: a failure" in out
    assert next(l for l in out if l.startswith("| ours | 2 |")).startswith("| ours | 2 | - | failed |")
    assert "| 2 of 2 | 27.0 |" in next(l for l in out if l.startswith("| base |"))
    assert [r.get("failed") for r in result["systems"][1]["runs"]] == [None, "train job 42: exit status 3: a failure"]


def test_the_launcher_runs_without_fairseq():
    """scripts/results.py (the reproduce drivers' way in) loads the tool without the
    package's __init__, so without fairseq and torch; so does the report's."""
    code = ("import runpy, sys; m = runpy.run_path(%r, run_name='launcher'); m['import_without_models']().get_parser(); "
            "m['import_without_models']('fairseq_localness.cli.report').get_parser(); "
            "print(sorted(k for k in ('fairseq', 'torch') if k in sys.modules))"
            % os.path.join(REPO, "scripts", "results.py"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=tool_env())
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"
