"""scripts/reproduce/*.sh and configs/papers/*.sh: the reproduce scripts' dry runs.

For every paper table, `--dry-run` prints the commands a full run would execute
(data preparation, one train command per row, averaging or early stopping,
evaluation, significance) with the paper's settings and the paper's batch on 1, 8 and
16 GPUs, runs nothing and writes nothing, and the table it prints has the paper's
BLEU as the main column. Every train command of every script parses with fairseq's
own parser and builds its model (at a reduced width, so that the whole check takes
seconds). The settings and rows expected here are the papers' (see the comments in
the configs).
"""
import json
import os
import subprocess

import pytest

from conftest import REPO, tool_env
from reproduce_utils import REPRO, SCRIPTS, by_script, commands, dry_run, opt

# What each paper setting must give (from the papers; see the comments in the configs).
#   dataset, src, tgt, bpe, bpe size, bleu options of evaluate.sh, max updates,
#   effective tokens, average last, beam, lenpen, lr scheduler, fairseq options; the
#   main BLEU column (kind), the prepared data's name, early stopping (Xu et al.)
SETTINGS = {
    "yang2018_wmt14_base": dict(data=("wmt14_en_de", "en", "de", "subword-nmt", "32000"), kind="nist",
                                bleu=["--tok-bleu", "--compound-split"], updates=100000, tokens=32768,
                                avg=5, beam=4, lenpen="0.6", sched="inverse_sqrt",
                                opts={"--lr": "7e-4", "--dropout": "0.1", "--warmup-updates": "4000",
                                      "--adam-betas": "(0.9,0.98)", "--label-smoothing": "0.1"}),
    "yang2018_wmt14_big": dict(data=("wmt14_en_de", "en", "de", "subword-nmt", "32000"), kind="nist",
                               bleu=["--tok-bleu", "--compound-split"], updates=300000, tokens=32768,
                               avg=20, beam=4, lenpen="0.6", sched="inverse_sqrt",
                               opts={"--lr": "5e-4", "--dropout": "0.3"}),
    "yang2018_wmt17_zh_en_base": dict(data=("wmt17_zh_en", "zh", "en", "subword-nmt", "32000"), kind="nist",
                                      separate=True, bleu=[], updates=100000, tokens=32768, avg=5, beam=4,
                                      lenpen="0.6", sched="inverse_sqrt", opts={"--lr": "7e-4"}),
    "yang2018_wmt17_zh_en_big": dict(data=("wmt17_zh_en", "zh", "en", "subword-nmt", "32000"), kind="nist",
                                     separate=True, bleu=[], updates=300000, tokens=32768, avg=20, beam=4,
                                     lenpen="0.6", sched="inverse_sqrt", opts={"--dropout": "0.3"}),
    "xu2019_wmt14_base": dict(data=("wmt14_en_de", "en", "de", "subword-nmt", "32000"), kind="nist", early=True,
                              bleu=["--tok-bleu", "--compound-split"], updates=100000, tokens=25000,
                              avg=5, beam=4, lenpen="0.6", sched="inverse_sqrt",
                              opts={"--dropout": "0.1", "--attention-dropout": "0.1",
                                    "--activation-dropout": "0.1", "--adam-eps": "1e-9"}),
    "xu2019_wat17_ja_en_base": dict(data=("wat17_ja_en", "ja", "en", "subword-nmt", "32000"), kind="nist",
                                    early=True, separate=True, bleu=[], updates=100000, tokens=25000, avg=5, beam=4,
                                    lenpen="0.6", sched="inverse_sqrt", opts={}),
    "song2019_iwslt14_small": dict(data=("iwslt14_de_en", "de", "en", "sentencepiece", "32000"), kind="sacrebleu",
                                   variant="paper", bleu=["--tok-bleu"], updates=100000, tokens=4096, avg=5, beam=4,
                                   lenpen="0.6", sched="inverse_sqrt", opts={"--lr": "1e-3"}),
    "song2019_wmt14_base": dict(data=("wmt14_en_de", "en", "de", "sentencepiece", "32000"), kind="sacrebleu",
                                bleu=["--tok-bleu", "--compound-split"], updates=100000, tokens=32768,
                                avg=5, beam=4, lenpen="0.6", sched="inverse_sqrt", opts={"--lr": "7e-4"}),
    "song2019_wmt14_big": dict(data=("wmt14_en_de", "en", "de", "sentencepiece", "32000"), kind="sacrebleu",
                               bleu=["--tok-bleu", "--compound-split"], updates=300000, tokens=32768,
                               avg=20, beam=4, lenpen="0.6", sched="inverse_sqrt", opts={"--lr": "5e-4"}),
    "song2019_wmt17_zh_en_big": dict(data=("wmt17_zh_en", "zh", "en", "sentencepiece", "32000"), kind="sacrebleu",
                                     separate=True, bleu=[], updates=300000, tokens=32768, avg=20, beam=4,
                                     lenpen="0.6", sched="inverse_sqrt", opts={}),
    "dc_wmt14_base": dict(data=("wmt14_en_de", "en", "de", "subword-nmt", "32000"), kind="nist",
                          bleu=["--tok-bleu", "--compound-split"], updates=160000, tokens=4960, avg=5,
                          beam=4, lenpen="0.6", sched="cosine",
                          opts={"--lr-period-updates": "156000", "--warmup-updates": "4000",
                                "--adam-betas": "(0.9,0.98)"}),
}
DC_IWSLT = dict(bleu_vi=[], bleu=["--tok-bleu"], updates=200000, tokens=2048, avg=5, beam=6,
                lenpen="1.1", sched="cosine",
                opts={"--lr-period-updates": "196000", "--max-tokens": "2048", "--dropout": "0.3"})
