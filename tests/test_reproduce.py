"""scripts/reproduce/*.sh and configs/papers/*.sh: the reproduce scripts' dry runs.

For every paper table, `--dry-run` prints the commands a full run would execute
(data preparation, one train command per row, averaging or early stopping,
evaluation, significance) with the paper's settings and the paper's batch on 1, 8 and
16 GPUs, runs nothing and writes nothing; `--only` selects rows; bad rows, options and
configurations stop with exit status 2 before any command; and the results table puts
our numbers next to the paper's once result files exist, the paper's BLEU as the main
column. With --seeds, every row is trained once per seed in its own run directory, and
the table (fairseq-localness-results) shows the mean ± sd over the seeds and the paired
test on the pooled seeds; runs against stand-ins for the pipeline steps check it end
to end. Every train command of every script parses with fairseq's own parser and
builds its model (at a reduced width, so that the whole check takes seconds).
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, fairseq_import_stub, tool_env

REPRO = os.path.join(REPO, "scripts", "reproduce")
SCRIPTS = ["yang2018_table4.sh", "xu2019_table1.sh", "xu2019_table2.sh", "song2019_table2.sh",
           "song2019_table3.sh", "song2019_table4.sh", "dc_table1.sh", "dc_table2.sh"]

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

# The rows of each table: (name, setting, architecture, options the row must have in
# this order at the end of its train command, paper BLEU).
ROWS = {
    "yang2018_table4.sh": [
        ("zh-en.base", "yang2018_wmt17_zh_en_base", "transformer_wmt_en_de", [], "24.13"),
        ("zh-en.base+rel_pos", "yang2018_wmt17_zh_en_base", "localness_transformer_wmt_en_de",
         YANG + ["--localness-encoder-layers", "none", "--localness-rel-pos"], "24.53"),
        ("zh-en.base+localness", "yang2018_wmt17_zh_en_base", "localness_transformer_wmt_en_de", YANG, "24.77"),
        ("zh-en.base+localness+rel_pos", "yang2018_wmt17_zh_en_base", "localness_transformer_wmt_en_de",
         YANG + ["--localness-rel-pos"], "24.96"),
        ("zh-en.big", "yang2018_wmt17_zh_en_big", "transformer_vaswani_wmt_en_de_big", [], "24.56"),
        ("zh-en.big+localness", "yang2018_wmt17_zh_en_big", "localness_transformer_vaswani_wmt_en_de_big",
         YANG, "25.03"),
        ("zh-en.big+localness+rel_pos", "yang2018_wmt17_zh_en_big",
         "localness_transformer_vaswani_wmt_en_de_big", YANG + ["--localness-rel-pos"], "25.28"),
        ("en-de.base", "yang2018_wmt14_base", "transformer_wmt_en_de", [], "27.64"),
        ("en-de.base+rel_pos", "yang2018_wmt14_base", "localness_transformer_wmt_en_de",
         YANG + ["--localness-encoder-layers", "none", "--localness-rel-pos"], "27.94"),
        ("en-de.base+localness", "yang2018_wmt14_base", "localness_transformer_wmt_en_de", YANG, "28.11"),
        ("en-de.base+localness+rel_pos", "yang2018_wmt14_base", "localness_transformer_wmt_en_de",
         YANG + ["--localness-rel-pos"], "28.54"),
        ("en-de.big", "yang2018_wmt14_big", "transformer_vaswani_wmt_en_de_big", [], "28.58"),
        ("en-de.big+localness", "yang2018_wmt14_big", "localness_transformer_vaswani_wmt_en_de_big",
         YANG, "28.89"),
        ("en-de.big+localness+rel_pos", "yang2018_wmt14_big", "localness_transformer_vaswani_wmt_en_de_big",
         YANG + ["--localness-rel-pos"], "29.18"),
    ],
    "xu2019_table1.sh": [
        ("en-de.transformer", "xu2019_wmt14_base", "transformer_wmt_en_de", [], "27.67"),
        ("en-de.neighbor", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "neighbor"], "27.90"),
        ("en-de.local_h", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "local_h"], "28.03"),
        ("en-de.local_s", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "local_s", "--hybrid-encoder-layers", "1-3"], "28.11"),
        ("en-de.local_pattern", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "local_pattern"], "28.13"),
        ("en-de.hybrid_concat", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "concat"], "28.15"),
        ("en-de.hybrid_gate", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "gate"], "28.31"),
    ],
    "xu2019_table2.sh": [
        ("en-de.transformer", "xu2019_wmt14_base", "transformer_wmt_en_de", [], "27.67"),
        ("en-de.local_pattern", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "local_pattern"], "28.13"),
        ("en-de.hybrid_gate", "xu2019_wmt14_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "gate"], "28.31"),
        ("ja-en.transformer", "xu2019_wat17_ja_en_base", "transformer_wmt_en_de", [], "28.10"),
        ("ja-en.local_pattern", "xu2019_wat17_ja_en_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "local_pattern"], "28.23"),
        ("ja-en.hybrid_gate", "xu2019_wat17_ja_en_base", "hybrid_transformer_wmt_en_de",
         XU + ["--hybrid-variant", "gate"], "28.66"),
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


def reproduce(script, *args, env=None, cwd=None):
    cmd = ["bash", os.path.join(REPRO, script)] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, env=tool_env(env), cwd=cwd, timeout=120)


def commands(stdout):
    """The dry run's commands (non-comment lines before the table), split like a shell."""
    out = []
    for line in stdout.splitlines():
        if line.startswith("# table"):
            break
        if line and not line.startswith("#"):
            out.append(shlex.split(line))
    return out


def by_script(cmds, name):
    return [c for c in cmds if (c[0] == "bash" and c[1].endswith("/" + name)) or (len(c) > 1 and c[1].endswith("/" + name))]


def opt(cmd, name):
    """The value of the last occurrence of option `name` in `cmd`."""
    idx = [i for i, w in enumerate(cmd) if w == name]
    assert idx, f"{name} missing from {shlex.join(cmd)}"
    return cmd[idx[-1] + 1]


def dry_run(script, work, *args):
    p = reproduce(script, "--dry-run", "--work-dir", work, *args)
    assert p.returncode == 0, p.stderr
    return p


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