DC_PAIRS = {"vi-en": ("iwslt15_en_vi", "21000"), "en-vi": ("iwslt15_en_vi", "21000"),
            "es-en": ("iwslt14_es_en", "34000"), "en-es": ("iwslt14_es_en", "34000"),
            "fr-en": ("iwslt15_fr_en", "31000"), "en-fr": ("iwslt15_fr_en", "31000"),
            "ro-en": ("iwslt14_ro_en", "32000"), "en-ro": ("iwslt14_ro_en", "32000")}
for _pair, (_dataset, _size) in DC_PAIRS.items():
    _src, _tgt = _pair.split("-")
    SETTINGS["dc_iwslt:" + _pair] = dict(
        data=(_dataset, _src, _tgt, "subword-nmt", _size),
        bleu=DC_IWSLT["bleu_vi"] if "vi" in _pair else DC_IWSLT["bleu"],
        kind="sacrebleu" if "vi" in _pair else "multi-bleu",
        **{k: v for k, v in DC_IWSLT.items() if not k.startswith("bleu")})


def data_name(setting):
    """The prepared data's directory name (fairseq-localness-prepare's prepared_name)."""
    dataset, src, tgt, bpe, size = setting["data"]
    variant = "-" + setting["variant"] if setting.get("variant") else ""
    return f"{dataset}{variant}.{src}-{tgt}.{bpe}{size}" + (".separate" if setting.get("separate") else "")

# The method's options (a row that trains the config's architecture gets them).
YANG = ["--localness-window", "query", "--localness-encoder-layers", "1-3"]
XU = ["--hybrid-variant", "gate", "--hybrid-encoder-layers", "1-2", "--hybrid-window-m", "1"]
SONG = ["--hysan-encoder-branches", "global,forward,backward,local1", "--hysan-decoder-branches",
        "forward,local1", "--hysan-encoder-layers", "all", "--hysan-decoder-layers", "all",
        "--hysan-fusion", "gated", "--hysan-gate-reduction", "16"]
DC = ["--dc-mode", "enc", "--dc-kernel-size", "2"]


def _xu(name, setting, variant, bleu, *options):
    """A row of Xu et al.'s tables that trains ``--hybrid-variant variant`` (and ``options``)."""
    return name, setting, "hybrid_transformer_wmt_en_de", XU + ["--hybrid-variant", variant, *options], bleu