def test_only_selects_rows_and_passes_the_hardware_options(tmp_path):
    work = tmp_path / "w"
    p = dry_run("dc_table2.sh", work, "--only", "en-ro.enc-dc vi-en.transformer", "--gpus", "4",
                "--max-tokens", "512", "--seed", "3", "--precision", "bf16", "--raw-dir", tmp_path / "dl",
                "--data-dir", tmp_path / "prep", "--download")
    cmds = commands(p.stdout)
    train = by_script(cmds, "train.sh")
    # in the table's order, not the order given
    assert [os.path.basename(opt(c, "--save-dir")) for c in train] == ["vi-en.transformer", "en-ro.enc-dc"]
    for c in train:
        assert [opt(c, "--gpus"), opt(c, "--seed"), opt(c, "--precision")] == ["4", "3", "bf16"]
        assert opt(c, "--max-tokens") == "512"  # the last --max-tokens wins: the cap per GPU
    assert "# vi-en.transformer: batch: 2048 tokens per update over 4 process(es): --update-freq 1 = " \
           "ceil(2048 / (512 max tokens x 4))" in p.stdout
    prep = by_script(cmds, "prepare_data.sh")
    assert [opt(c, "--dataset") for c in prep] == ["iwslt15_en_vi", "iwslt14_ro_en"]
    # each dataset has its own directory of downloads under --raw-dir; --download is passed on
    assert [opt(c, "--raw-dir") for c in prep] == [str(tmp_path / "dl" / "iwslt15_en_vi"),
                                                  str(tmp_path / "dl" / "iwslt14_ro_en")]
    assert all("--download" in c and opt(c, "--out").startswith(str(tmp_path / "prep")) for c in prep)
    # the WIT3 releases need a manual step: the dry run says so
    assert "# iwslt15_en_vi: raw files in %s; manual step (--download cannot fetch): en-vi.tgz" \
        % (tmp_path / "dl" / "iwslt15_en_vi") in p.stdout
    assert len(by_script(cmds, "evaluate.sh")) == 2
    # --cpu: train and translate on the CPU
    cmds = commands(dry_run("dc_table1.sh", work, "--only", "enc-dc", "--cpu").stdout)
    (t,), (e,) = by_script(cmds, "train.sh"), by_script(cmds, "evaluate.sh")
    assert "--cpu" in t and "--gpus" not in t
    assert e[-1] == "--cpu"
    # a significance test needs its baseline: not run when the baseline is neither
    # selected nor translated
    p = dry_run("dc_table1.sh", work, "--only", "enc-dc")
    assert by_script(commands(p.stdout), "significance.sh") == []
    assert "no significance test" in p.stdout
    assert not work.exists()


def test_each_dataset_has_its_own_download_directory(tmp_path):
    """Yang et al.'s table needs WMT14 and WMT17, which both ship a dev.tgz: each gets
    its own directory under the raw root, or the one given for it."""
    p = dry_run("yang2018_table4.sh", tmp_path / "w", "--raw-dir", tmp_path / "raw",
                "--raw-dir", f"wmt17_zh_en={tmp_path / 'zh'}")
    raw = {opt(c, "--dataset"): opt(c, "--raw-dir") for c in by_script(commands(p.stdout), "prepare_data.sh")}
    assert raw == {"wmt17_zh_en": str(tmp_path / "zh"), "wmt14_en_de": str(tmp_path / "raw" / "wmt14_en_de")}
    assert "# wmt17_zh_en: raw files in %s; manual step (--download cannot fetch): cwmt.tgz" % (tmp_path / "zh") \
        in p.stdout


def test_choices_where_the_paper_is_silent_are_selectable(tmp_path):
    work = tmp_path / "w"
    # IWSLT14 De-En: fairseq's split and lowercasing instead of the paper's test set
    p = dry_run("song2019_table2.sh", work, "--only", "iwslt.hysan_gated", "--variant", "fairseq")
    (prep,) = by_script(commands(p.stdout), "prepare_data.sh")
    assert opt(prep, "--variant") == "fairseq" and opt(prep, "--out").endswith(
        "/iwslt14_de_en-fairseq.de-en.sentencepiece32000")
    assert "Test set: iwslt14_de_en (fairseq): dev2010 + TEDX.dev2012 + tst2010 + tst2011 + tst2012" in p.stdout
    p = dry_run("song2019_table2.sh", work, "--only", "iwslt.hysan_gated")
    assert "Test set: iwslt14_de_en (paper): dev2010 + tst2010 + tst2011 + tst2012 (Song et al. 2019), cased" \
        in p.stdout
    # Xu et al.'s early stopping, or fixed steps and averaging as the alternative
    p = dry_run("xu2019_table1.sh", work, "--only", "en-de.hybrid_gate", "--training", "fixed")
    cmds = commands(p.stdout)
    (t,), (a,), (e,) = by_script(cmds, "train.sh"), by_script(cmds, "average.sh"), by_script(cmds, "evaluate.sh")
    assert "--eval-bleu" not in t and opt(e, "--checkpoint") == opt(a, "--output")
    assert "Training: 100000 updates, average of the last 5 checkpoints (an alternative to the paper's)" in p.stdout
    p = dry_run("xu2019_table1.sh", work, "--only", "en-de.hybrid_gate", "--patience", "5")
    assert opt(by_script(commands(p.stdout), "train.sh")[0], "--patience") == "5"
    assert "early stopping on dev BLEU (patience 5 validations, one every 1000 updates; at most 100000 " \
           "updates), checkpoint_best.pt (the paper's)" in p.stdout
    # the BLEU of the main column; the significance tests
    p = dry_run("dc_table1.sh", work, "--bleu", "tok-compound", "--significance", "both", "--only",
                "transformer enc-dc")
    cmds = commands(p.stdout)
    (s,), (b,) = by_script(cmds, "significance.sh"), by_script(cmds, "paired_bs.py")
    for c in (s, b):  # on the tokenized texts of the main column's BLEU
        assert opt(c, "--ref").endswith("/runs/enc-dc/eval/ref.tok_bleu") and opt(c, "--tokenize") == "none"
    assert "| enc-dc | en-de | tok. BLEU, compound split | 29.26 | - | - | 73.86M |" in p.stdout
    assert "p (paired bootstrap) | p (compare-mt) |" in p.stdout
    p = dry_run("dc_table1.sh", work, "--significance", "none")
    assert by_script(commands(p.stdout), "significance.sh") == [] and "p (compare-mt)" not in p.stdout
    assert not work.exists()


@pytest.mark.parametrize("args, message", [
    (["--only", "en-de.base nope"], "--only: no row 'nope'"),
    (["--gpus", "0"], "--gpus: expected a whole number >= 1"),
    (["--precision", "fp8"], "--precision: expected one of: auto fp32 fp16 bf16"),
    (["--cpu", "--gpus", "2"], "--cpu and --gpus 2"),
    (["--frobnicate"], "unknown option '--frobnicate'"),
    (["--dry-run", "--table"], "--dry-run and --table"),
    (["--raw-dir", "wmt15_en_de=/x"], "--raw-dir DATASET=DIR: dataset: expected one of: iwslt14_de_en"),
    (["--bleu", "chrf"], "--bleu: expected one of: nist sacrebleu multi-bleu tok-compound"),
    (["--training", "longer"], "--training: expected one of: paper fixed early-stop"),
    (["--significance", "t-test"], "--significance: expected one of: paper paired-bs compare-mt both none"),
    (["--variant", "fairseq"], "--variant: no dataset of Yang et al. (2018), Table 4 has a variant 'fairseq'"),
    (["--gpus", "40000"], "the paper's batch: a batch of 32768 tokens per update cannot be split over 40000 processes"),
])
def test_bad_options_fail_before_any_command(tmp_path, args, message):
    p = reproduce("yang2018_table4.sh", "--dry-run", "--work-dir", tmp_path / "w", *args)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert commands(p.stdout) == []
    assert not (tmp_path / "w").exists()
    if args[0] == "--only":
        assert "en-de.base+localness" in p.stderr  # the names that exist


def _table_script(tmp_path, rows, significance="none"):
    script = tmp_path / "table.sh"
    script.write_text(
        "set -euo pipefail\nTABLE_TITLE='Test table'\nTABLE_SIGNIFICANCE=%s\nTABLE_ROWS=(\n%s\n)\n"
        ". %s\nreproduce_main \"$@\"\n"
        % (significance, "\n".join(shlex.quote(r) for r in rows), shlex.quote(os.path.join(REPRO, "common.sh"))))
    return script


def _run_table(script, *args, env=None):
    return subprocess.run(["bash", str(script), *map(str, args)], capture_output=True, text=True,
                          env=tool_env(env), timeout=60)


GOOD = "a|dc_wmt14_base|--arch transformer_wmt_en_de|28.37|||"


@pytest.mark.parametrize("row, message", [
    ("b|nope|--dc-mode enc|29.0|||", "no configuration 'nope'"),
    ("b|dc_iwslt|--dc-mode enc|29.0|||", "has several directions; name one as 'dc_iwslt:<src>-<tgt>'"),
    ("b|dc_iwslt:de-en|--dc-mode enc|29.0|||", "configuration dc_iwslt has no direction 'de-en'"),
    ("b|dc_wmt14_base|--dc-mode enc|high|||", "row 'b': paper BLEU: expected a number"),
    ("b|dc_wmt14_base|--dc-mode enc|29.0|c||", "baseline 'c' is not an earlier row"),
    ("a|dc_wmt14_base|--dc-mode enc|29.0|||", "row name 'a' appears twice"),
    ("b c|dc_wmt14_base||29.0|||", "name 'b c'"),
    ("b|dc_wmt14_base|--max-update 5|29.0|||", "'--max-update' is set by the reproduce driver"),
    ("b|dc_wmt14_base|--patience 5|29.0|||", "'--patience' is set by the reproduce driver"),
    ("b|dc_wmt14_base|--dc-mode enc|29.0||||x", "expected 7 fields"),
])
def test_bad_rows_fail_cleanly(tmp_path, row, message):
    p = _run_table(_table_script(tmp_path, [GOOD, row]), "--dry-run", "--work-dir", tmp_path / "w")
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert commands(p.stdout) == [] and not (tmp_path / "w").exists()


@pytest.mark.parametrize("change, message", [
    ("BEAM=0", "BEAM: expected a whole number >= 1"),
    ("unset ARCH", "ARCH is not set"),
    ("unset PAPER_BLEU", "PAPER_BLEU is not set"),
    ("BPE=wordpiece", "BPE: expected one of: subword-nmt sentencepiece"),
    ("BPE_JOINT=maybe", "BPE_JOINT: expected one of: yes no"),
    ("TRAINING=forever", "TRAINING: expected one of: fixed early-stop"),
    ("PAIRS=('wmt15_en_de|en|de|32000|nist')", "dataset: expected one of: iwslt14_de_en"),
    ("PAIRS=('wmt14_en_de|en|de|32000|chrf')", "bleu kind: expected one of: nist sacrebleu multi-bleu tok-compound"),
    ("PAIRS=('wmt14_en_de|en|de|32000|nist+ter')", "extra bleu kind: expected one of: nist"),
    ("TRAIN_ARGS+=(--update-freq 8)", "TRAIN_ARGS: '--update-freq' is set by the reproduce driver"),
    ("TRAIN_ARGS=(--max-tokens 4096)", "TRAIN_ARGS has no --save-interval-updates"),
    ("AVERAGE_LAST=20", "--keep-interval-updates in TRAIN_ARGS: expected a whole number >= 20"),
])
def test_bad_configurations_fail_cleanly(tmp_path, change, message):
    configs = tmp_path / "configs"
    shutil.copytree(os.path.join(REPO, "configs", "papers", "base"), configs / "base")  # (what it sources)
    good = open(os.path.join(REPO, "configs", "papers", "dc_wmt14_base.sh")).read()
    (configs / "dc_wmt14_base.sh").write_text(good + "\n" + change + "\n")
    p = _run_table(_table_script(tmp_path, [GOOD]), "--dry-run", "--work-dir", tmp_path / "w",
                   env={"REPRODUCE_CONFIG_DIR": str(configs)})
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and "dc_wmt14_base.sh" in p.stderr
    assert commands(p.stdout) == []