# The systems of Yang et al.'s Table 4, in each language pair: (size, row suffix, architecture, options).
YANG_SYSTEMS = [
    ("base", "", "transformer_wmt_en_de", []),
    ("base", "+rel_pos", "localness_transformer_wmt_en_de",
     YANG + ["--localness-encoder-layers", "none", "--localness-rel-pos"]),
    ("base", "+localness", "localness_transformer_wmt_en_de", YANG),
    ("base", "+localness+rel_pos", "localness_transformer_wmt_en_de", YANG + ["--localness-rel-pos"]),
    ("big", "", "transformer_vaswani_wmt_en_de_big", []),
    ("big", "+localness", "localness_transformer_vaswani_wmt_en_de_big", YANG),
    ("big", "+localness+rel_pos", "localness_transformer_vaswani_wmt_en_de_big", YANG + ["--localness-rel-pos"]),
]

# The rows of each table: (name, setting, architecture, options the row must have in
# this order at the end of its train command, paper BLEU).
ROWS = {
    "yang2018_table4.sh": [
        (f"{pair}.{size}{system}", f"{setting}_{size}", arch, options, bleu)
        for pair, setting, bleus in [
            ("zh-en", "yang2018_wmt17_zh_en", ["24.13", "24.53", "24.77", "24.96", "24.56", "25.03", "25.28"]),
            ("en-de", "yang2018_wmt14", ["27.64", "27.94", "28.11", "28.54", "28.58", "28.89", "29.18"]),
        ]
        for (size, system, arch, options), bleu in zip(YANG_SYSTEMS, bleus)
    ],
    "xu2019_table1.sh": [
        ("en-de.transformer", "xu2019_wmt14_base", "transformer_wmt_en_de", [], "27.67"),
        _xu("en-de.neighbor", "xu2019_wmt14_base", "neighbor", "27.90"),
        _xu("en-de.local_h", "xu2019_wmt14_base", "local_h", "28.03"),
        _xu("en-de.local_s", "xu2019_wmt14_base", "local_s", "28.11", "--hybrid-encoder-layers", "1-3"),
        _xu("en-de.local_pattern", "xu2019_wmt14_base", "local_pattern", "28.13"),
        _xu("en-de.hybrid_concat", "xu2019_wmt14_base", "concat", "28.15"),
        _xu("en-de.hybrid_gate", "xu2019_wmt14_base", "gate", "28.31"),
    ],
    "xu2019_table2.sh": [
        ("en-de.transformer", "xu2019_wmt14_base", "transformer_wmt_en_de", [], "27.67"),
        _xu("en-de.local_pattern", "xu2019_wmt14_base", "local_pattern", "28.13"),
        _xu("en-de.hybrid_gate", "xu2019_wmt14_base", "gate", "28.31"),
        ("ja-en.transformer", "xu2019_wat17_ja_en_base", "transformer_wmt_en_de", [], "28.10"),
        _xu("ja-en.local_pattern", "xu2019_wat17_ja_en_base", "local_pattern", "28.23"),
        _xu("ja-en.hybrid_gate", "xu2019_wat17_ja_en_base", "gate", "28.66"),
    ],
    "song2019_table2.sh": [
        (f"{size}.{system}", setting, arch if system == "transformer" or size == "iwslt" else ours,
         ([] if system == "transformer" and size != "iwslt" else SONG)
         + (["--hysan-encoder-layers", "none", "--hysan-decoder-layers", "none"] if system == "transformer"
            and size == "iwslt" else [] if system == "transformer" else ["--hysan-fusion", system[6:]]),
         bleu)
        for size, setting, arch, ours, bleus in [
            ("iwslt", "song2019_iwslt14_small", "hysan_transformer_iwslt_small", "hysan_transformer_iwslt_small",
             ["31.27", "32.07", "32.13", "32.28"]),
            ("base", "song2019_wmt14_base", "transformer_wmt_en_de", "hysan_transformer_wmt_en_de",
             ["27.3", "27.4", "27.7", "27.9"]),
            ("big", "song2019_wmt14_big", "transformer_vaswani_wmt_en_de_big",
             "hysan_transformer_vaswani_wmt_en_de_big", ["28.4", "28.2", "28.7", "28.8"]),
        ]
        for system, bleu in zip(["transformer", "hysan_sum", "hysan_concat", "hysan_gated"], bleus)
    ],
    "song2019_table3.sh": [
        ("base.transformer", "song2019_wmt14_base", "transformer_wmt_en_de", [], "27.3"),
        ("base.hysan_gated", "song2019_wmt14_base", "hysan_transformer_wmt_en_de",
         SONG + ["--hysan-fusion", "gated"], "27.9"),
        ("big.transformer", "song2019_wmt14_big", "transformer_vaswani_wmt_en_de_big", [], "28.4"),
        ("big.hysan_gated", "song2019_wmt14_big", "hysan_transformer_vaswani_wmt_en_de_big",
         SONG + ["--hysan-fusion", "gated"], "28.8"),
    ],
    "song2019_table4.sh": [
        ("zh-en.big.transformer", "song2019_wmt17_zh_en_big", "transformer_vaswani_wmt_en_de_big", [], "24.20"),
        ("zh-en.big.hysan_gated", "song2019_wmt17_zh_en_big", "hysan_transformer_vaswani_wmt_en_de_big",
         SONG + ["--hysan-fusion", "gated"], "25.27"),
    ],
    "dc_table1.sh": [
        ("transformer", "dc_wmt14_base", "transformer_wmt_en_de", [], "28.37"),
        ("enc-dc", "dc_wmt14_base", "dc_transformer_wmt_en_de", DC + ["--dc-mode", "enc"], "29.26"),
        ("dec-dc", "dc_wmt14_base", "dc_transformer_wmt_en_de", DC + ["--dc-mode", "dec"], "28.86"),
        ("full-dc", "dc_wmt14_base", "dc_transformer_wmt_en_de", DC + ["--dc-mode", "full"], "29.11"),
    ],
    "dc_table2.sh": [
        (f"{pair}.{system}", f"dc_iwslt:{pair}", "dc_transformer_iwslt_small", DC + ["--dc-mode", mode], bleu)
        for pair, bleus in [
            ("vi-en", ["29.03", "29.42", "29.20", "29.70"]), ("en-vi", ["30.58", "31.28", "31.24", "31.10"]),
            ("es-en", ["39.80", "40.18", "39.96", "40.15"]), ("en-es", ["37.90", "38.59", "38.28", "38.10"]),
            ("fr-en", ["32.85", "33.35", "33.15", "33.42"]), ("en-fr", ["33.15", "33.94", "33.43", "33.60"]),
            ("ro-en", ["26.66", "27.15", "26.81", "27.14"]), ("en-ro", ["20.91", "21.20", "21.22", "21.27"]),
        ]
        for (system, mode), bleu in zip([("transformer", "none"), ("enc-dc", "enc"), ("dec-dc", "dec"),
                                         ("full-dc", "full")], bleus)
    ],
}
# Rows tested for significance against a baseline (the paper reports it), and the test.
SIGNIFICANCE_TEST = {"yang2018_table4.sh": "paired-bs", "xu2019_table2.sh": "paired-bs", "dc_table1.sh": "compare-mt"}
SIGNIFICANCE = {
    "yang2018_table4.sh": {r[0]: r[0].split("+")[0] for r in ROWS["yang2018_table4.sh"] if "+" in r[0]},
    "xu2019_table2.sh": {"en-de.hybrid_gate": "en-de.transformer", "ja-en.hybrid_gate": "ja-en.transformer"},
    "dc_table1.sh": {"enc-dc": "transformer", "dec-dc": "transformer", "full-dc": "transformer"},
}