def _result(runs, name, tok=None, sacre=None, params=None, ups=None, p=None, pbs=None):
    (runs / name / "eval").mkdir(parents=True)
    if tok is not None:
        (runs / name / "eval" / "tok_bleu.json").write_text(json.dumps({"score": tok}))
    (runs / name / "eval" / "bleu.json").write_text(json.dumps(
        {"score": sacre, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"}))
    (runs / name / "train.log").write_text(
        f"2026 | INFO | fairseq_cli.train | num. shared model params: {params:,} (num. trained: {params:,})\n"
        f"2026 | INFO | train | epoch 001 | loss 4.1 | ups {ups} | num_updates 1000\n"
        f"2026 | INFO | train | epoch 002 | loss 3.9 | ups {ups + 0.2:.2f} | num_updates 2000\n")
    if p is not None:
        (runs / name / "significance").mkdir()
        (runs / name / "significance" / "significance.json").write_text(json.dumps(
            {"baseline": "transformer", "samples": 1000, "systems": {},
             "comparisons": [{"baseline": "transformer", "system": name, "p_value": p}]}))
    if pbs is not None:
        (runs / name / "paired_bs").mkdir()
        (runs / name / "paired_bs" / "paired_bs.json").write_text(json.dumps({"p_value": pbs, "samples": 1000}))


def test_table_puts_our_numbers_next_to_the_papers(tmp_path):
    work = tmp_path / "w"
    runs = work / "runs"
    _result(runs, "transformer", tok=28.0, sacre=27.1, params=60_524_544, ups=3.0)
    _result(runs, "enc-dc", tok=29.40, sacre=28.3, params=73_128_960, ups=2.4, p=0.004)
    p = reproduce("dc_table1.sh", "--table", "--work-dir", work)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == ("| row | pair | metric | paper BLEU | our BLEU | delta | tok. BLEU, compound split (extra) "
                        "| paper params | our params | paper speed | our speed | p (compare-mt) |")
    assert "| transformer | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 28.37 | 27.10 | -1.27 | 28.00 "\
           "| 61.2M | 60.52M | 3.66 | 3.10 | - |" in lines
    assert "| enc-dc | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 29.26 | 28.30 | -0.96 | 29.40 "\
           "| 73.86M | 73.13M | 3.0 | 2.50 | 0.004 |" in lines
    assert "| dec-dc | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 28.86 | - | - | - | 73.86M | - | 3.08 "\
           "| - | - |" in lines
    assert "2 of 4 rows have results" in p.stdout
    assert 'dc_wmt14_base (4 rows): BLEU as the paper states it: "the 4-gram case-sensitive NIST BLEU metric is ' \
           'employed as the evaluation metric for the En->De task"; main column: NIST BLEU (mteval-v13a = sacreBLEU ' \
           '13a); extra column: tok. BLEU, compound split. Test set: wmt14_en_de: newstest2014 (full, 3003 ' \
           'sentences), cased.' in p.stdout
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0" in p.stdout
    assert (work / "results.md").read_text() == p.stdout

    # a dry run now skips the evaluated rows and tests significance against their translations
    p = dry_run("dc_table1.sh", work)
    cmds = commands(p.stdout)
    assert [os.path.basename(opt(c, "--save-dir")) for c in by_script(cmds, "train.sh")] == ["dec-dc", "full-dc"]
    assert "enc-dc: trained and evaluated" in p.stdout
    assert {opt(c, "--system").split("=")[0] for c in by_script(cmds, "significance.sh")} == \
        {"dec-dc", "full-dc"}  # enc-dc has its significance.json already
    # parameter differences ('+' in the paper's column) are differences for us too
    result_dir = tmp_path / "song"
    runs = result_dir / "runs"
    _result(runs, "iwslt.transformer", tok=31.0, sacre=30.0, params=11_878_400, ups=5.0)
    _result(runs, "iwslt.hysan_gated", tok=32.0, sacre=31.0, params=11_911_168, ups=4.0)
    p = reproduce("song2019_table2.sh", "--table", "--work-dir", result_dir)
    assert p.returncode == 0, p.stderr
    assert "| iwslt.transformer | de-en | sacreBLEU | 31.27 | 30.00 | -1.27 | 31.00 | 11.9M | 11.88M |" in p.stdout
    assert "| iwslt.hysan_gated | de-en | sacreBLEU | 32.28 | 31.00 | -1.28 | 32.00 | +32K | +32,768 |" in p.stdout
    assert "extra column: multi-bleu (Moses-tok.)" in p.stdout
    # Xu et al.: a count that differs because our run shares the embeddings is marked;
    # the paper's significance test (Koehn's paired bootstrap)
    result_dir = tmp_path / "xu"
    runs = result_dir / "runs"
    _result(runs, "en-de.transformer", tok=27.5, sacre=27.0, params=60_524_544, ups=1.0)
    _result(runs, "en-de.hybrid_gate", tok=28.4, sacre=27.9, params=60_524_554, ups=1.0, pbs=0.002)
    p = reproduce("xu2019_table2.sh", "--table", "--work-dir", result_dir)
    assert p.returncode == 0, p.stderr
    assert "| en-de.hybrid_gate | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 28.31 | 27.90 | -0.41 | 28.40 "\
           "| 0.002 |" in p.stdout
    assert "p (paired bootstrap): Koehn (2004), 1000 full-size resamples" in p.stdout
    assert "Training: early stopping on dev BLEU (patience 10 validations" in p.stdout
    p = reproduce("xu2019_table1.sh", "--table", "--work-dir", result_dir)
    assert "| en-de.transformer | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 27.67 | 27.00 | -0.67 | 27.50 "\
           "| 88.0M | 60.52M (shared emb.) |" in p.stdout
    assert "| en-de.hybrid_gate | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 28.31 | 27.90 | -0.41 | 28.40 "\
           "| +0.0M | +10 |" in p.stdout
    assert "(shared emb.): our run shares one embedding matrix" in p.stdout


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


def test_adam_l2_is_an_l2_penalty_on_the_loss():
    """--optimizer adam_l2 --l2-regularization L (Xu et al.'s L2 1e-7): the same steps as
    torch.optim.Adam(weight_decay=L), whose weight decay is added to the gradient;
    fairseq's own --weight-decay (decoupled, AdamW) gives other steps."""
    import torch
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim import build_optimizer

    import fairseq_localness  # noqa: F401

    def build(*opts):
        args = options.parse_args_and_arch(options.get_training_parser(), [
            "/dev/null", "--task", "translation", "--arch", "transformer", "--lr", "0.01",
            "--adam-betas", "(0.9,0.98)", "--cpu", *opts])
        return convert_namespace_to_omegaconf(args).optimizer

    torch.manual_seed(0)
    start = torch.randn(6)
    weights = [torch.nn.Parameter(start.clone()) for _ in range(3)]
    ours = build_optimizer(build("--optimizer", "adam_l2", "--l2-regularization", "0.1"), [weights[0]])
    ref = torch.optim.Adam([weights[1]], lr=0.01, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    adamw = build_optimizer(build("--optimizer", "adam", "--weight-decay", "0.1"), [weights[2]])
    for _ in range(4):
        g = torch.randn(6)
        for w in weights:
            w.grad = g.clone()
        for o in (ours, ref, adamw):
            o.step()
    assert torch.allclose(weights[0], weights[1], atol=1e-7)
    assert not torch.allclose(weights[0], weights[2], atol=1e-4)
    # with mixed precision's scaled gradients (scale = 1/loss scale) the penalty scales too
    w = torch.nn.Parameter(start.clone())
    scaled = build_optimizer(build("--optimizer", "adam_l2", "--l2-regularization", "0.1"), [w])
    w_ref = torch.nn.Parameter(start.clone())
    ref = torch.optim.Adam([w_ref], lr=0.01, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    g = torch.randn(6)
    w.grad, w_ref.grad = g * 8, g.clone()
    scaled._optimizer.step = (lambda step: (lambda closure=None, scale=1.0: (
        [setattr(p, "grad", p.grad / scale) for p in scaled.params], step(closure))))(scaled._optimizer.step)
    scaled.step(scale=8.0)
    ref.step()
    assert torch.allclose(w, w_ref, atol=1e-7)


def test_paired_bootstrap(tmp_path):
    """paired_bs.py: Koehn's test through sacrebleu --paired-bs; a clearly better system
    gets a small p; bad inputs exit with a message."""
    import random

    rng = random.Random(0)
    words = "the a cat dog sat on mat house tree green big small".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(200)]
    base = [" ".join(w if rng.random() < 0.5 else "x" for w in r.split()) for r in refs]
    better = [" ".join(w if rng.random() < 0.9 else "x" for w in r.split()) for r in refs]
    for name, text in (("ref", refs), ("base", base), ("better", better)):
        (tmp_path / name).write_text("\n".join(text) + "\n")
    script = os.path.join(REPRO, "paired_bs.py")
    p = subprocess.run([sys.executable, script, "--ref", tmp_path / "ref", "--baseline", f"b={tmp_path / 'base'}",
                        "--system", f"s={tmp_path / 'better'}", "--samples", "200", "--out", tmp_path / "out"],
                       capture_output=True, text=True, env=tool_env())
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "out" / "paired_bs.json").read_text())
    assert result["samples"] == 200 and result["tokenize"] == "13a" and "Koehn 2004" in result["test"]
    assert result["system"]["bleu"] > result["baseline"]["bleu"] and result["p_value"] < 0.01
    assert "--paired-bs" in result["command"]
    p = subprocess.run([sys.executable, script, "--ref", tmp_path / "ref", "--baseline", f"b={tmp_path / 'base'}",
                        "--system", f"s={tmp_path / 'base'}", "--samples", "50", "--out", tmp_path / "same"],
                       capture_output=True, text=True, env=tool_env())
    same = json.loads((tmp_path / "same" / "paired_bs.json").read_text())  # one file as both: runs on a copy
    assert same["system"]["bleu"] == same["baseline"]["bleu"] and 0 < same["p_value"] <= 1
    (tmp_path / "short").write_text("one line\n")
    p = subprocess.run([sys.executable, script, "--ref", tmp_path / "ref", "--baseline", f"b={tmp_path / 'base'}",
                        "--system", f"s={tmp_path / 'short'}", "--out", tmp_path / "bad"],
                       capture_output=True, text=True, env=tool_env())
    assert p.returncode != 0 and "has 1 lines, --ref has 200" in p.stderr and not (tmp_path / "bad").exists()


STUBS = {
    # each pipeline step: log its arguments, make the outputs the driver reads next
    "prepare_data.sh": 'out=$(arg --out); mkdir -p "$out/raw" "$out/bin"; echo ref > "$out/raw/test.$(arg --tgt)"; '
                       'touch "$out/PREPARED"',
    "train.sh": 'dir=$(arg --save-dir); touch "$dir/checkpoint_last.pt"; '
                'printf "num. shared model params: 1,000 (num. trained: 1,000)\\n| train | epoch 001 | ups 2.5\\n" '
                '> "$dir/train.log"',
    "average.sh": 'touch "$(arg --output)"',
    "evaluate.sh": 'out=$(arg --out); mkdir -p "$out"; echo hyp | tee "$out/hyp.detok" "$out/hyp.tok_bleu" '
                   '"$out/ref.tok_bleu" > /dev/null; '
                   'echo "{\\"score\\": 20.5, \\"signature\\": \\"sig\\"}" > "$out/bleu.json"; '
                   'echo "{\\"score\\": 21.5}" > "$out/tok_bleu.json"',
    "significance.sh": 'out=$(arg --out); mkdir -p "$out"; echo "{\\"p_value\\": 0.01}" > "$out/significance.json"',
}


def _stub_steps(tmp_path, bodies, checks=None):
    """Stand-ins for the pipeline steps (each logs its arguments to $CALLS, then runs
    its body, which can read an option's value with `arg --name`; a ``--check`` call
    only exits 0, and is logged to ``checks`` when given) and for the driver's fairseq
    import; the environment that points the driver at them."""
    stubs = tmp_path / "steps"
    stubs.mkdir()
    for name, body in bodies.items():
        on_check = ('echo "' + name + ' $*" >> "$CHECKS"; ' if checks else "") + "exit 0"
        (stubs / name).write_text(
            'set -eu\nif [[ " $* " == *" --check "* ]]; then ' + on_check + '; fi\necho "' + name
            + ' $*" >> "$CALLS"\n'
            'arg() { local want=$1 prev=; for a in "${ARGS[@]}"; do [[ $prev == "$want" ]] && echo "$a"; prev=$a; '
            'done; return 0; }\nARGS=("$@")\n' + body + "\n")
    env = {"REPRODUCE_PIPELINE_DIR": str(stubs), "CALLS": str(tmp_path / "calls"),
           "PYTHON": fairseq_import_stub(stubs)}
    if checks:
        env["CHECKS"] = str(checks)
    return env


def test_a_run_follows_its_dry_run_and_resumes(tmp_path):
    """With stand-ins for the pipeline steps: a real run checks that every dataset can
    be prepared, then executes what the dry run printed, in order; a rerun skips what is
    up to date; a run directory trained with other settings is refused."""
    calls, checks, work = tmp_path / "calls", tmp_path / "checks", tmp_path / "w"
    env = _stub_steps(tmp_path, STUBS, checks=checks)
    stubs = tmp_path / "steps"
    only = ["--only", "transformer enc-dc", "--work-dir", work, "--data-dir", tmp_path / "data"]
    planned = [" ".join(c[1:]).replace(str(stubs) + "/", "")
               for c in commands(reproduce("dc_table1.sh", "--dry-run", *only, env=env).stdout) if c[0] == "bash"]
    p = reproduce("dc_table1.sh", *only, env=env)
    assert p.returncode == 0, p.stderr
    ran = calls.read_text().splitlines()
    assert [r.split()[0] for r in ran] == ["prepare_data.sh", "train.sh", "average.sh", "evaluate.sh",
                                          "train.sh", "average.sh", "evaluate.sh", "significance.sh"]
    assert [shlex.split(r) for r in ran] == [shlex.split(c) for c in planned]
    # the data was checked first, with the options it is then prepared with
    (check,) = checks.read_text().splitlines()
    assert shlex.split(check) == shlex.split(ran[0]) + ["--check"]
    table = (work / "results.md").read_text()
    assert "| enc-dc | en-de | NIST BLEU (mteval-v13a = sacreBLEU 13a) | 29.26 | 20.50 | -8.76 | 21.50 | 73.86M "\
           "| 1,000 | 3.0 | 2.50 | 0.010 |" in table
    assert table in p.stdout
    assert (work / "runs" / "enc-dc" / "SYSTEM").read_text().startswith("arch dc_transformer_wmt_en_de\n")
    # rerun: everything is up to date
    calls.unlink()
    p = reproduce("dc_table1.sh", *only, env=env)
    assert p.returncode == 0, p.stderr
    assert not calls.exists(), calls.read_text()
    # more training in one run (a newer checkpoint_last.pt): resume, average, evaluate, test again
    ckpt = work / "runs" / "enc-dc" / "checkpoint_last.pt"
    later = os.path.getmtime(work / "runs" / "enc-dc" / "eval" / "bleu.json") + 10
    os.utime(ckpt, (later, later))
    p = reproduce("dc_table1.sh", *only, env=env)
    assert [r.split()[0] for r in calls.read_text().splitlines()] == \
        ["train.sh", "average.sh", "evaluate.sh", "significance.sh"]
    # the same run directory with other settings: refused before any command
    calls.unlink()
    p = reproduce("dc_table1.sh", *only, "--seed", "2", env=env)
    assert p.returncode == 2 and "was trained with other settings" in p.stderr
    assert not calls.exists()


def test_a_dataset_that_cannot_be_prepared_stops_the_run_before_any_work(tmp_path):
    """A real run checks every dataset it has to prepare before it starts: missing raw
    files (here the WMT17 ones of Yang et al.'s Zh-En rows) stop it with exit status 2
    and prepare_data.sh's message, before the En-De rows train."""
    python = fairseq_import_stub(tmp_path)
    p = reproduce("yang2018_table4.sh", "--only", "en-de.base zh-en.base", "--work-dir", tmp_path / "w",
                  "--data-dir", tmp_path / "data", "--raw-dir", tmp_path / "raw", env={"PYTHON": str(python)})
    assert p.returncode == 2, p.stderr
    assert ("row 'zh-en.base': its data cannot be prepared: --raw-dir: expected a directory at '%s', which does "
            "not exist (or pass --download" % (tmp_path / "raw" / "wmt17_zh_en")) in p.stderr
    assert not (tmp_path / "w").exists() and not (tmp_path / "data").exists()


# --------------------------------------------------------------------------- several seeds
# The steps of a run over seeds: the test set's reference, a JSON training log as
# train.sh writes it (updates per second 2.<seed>), and evaluate.sh's files copied from
# $FIXTURES/<the run directory relative to $RUNS>/ (translations made by the test).
SEED_STUBS = {
    "prepare_data.sh": 'out=$(arg --out); mkdir -p "$out/raw" "$out/bin"; cp "$FIXTURES/ref" "$out/raw/test.$(arg --tgt)"; '
                       'touch "$out/PREPARED"',
    "train.sh": 'dir=$(arg --save-dir); touch "$dir/checkpoint_last.pt"; '
                'n=$([[ $(arg --arch) == transformer_wmt_en_de ]] && echo 1,000 || echo 1,200); '
                'printf "2026 | INFO | fairseq_cli.train | num. shared model params: %s (num. trained: %s)\\n'
                '2026 | INFO | train | {\\"epoch\\": 1, \\"train_loss\\": \\"5.0\\", \\"train_ups\\": \\"2.%s\\", '
                '\\"train_num_updates\\": \\"100\\"}\\n2026 | INFO | fairseq_cli.train | done training in 9.5 seconds\\n" '
                '"$n" "$n" "$(arg --seed)" > "$dir/train.log"',
    "average.sh": 'touch "$(arg --output)"',
    "evaluate.sh": 'out=$(arg --out); mkdir -p "$out"; cp "$FIXTURES/${out#"$RUNS"/}"/* "$out/"',
    "significance.sh": 'out=$(arg --out); mkdir -p "$out"; echo "{\\"p_value\\": 0.01}" > "$out/significance.json"',
}
SEED_RATES = {("transformer", 1): 0.5, ("transformer", 2): 0.45, ("enc-dc", 1): 0.1, ("enc-dc", 2): 0.15}


def _seed_fixtures(tmp_path, run_dirs):
    """A reference of 150 sentences and, per run directory (relative to WORK/runs), the
    translations evaluate.sh would leave: the reference with a share of its words
    replaced (SEED_RATES), sacreBLEU's score of them (one decimal, as sacrebleu writes it)
    and a tokenized BLEU. Returns {(row, seed): full-precision BLEU}."""
    import random

    from sacrebleu.metrics import BLEU

    rng = random.Random(0)
    words = "the a cat dog sat on mat house tree green big small red old new".split()
    refs = [" ".join(rng.choice(words) for _ in range(9)) for _ in range(150)]
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    (fixtures / "ref").write_text("\n".join(refs) + "\n")
    bleu = {}
    for rel, (row, seed) in run_dirs.items():
        r = random.Random(10 * seed + len(row))
        hyps = [" ".join(w if r.random() > SEED_RATES[row, seed] else "x" for w in ref.split()) for ref in refs]
        score = BLEU().corpus_score(hyps, [refs])
        bleu[row, seed] = score.score
        d = fixtures / rel / "eval"
        d.mkdir(parents=True)
        (d / "hyp.detok").write_text("\n".join(hyps) + "\n")
        (d / "bleu.json").write_text(json.dumps({"name": "BLEU", "score": round(score.score, 1),
                                                 "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp"}))
        (d / "tok_bleu.json").write_text(json.dumps({"score": 20.0 + seed}))
    return bleu


def _cells(table, row):
    line = next(l for l in table.splitlines() if l.startswith(f"| {row} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_run_over_two_seeds_trains_every_row_per_seed_and_tables_mean_sd_and_the_paired_test(tmp_path):
    """--seeds 2: every row once per seed (train.sh --seed N in WORK/runs/<row>/seed<N>/),
    seed by seed, as the dry run lists them; no per-run significance steps; the table
    of fairseq-localness-results: seeds, mean ± sd of our BLEU, the extra column and the
    speed, and the paired bootstrap on the pooled seeds against the baseline row; every
    seed's numbers in results.md (Markdown) and results.json; a rerun does nothing."""
    work = tmp_path / "w"
    runs = work / "runs"
    bleu = _seed_fixtures(tmp_path, {f"{row}/seed{seed}": (row, seed) for row, seed in SEED_RATES})
    env = dict(_stub_steps(tmp_path, SEED_STUBS), FIXTURES=str(tmp_path / "fixtures"), RUNS=str(runs))
    opts = ["--seeds", "2", "--only", "transformer enc-dc", "--work-dir", work, "--data-dir", tmp_path / "data"]
    dry = reproduce("dc_table1.sh", "--dry-run", *opts, env=env)
    assert dry.returncode == 0, dry.stderr
    planned = [" ".join(c[1:]).replace(env["REPRODUCE_PIPELINE_DIR"] + "/", "")
               for c in commands(dry.stdout) if c[0] == "bash"]
    p = reproduce("dc_table1.sh", *opts, env=env)
    assert p.returncode == 0, p.stderr
    ran = (tmp_path / "calls").read_text().splitlines()
    assert [shlex.split(r) for r in ran] == [shlex.split(c) for c in planned]
    train = [shlex.split(r) for r in ran if r.startswith("train.sh")]
    assert [(opt(t, "--save-dir"), opt(t, "--seed")) for t in train] == [
        (str(runs / "transformer" / "seed1"), "1"), (str(runs / "enc-dc" / "seed1"), "1"),
        (str(runs / "transformer" / "seed2"), "2"), (str(runs / "enc-dc" / "seed2"), "2")]
    assert [r.split()[0] for r in ran].count("evaluate.sh") == 4 and not any("significance" in r for r in ran)
    for row in ("transformer", "enc-dc"):
        for seed in (1, 2):
            assert f"\nseed {seed}\n" in (runs / row / f"seed{seed}" / "SYSTEM").read_text()
        assert not (runs / row / "SYSTEM").exists()  # no one-seed run beside them
    # the table: seeds, mean ± sd, the extra column, our speed, the paired test
    table = (work / "results.md").read_text()
    assert table in p.stdout
    assert table.splitlines()[0] == (
        "| row | pair | metric | seeds | paper BLEU | our BLEU | delta | tok. BLEU, compound split (extra) "
        "| paper params | our params | paper speed | our speed | Δ vs. baseline | p (vs. baseline) | vs. baseline "
        "| seeds better / worse |")
    mean = {row: (bleu[row, 1] + bleu[row, 2]) / 2 for row in ("transformer", "enc-dc")}
    sd = {row: abs(bleu[row, 1] - bleu[row, 2]) / 2 ** 0.5 for row in ("transformer", "enc-dc")}
    t, e = _cells(table, "transformer"), _cells(table, "enc-dc")
    assert t[:8] == ["transformer", "en-de", "NIST BLEU (mteval-v13a = sacreBLEU 13a)", "2 of 2", "28.37",
                     f"{mean['transformer']:.2f} ± {sd['transformer']:.2f}",
                     "%+.2f" % (round(mean["transformer"], 2) - 28.37), "21.50 ± 0.71"]
    assert t[8:] == ["61.2M", "1,000", "3.66", "2.15 ± 0.07", "-", "-", "baseline", "-"]
    assert e[3:6] == ["2 of 2", "29.26", f"{mean['enc-dc']:.2f} ± {sd['enc-dc']:.2f}"]
    assert e[9] == "1,200"
    assert e[12] == "%+.2f" % (mean["enc-dc"] - mean["transformer"])
    assert e[13] == "<0.001" and e[14:] == ["better", "2 / 0 of 2"]
    assert "Seeds 1,2: each cell is the mean ± the standard deviation" in table
    assert "dc_wmt14_base (4 rows): BLEU as the paper states it" in table and "Training: 160000 updates" in table
    # every seed's numbers: Markdown below the table, JSON and TSV beside it
    assert f"| enc-dc | 2 | 1,200 | {bleu['enc-dc', 2]:.2f} | 22.00 | 9.5 | 100 | 2.20 |" in table
    saved = json.loads((work / "results.json").read_text())
    by = {s["system"]: s for s in saved["systems"]}
    assert [(r["seed"], r["dir"]) for r in by["enc-dc"]["runs"]] == [(1, "runs/enc-dc/seed1"), (2, "runs/enc-dc/seed2")]
    assert [r["bleu"] for r in by["enc-dc"]["runs"]] == pytest.approx([bleu["enc-dc", 1], bleu["enc-dc", 2]])
    assert by["enc-dc"]["summary"]["bleu"]["mean"] == pytest.approx(mean["enc-dc"])
    assert by["enc-dc"]["comparison"]["pooled"]["verdict"] == "better"
    assert by["dec-dc"]["seeds"] == [1, 2] and by["dec-dc"]["seeds_done"] == []
    assert len((work / "results.tsv").read_text().splitlines()) == 1 + 4 * 2
    assert "runs/transformer/seed2\teval/hyp.detok\teval/bleu.json" in (work / "runs.tsv").read_text()
    # rerun: up to date; --table prints the same table
    (tmp_path / "calls").unlink()
    p = reproduce("dc_table1.sh", *opts, env=env)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "calls").exists() and (work / "results.md").read_text() == table
    p = reproduce("dc_table1.sh", "--table", "--seeds", "2", "--work-dir", work, "--data-dir", tmp_path / "data",
                  env=env)
    assert p.returncode == 0 and p.stdout == table


def test_seeds_use_a_one_seed_run_of_the_same_seed(tmp_path):
    """A table run with one seed first, then with --seeds 2: the one-seed run in
    WORK/runs/<row>/ (trained with seed 1 and the row's settings) is seed 1's run, not
    trained again; the other seeds go to WORK/runs/<row>/seed<N>/. A one-seed run with
    another seed (or other settings) is not a seed's run: seed 1 is trained in seed1/."""
    work = tmp_path / "w"
    runs = work / "runs"
    _seed_fixtures(tmp_path, {"transformer": ("transformer", 1), "transformer/seed1": ("transformer", 1),
                              "transformer/seed2": ("transformer", 2), "enc-dc/seed1": ("enc-dc", 1),
                              "enc-dc/seed2": ("enc-dc", 2)})
    env = dict(_stub_steps(tmp_path, SEED_STUBS), FIXTURES=str(tmp_path / "fixtures"), RUNS=str(runs))
    common = ["--work-dir", work, "--data-dir", tmp_path / "data"]
    p = reproduce("dc_table1.sh", "--only", "transformer", *common, env=env)
    assert p.returncode == 0, p.stderr
    assert (runs / "transformer" / "checkpoint_last.pt").exists()

    def trained():
        calls = tmp_path / "calls"
        out = [opt(shlex.split(r), "--save-dir") for r in calls.read_text().splitlines() if r.startswith("train.sh")]
        calls.unlink()
        return out

    trained()
    seeds = ["--seeds", "2", "--only", "transformer enc-dc", *common]
    p = reproduce("dc_table1.sh", *seeds, env=env)
    assert p.returncode == 0, p.stderr
    assert trained() == [str(runs / "enc-dc" / "seed1"), str(runs / "transformer" / "seed2"),
                         str(runs / "enc-dc" / "seed2")]
    assert f"seed 1: the one-seed run in {runs / 'transformer'} is this seed's run" in p.stderr
    assert not (runs / "transformer" / "seed1").exists()
    saved = json.loads((work / "results.json").read_text())
    assert [r["dir"] for r in saved["systems"][0]["runs"]] == ["runs/transformer", "runs/transformer/seed2"]
    assert _cells((work / "results.md").read_text(), "transformer")[3] == "2 of 2"
    # the one-seed run as if trained with seed 7: seed 1 gets its own run
    system = runs / "transformer" / "SYSTEM"
    system.write_text(system.read_text().replace("\nseed 1\n", "\nseed 7\n"))
    p = reproduce("dc_table1.sh", *seeds, env=env)
    assert p.returncode == 0, p.stderr
    assert trained() == [str(runs / "transformer" / "seed1")]
    saved = json.loads((work / "results.json").read_text())
    assert [r["dir"] for r in saved["systems"][0]["runs"]] == ["runs/transformer/seed1", "runs/transformer/seed2"]


def test_seeds_dry_run_lists_every_seeds_runs(tmp_path):
    """The dry run with --seeds prints each seed's runs (its own run directory and
    --seed), seed by seed, and the table's seeds column; with one seed (--seeds 1) it
    is the single run of today, paths included."""
    work = tmp_path / "w"
    p = dry_run("dc_table1.sh", work, "--seeds", "1,5", "--only", "transformer enc-dc")
    cmds = commands(p.stdout)
    train = by_script(cmds, "train.sh")
    assert [(os.path.relpath(opt(t, "--save-dir"), work), opt(t, "--seed")) for t in train] == [
        ("runs/transformer/seed1", "1"), ("runs/enc-dc/seed1", "1"),
        ("runs/transformer/seed5", "5"), ("runs/enc-dc/seed5", "5")]
    assert [opt(c, "--output") for c in by_script(cmds, "average.sh")] == \
        [str(work / "runs" / r / f"seed{s}" / "checkpoint_avg_last5.pt") for s in (1, 5) for r in ("transformer", "enc-dc")]
    assert [opt(c, "--out") for c in by_script(cmds, "evaluate.sh")] == \
        [str(work / "runs" / r / f"seed{s}" / "eval") for s in (1, 5) for r in ("transformer", "enc-dc")]
    assert by_script(cmds, "significance.sh") == [] and by_script(cmds, "paired_bs.py") == []
    assert "# --- seed 1\n" in p.stdout and "# --- seed 5\n" in p.stdout
    assert "# === enc-dc: dc_transformer_wmt_en_de, dc_wmt14_base (wmt14_en_de en-de), seed 5 ===" in p.stdout
    assert "seeds 1 5" in p.stdout and "Koehn's paired bootstrap against the baseline row on the seeds' pooled" \
        in p.stdout
    table = p.stdout[p.stdout.index("# table"):]
    assert "| row | pair | metric | seeds | paper BLEU | our BLEU |" in table
    assert _cells(table, "enc-dc")[:5] == ["enc-dc", "en-de", "NIST BLEU (mteval-v13a = sacreBLEU 13a)", "0 of 2",
                                          "29.26"]
    assert not work.exists()
    # one seed: exactly the run without --seeds
    one = dry_run("dc_table1.sh", work, "--seeds", "1", "--only", "transformer enc-dc")
    assert one.stdout == dry_run("dc_table1.sh", work, "--only", "transformer enc-dc").stdout
    assert "/seed1" not in one.stdout and "| seeds |" not in one.stdout
    assert not work.exists()


@pytest.mark.parametrize("args, message", [
    (["--seeds", ""], "--seeds: expected a number of seeds (e.g. 3: seeds 1,2,3) or a comma-separated list of seeds"),
    (["--seeds", "0"], "--seeds: expected a whole number >= 1, got '0' (a number of seeds N, seeds 1..N, or a "
                       "comma-separated list of distinct seeds"),
    (["--seeds", "-2"], "--seeds: expected a number of seeds (e.g. 3: seeds 1,2,3) or a comma-separated list"),
    (["--seeds", "2.5"], "--seeds: expected a number of seeds"),
    (["--seeds", "two"], "got 'two'"),
    (["--seeds", "1,,2"], "--seeds: expected a number of seeds"),
    (["--seeds", "1,3,1"], "--seeds: '1,3,1' names a seed twice; expected distinct seeds"),
    (["--seeds", "1,01"], "--seeds: '1,01' names a seed twice"),
    (["--seed", "2", "--seeds", "3"], "--seed and --seeds: expected one of them, not both"),
    (["--seeds"], "option --seeds needs a value"),
])
def test_bad_seeds_fail_before_any_command(tmp_path, args, message):
    for mode in (["--dry-run"], []):  # (a real run stops as early: before its fairseq import)
        p = reproduce("dc_table1.sh", *mode, "--work-dir", tmp_path / "w", *args)
        assert p.returncode == 2, p.stderr
        assert message in p.stderr and "--seeds" in p.stderr
        assert commands(p.stdout) == [] and not (tmp_path / "w").exists()


def test_our_speed_is_read_from_json_logs_too(tmp_path):
    """train.sh logs JSON records ('"train_ups": "2.5"'); the one-seed table reads the
    speed from them as from fairseq's simple format."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("results_table", os.path.join(REPRO, "results_table.py"))
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    log = tmp_path / "train.log"
    log.write_text('2026 | INFO | train_inner | {"epoch": 1, "update": 0.5, "wps": "900.0", "ups": "9.0", '
                   '"num_updates": "10"}\n'
                   '2026 | INFO | train | {"epoch": 1, "train_loss": "5.0", "train_wps": "800.0", "train_ups": "2.5", '
                   '"train_num_updates": "20"}\n'
                   '2026 | INFO | train | {"epoch": 2, "train_loss": "4.0", "train_wps": "800.0", "train_ups": "3.5", '
                   '"train_num_updates": "40"}\n')
    assert table.speed_of(str(log)) == pytest.approx(3.0)
    log.write_text('2026 | INFO | train_inner | {"epoch": 1, "wps": "900.0", "ups": "9.0", "num_updates": "10"}\n')
    assert table.speed_of(str(log)) == pytest.approx(9.0)
    log.write_text("2026 | INFO | train | epoch 001 | loss 4.1 | wps 800 | ups 3.0 | num_updates 1000\n")
    assert table.speed_of(str(log)) == pytest.approx(3.0)


# --------------------------------------------------------------------------- labels
LABELLED = ("[paper]", "[*]")
RECIPE_CALLS = ("vaswani_recipe", "cosine_recipe", "song2019_recipe", "dc_recipe")


def config_statements(path):
    """(variable, label text) of every top-level assignment of a configuration file (a
    recipe call counts as TRAIN_ARGS): the comment lines above the group of
    statements it belongs to (statements with no blank line or comment between
    them share one), and a comment on its own line."""
    out, comments, in_block, depth = [], [], False, 0
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        if depth:  # inside a multi-line array
            depth += line.count("(") - line.count(")")
            continue
        if line.startswith("#"):
            if in_block:
                comments, in_block = [], False
            comments.append(line)
            continue
        if not line.strip():
            comments, in_block = [], False
            continue
        if line[0].isspace() or line.startswith("}"):  # a function's body (base/recipes.sh)
            continue
        name = line.split("=", 1)[0] if "=" in line.split()[0] else line.split()[0]
        if name in RECIPE_CALLS:
            name = "TRAIN_ARGS"
        if name.isupper() or name == "TRAIN_ARGS":
            trailing = line.split("#", 1)[1] if " # " in line else ""
            out.append((name, "\n".join(comments) + trailing))
            depth = line.count("(") - line.count(")")
        in_block = True
    return out


CONFIG_FILES = sorted(
    os.path.join(d, f) for d in (os.path.join(REPO, "configs", "papers"), os.path.join(REPO, "configs", "papers", "base"))
    for f in os.listdir(d) if f.endswith(".sh"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_every_config_variable_is_labelled_the_papers_or_ours(path):
    statements = config_statements(path)
    unlabelled = [name for name, text in statements if not any(label in text for label in LABELLED)]
    assert not unlabelled, f"{path}: no [paper] or [*] label above {unlabelled} (docs/reproduce.md)"


def test_the_label_check_sees_every_variable(tmp_path):
    """The parser finds each assignment, multi-line arrays and recipe calls included,
    and a variable without a label is reported."""
    path = tmp_path / "c.sh"
    path.write_text('# [paper] "quoted"\nBEAM=4\nLENPEN=0.6\n\n# [*] ours\nvaswani_recipe 1 2 3 4\n'
                    'PAIRS=(\n    "a|b"\n)\n\n# plain words\nMAX_UPDATE=1\nAVERAGE_LAST=5  # [*] why\n')
    got = config_statements(str(path))
    assert [n for n, _ in got] == ["BEAM", "LENPEN", "TRAIN_ARGS", "PAIRS", "MAX_UPDATE", "AVERAGE_LAST"]
    labelled = {n: any(label in t for label in LABELLED) for n, t in got}
    assert labelled == {"BEAM": True, "LENPEN": True, "TRAIN_ARGS": True, "PAIRS": True, "MAX_UPDATE": False,
                        "AVERAGE_LAST": True}