PREPARED = os.path.join(REPO, "data", "prepared")
DOWNLOADS = os.path.join(REPO, "data", "downloads")


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """The full dry run of every script (work dirs that must stay absent)."""
    base = tmp_path_factory.mktemp("reproduce")
    before = os.listdir(os.path.join(REPO, "data"))
    runs = {}
    for script in SCRIPTS:
        work = base / script[:-3]
        runs[script] = (work, dry_run(script, work))
    assert os.listdir(os.path.join(REPO, "data")) == before
    return base, runs


def early_stop_tail(setting, tgt):
    bpe = setting["data"][3]
    detok = ["--eval-bleu-detok", "moses", "--eval-bleu-detok-args", '{"target_lang": "%s"}' % tgt] \
        if bpe == "subword-nmt" else ["--eval-bleu-detok", "space"]
    return (["--eval-bleu", "--eval-bleu-args",
             '{"beam": %d, "lenpen": %s, "max_len_a": 1, "max_len_b": 50}' % (setting["beam"], setting["lenpen"])]
            + detok + ["--eval-bleu-remove-bpe", "subword_nmt" if bpe == "subword-nmt" else "sentencepiece",
                       "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", "--patience", "10",
                       "--validate-interval-updates", "1000"])


@pytest.mark.parametrize("script", SCRIPTS)
def test_dry_run_prints_the_expected_commands(dry_runs, script):
    base, runs = dry_runs
    work, p = runs[script]
    cmds = commands(p.stdout)
    rows = ROWS[script]
    train = by_script(cmds, "train.sh")
    assert [opt(c, "--save-dir") for c in train] == [str(work / "runs" / r[0]) for r in rows], \
        "one train command per row, in the table's order"
    average, evaluate = by_script(cmds, "average.sh"), by_script(cmds, "evaluate.sh")
    assert len(evaluate) == len(rows)
    assert len(average) == sum(not SETTINGS[r[1]].get("early") for r in rows)
    average = iter(average)
    prepared = {}
    for c in by_script(cmds, "prepare_data.sh"):
        prepared[opt(c, "--out")] = c
    for (name, setting, arch, tail, _), t, e in zip(rows, train, evaluate):
        s = SETTINGS[setting]
        dataset, src, tgt, bpe, size = s["data"]
        data = os.path.join(PREPARED, data_name(s))
        run = work / "runs" / name
        # data: prepared once, with the paper's corpus, variant, direction and segmentation,
        # from the dataset's own directory of downloads
        prep = prepared[data]
        assert [opt(prep, o) for o in ("--dataset", "--src", "--tgt", "--bpe", "--bpe-size", "--bpe-joint")] == \
            [dataset, src, tgt, bpe, size, "no" if s.get("separate") else "yes"], name
        assert opt(prep, "--raw-dir") == os.path.join(DOWNLOADS, dataset)
        if s.get("variant"):
            assert opt(prep, "--variant") == s["variant"]
        else:
            assert "--variant" not in prep and "--download" not in prep
        # train
        assert opt(t, "--arch") == arch, name
        assert opt(t, "--data-bin") == os.path.join(data, "bin")
        assert [opt(t, "--src"), opt(t, "--tgt")] == [src, tgt]
        assert opt(t, "--max-update") == str(s["updates"]), name
        assert opt(t, "--effective-tokens") == str(s["tokens"]), name
        assert opt(t, "--gpus") == "1" and opt(t, "--seed") == "1" and "--cpu" not in t
        fairseq = t[t.index("--") + 1:]
        assert opt(fairseq, "--lr-scheduler") == s["sched"], name
        for o, v in s["opts"].items():
            assert opt(fairseq, o) == v, (name, o)
        assert opt(fairseq, "--keep-interval-updates") == str(s["avg"])
        assert "--max-tokens" in fairseq and "--save-interval-updates" in fairseq
        assert fairseq[-2:] == ["--log-file", str(run / "train.log")]
        early = early_stop_tail(s, tgt) if s.get("early") else []
        assert fairseq[len(fairseq) - 2 - len(tail) - len(early):-2] == tail + early, (name, fairseq)
        if arch.startswith("transformer"):  # the baselines get none of the method's options
            assert not any(w.startswith(("--localness", "--hybrid", "--hysan", "--dc-")) for w in fairseq)
        if setting.startswith("xu2019"):  # the paper's L2 penalty on the loss
            assert [opt(fairseq, "--optimizer"), opt(fairseq, "--l2-regularization")] == ["adam_l2", "1e-7"]
        # average (fixed training), or checkpoint_best.pt (early stopping)
        if s.get("early"):
            checkpoint = str(run / "checkpoint_best.pt")
        else:
            a = next(average)
            assert opt(a, "--save-dir") == str(run) and opt(a, "--last") == str(s["avg"])
            assert opt(a, "--by") == "update"
            checkpoint = str(run / f"checkpoint_avg_last{s['avg']}.pt")
            assert opt(a, "--output") == checkpoint
        # evaluate
        assert opt(e, "--checkpoint") == checkpoint
        assert opt(e, "--data-bin") == os.path.join(data, "bin")
        assert opt(e, "--ref") == os.path.join(data, "raw", f"test.{tgt}")
        assert [opt(e, "--beam"), opt(e, "--lenpen")] == [str(s["beam"]), s["lenpen"]], name
        assert opt(e, "--out") == str(run / "eval")
        bleu_opts = [w for w in e if w in ("--tok-bleu", "--compound-split")]
        assert bleu_opts == s["bleu"], name
        assert e[e.index("--") + 1:] == ["--max-len-a", "1", "--max-len-b", "50"]
    assert len(prepared) == len(by_script(cmds, "prepare_data.sh")), "each corpus is prepared once"
    assert len(prepared) == len({data_name(SETTINGS[r[1]]) for r in rows})
    # significance: the paper's test against the baseline row, where the paper reports it
    test = SIGNIFICANCE_TEST.get(script)
    sig = {opt(c, "--system").split("=")[0]: c for c in by_script(cmds, "significance.sh")}
    pbs = {opt(c, "--system").split("=")[0]: c for c in by_script(cmds, "paired_bs.py")}
    expected = SIGNIFICANCE.get(script, {})
    assert set(sig) == (set(expected) if test == "compare-mt" else set())
    assert set(pbs) == (set(expected) if test == "paired-bs" else set())
    settings = {r[0]: SETTINGS[r[1]] for r in rows}
    for name, base_row in expected.items():
        c = (sig if test == "compare-mt" else pbs)[name]
        # on the main column's BLEU: NIST BLEU, i.e. sacreBLEU's 13a on the detokenized texts
        assert settings[name]["kind"] == "nist"
        assert opt(c, "--baseline") == f"{base_row}={work / 'runs' / base_row / 'eval' / 'hyp.detok'}"
        assert opt(c, "--system") == f"{name}={work / 'runs' / name / 'eval' / 'hyp.detok'}"
        assert opt(c, "--ref").endswith("/raw/test." + settings[name]["data"][2])
        assert opt(c, "--samples") == "1000"
        if test == "compare-mt":
            assert "--tokenize" not in c and opt(c, "--out") == str(work / "runs" / name / "significance")
        else:
            assert opt(c, "--tokenize") == "13a" and opt(c, "--out") == str(work / "runs" / name / "paired_bs")
    # the table: every row with the paper's number, the paper's metric and '-' for ours
    kinds = {"nist": "NIST BLEU (mteval-v13a = sacreBLEU 13a)", "sacrebleu": "sacreBLEU",
             "multi-bleu": "multi-bleu (Moses-tok.)"}
    table = p.stdout[p.stdout.index("# table"):]
    for name, setting, _, _, bleu in rows:
        line = next(l for l in table.splitlines() if l.startswith(f"| {name} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[2:6] == [kinds[SETTINGS[setting]["kind"]], bleu, "-", "-"], cells
    # nothing was written
    assert not work.exists()
    assert not os.path.exists(os.path.join(REPO, "runs", "reproduce", script[:-3], "results.md"))


def test_dry_runs_write_nothing(dry_runs):
    base, _ = dry_runs
    assert list(base.iterdir()) == []


def batch_lines(stdout):
    """{row: (per-process max tokens, processes, update freq, effective)} from a dry run."""
    import re

    out = {}
    for line in stdout.splitlines():
        m = re.match(r"# (\S+): batch: (\d+) tokens per update over (\d+) process\(es\): .*; "
                     r"(\d+) x (\d+) x (\d+) = (\d+) tokens per update", line)
        if m:
            row, t, n, mt, n2, u, e = m.groups()
            assert n == n2 and int(mt) * int(n) * int(u) == int(e)
            out[row] = (int(t), int(mt), int(n), int(u), int(e))
    return out


def test_every_dry_run_keeps_the_papers_batch(dry_runs, tmp_path):
    """Every row of every script, on 1, 8 and 16 GPUs: per-process tokens x GPUs x
    update-freq is the paper's batch (never above it; below it by under a token per GPU
    and accumulated batch), and train.sh is asked for exactly that batch. (The 16 dry
    runs on 8 and 16 GPUs run side by side.)"""
    _, runs = dry_runs
    procs = {(script, gpus): subprocess.Popen(
        ["bash", os.path.join(REPRO, script), "--dry-run", "--work-dir", str(tmp_path / "w"), "--gpus", str(gpus)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=tool_env())
        for script in SCRIPTS for gpus in (8, 16)}
    outputs = {(script, 1): runs[script][1].stdout for script in SCRIPTS}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, (key, stderr)
        outputs[key] = stdout
    for (script, gpus), stdout in sorted(outputs.items()):
        batches = batch_lines(stdout)
        train = by_script(commands(stdout), "train.sh")
        assert set(batches) == {r[0] for r in ROWS[script]}, script
        for (name, setting, *_), t in zip(ROWS[script], train):
            tokens, per_gpu, n, u, effective = batches[name]
            cap = int(opt(t, "--max-tokens"))
            assert tokens == SETTINGS[setting]["tokens"] == int(opt(t, "--effective-tokens"))
            assert n == gpus == int(opt(t, "--gpus")) and per_gpu <= cap
            assert tokens - n * u < effective <= tokens, (script, name, batches[name])
    # the cases the issue measured: 8x and 2x the paper's batch before
    assert batch_lines(outputs[("dc_table1.sh", 8)])["enc-dc"] == (4960, 620, 8, 1, 4960)
    assert batch_lines(outputs[("yang2018_table4.sh", 16)])["en-de.base"] == (32768, 2048, 16, 1, 32768)
    assert batch_lines(outputs[("dc_table2.sh", 16)])["ro-en.enc-dc"] == (2048, 128, 16, 1, 2048)
    assert not (tmp_path / "w").exists()


def test_every_train_command_parses_and_builds(dry_runs):
    """fairseq's parser accepts every train command's options and the model builds
    (widths shrunk to 64; depth and locality options as in the paper)."""
    import torch
    from fairseq import options
    from fairseq.models import ARCH_MODEL_REGISTRY

    from model_utils import ToyTask

    def model_options(words):
        """The options that shape the model (the rest only trains it)."""
        kept, keep = [], False
        for w in words:
            if w.startswith("--"):
                keep = w.startswith(("--localness", "--hybrid", "--hysan", "--dc-", "--share"))
            if keep:
                kept.append(w)
        return tuple(kept)

    _, runs = dry_runs
    parsed, built = set(), set()
    narrow = ["--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
              "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64"]
    for script, (_, p) in runs.items():
        for t in by_script(commands(p.stdout), "train.sh"):
            arch, fairseq = opt(t, "--arch"), t[t.index("--") + 1:-2]  # without --log-file
            if (arch, tuple(fairseq)) in parsed:
                continue
            parsed.add((arch, tuple(fairseq)))
            args = options.parse_args_and_arch(
                options.get_training_parser(), ["/dev/null", "--task", "translation", "--arch", arch, *fairseq, *narrow])
            assert args.max_tokens and args.lr_scheduler in ("inverse_sqrt", "cosine")
            if "--eval-bleu" in fairseq:
                assert args.eval_bleu and args.patience == 10 and args.best_checkpoint_metric == "bleu"
                assert json.loads(args.eval_bleu_args)["beam"] == 4
            # one model per class, depth and locality options (the presets' widths and
            # heads do not change what the options are checked against)
            key = (ARCH_MODEL_REGISTRY[arch].__name__, args.encoder_layers, args.decoder_layers,
                   model_options(fairseq))
            if key in built:
                continue
            built.add(key)
            torch.manual_seed(0)
            model = ARCH_MODEL_REGISTRY[arch].build_model(args, ToyTask())
            assert sum(p.numel() for p in model.parameters()) > 0, (arch, fairseq)
    assert len(parsed) >= 40 and len(built) >= 15, (len(parsed), len(built))
