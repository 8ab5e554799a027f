"""The pipeline scripts (scripts/*.sh): end to end in a few updates, and bad inputs
rejected up front (exit status 2, a message naming the option/file and what was
expected, no command run, nothing written); their option parser (lib.sh's
parse_options) on a table of every kind of option."""
import json
import os
import subprocess
import sys

import pytest

from browser import Browser, check_report_page, chromium_missing
from conftest import TINY_MODEL_ARGS, run_script, tool_env

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:"


def commands(stderr):
    """The commands a script announced (its `run` lines)."""
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


def test_pipeline_end_to_end(tiny_data_bin, tmp_path):
    """subword-nmt + Moses tokenization (the demo covers sentencepiece) -> preprocess
    -> train 3 updates -> average the last 2 -> generate, postprocess, sacrebleu."""
    raw = tiny_data_bin.raw_dir
    bpe, data_bin, ckpts = tmp_path / "bpe", tmp_path / "data-bin", tmp_path / "ckpts"
    lang = ["--src", "src", "--tgt", "tgt"]

    p = run_script("prepare_bpe.sh", ["--raw", raw, "--out", bpe, *lang, "--method", "subword-nmt",
                                      "--merges", "200", "--tokenize", "moses"])
    cmds = commands(p.stderr)
    assert any(c.startswith("sacremoses") and " tokenize" in c for c in cmds)
    assert any(c.startswith("subword-nmt learn-bpe") for c in cmds)
    assert (bpe / "code").is_file() and (bpe / "SEGMENTATION").read_text().strip() == "subword-nmt"
    segmented = (bpe / "train.src").read_text()
    assert "@@ " in segmented and " ." in segmented  # split into subwords; full stop tokenized
    assert not list(tmp_path.glob("*.tmp.*"))

    p = run_script("preprocess.sh", ["--data", bpe, "--dest", data_bin, *lang])
    assert any(c.startswith("fairseq-preprocess") and "--joined-dictionary" in c for c in commands(p.stderr))
    assert (data_bin / "dict.src.txt").read_text() == (data_bin / "dict.tgt.txt").read_text()
    assert (data_bin / "code").is_file() and (data_bin / "TOKENIZATION").read_text().strip() == "moses"

    tb = tmp_path / "tb"
    p = run_script("train.sh", ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", ckpts,
                                "--max-update", "3", *lang, "--",
                                *TINY_MODEL_ARGS, "--max-tokens", "1024", "--save-interval-updates", "1",
                                "--no-epoch-checkpoints", "--num-workers", "0", "--warmup-updates", "1",
                                "--log-interval", "1", "--tensorboard-logdir", tb])
    train_cmd = [c for c in commands(p.stderr) if c.startswith("fairseq-train")]
    assert len(train_cmd) == 1 and "--user-dir" in train_cmd[0] and "--log-format json" in train_cmd[0]
    assert (ckpts / "checkpoint_1_3.pt").is_file()
    # the training records are JSON objects after fairseq's logger prefix, and the
    # analysis tools read them
    records = {kind: json.loads(line.split(f"| {kind} | ", 1)[1]) for line in p.stdout.splitlines()
               for kind in ("train_inner", "valid", "train") if f"| {kind} | {{" in line}
    assert set(records) == {"train_inner", "valid", "train"}
    assert records["train"]["train_num_updates"] == "3" and "valid_loss" in records["valid"]
    from fairseq_localness.analysis.logs import parse_log

    (tmp_path / "train.log").write_text(p.stdout)
    log = parse_log(str(tmp_path / "train.log"))
    assert log.last_update == 3 and log.params and [r["num_updates"] for r in log.of_kind("train_inner")] == [1, 2, 3]
    # TensorBoard event files through tensorboardX, and no request to install it
    for kind in ("train_inner", "valid", "train"):
        assert any(f.startswith("events.out.tfevents") for f in os.listdir(tb / kind)), kind
    assert "install tensorboardX" not in p.stdout + p.stderr

    p = run_script("average.sh", ["--save-dir", ckpts, "--last", "2", "--by", "update"])
    assert (ckpts / "checkpoint_avg_last2.pt").is_file()
    assert "checkpoint_1_3.pt" in p.stdout and "checkpoint_1_2.pt" in p.stdout

    out = tmp_path / "eval"
    p = run_script("evaluate.sh", ["--data-bin", data_bin, "--checkpoint", ckpts / "checkpoint_avg_last2.pt",
                                   *lang, "--ref", os.path.join(raw, "test.tgt"), "--beam", "2",
                                   "--lenpen", "0.6", "--out", out, "--", "--max-len-a", "1.5", "--max-len-b", "5"])
    cmds = commands(p.stderr)
    assert any(c.startswith("fairseq-generate") and "--beam 2 --lenpen 0.6" in c for c in cmds)
    assert any(c.startswith("sacremoses") and "detokenize" in c for c in cmds)
    assert any(c.startswith("sacrebleu") for c in cmds)
    assert SIGNATURE in p.stdout and "BLEU = " in p.stdout.splitlines()[-1]
    n_ref = len(tiny_data_bin.lines("test", "tgt"))
    for name in ("hyp.seg", "hyp.tok", "hyp.detok"):
        assert len((out / name).read_text().splitlines()) == n_ref, name
    assert "@@" not in (out / "hyp.tok").read_text()
    assert " ." not in (out / "hyp.detok").read_text()  # detokenized: full stop reattached


# --------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def bad_input_env(tiny_data_bin, tmp_path_factory):
    base = tmp_path_factory.mktemp("bad_inputs")
    empty_ckpts = base / "empty_ckpts"
    empty_ckpts.mkdir()
    return {
        "RAW": tiny_data_bin.raw_dir, "BPE": tiny_data_bin.bpe_dir, "BIN": tiny_data_bin.data_bin,
        "EMPTY": str(empty_ckpts), "REF": os.path.join(tiny_data_bin.raw_dir, "test.tgt"),
        "TRAIN_REF": os.path.join(tiny_data_bin.raw_dir, "train.tgt"),
        "FILE": os.path.join(tiny_data_bin.data_bin, "dict.src.txt"),
    }


# (script, args, fragments the message must contain); NEW is a path that must stay absent
BAD = {
    "bpe_missing_raw": ("prepare_bpe.sh", "--raw /nonexistent --out NEW --src src --tgt tgt",
                        ["--raw: expected a directory at '/nonexistent'"]),
    "bpe_wrong_pair": ("prepare_bpe.sh", "--raw RAW --out NEW --src de --tgt tgt",
                       ["train.de", "does not exist", "data for de-tgt"]),
    "bpe_bad_method": ("prepare_bpe.sh", "--raw RAW --out NEW --src src --tgt tgt --method wordpiece",
                       ["--method: expected one of: sentencepiece subword-nmt; got 'wordpiece'"]),
    "bpe_missing_option": ("prepare_bpe.sh", "--raw RAW --src src --tgt tgt", ["missing required option --out"]),
    "bpe_unknown_option": ("prepare_bpe.sh", "--raw RAW --out NEW --src src --tgt tgt --bpe x",
                           ["unknown option '--bpe'"]),
    "preprocess_wrong_pair": ("preprocess.sh", "--data BPE --dest NEW --src en --tgt tgt",
                              ["train.en", "does not exist"]),
    "preprocess_dest_exists": ("preprocess.sh", "--data BPE --dest BIN --src src --tgt tgt",
                               ["--dest:", "already exists", "--force"]),
    "train_unknown_arch": ("train.sh", "--arch transformer_huge --data-bin BIN --save-dir NEW "
                           "--max-update 2 --src src --tgt tgt",
                           ["--arch: 'transformer_huge' is not a registered architecture", "transformer_tiny"]),
    "train_wrong_pair": ("train.sh", "--arch transformer --data-bin BIN --save-dir NEW --max-update 2 "
                         "--src de --tgt tgt",
                         ["no dictionary for language 'de'", "dict.de.txt", "pairs found there: src-tgt"]),
    "train_reversed_pair": ("train.sh", "--arch transformer --data-bin BIN --save-dir NEW --max-update 2 "
                            "--src tgt --tgt src", ["no 'train' data for tgt-src", "pairs found there: src-tgt"]),
    "train_bad_max_update": ("train.sh", "--arch transformer --data-bin BIN --save-dir NEW --max-update many "
                             "--src src --tgt tgt", ["--max-update: expected a whole number >= 1, got 'many'"]),
    "train_missing_data_bin": ("train.sh", "--arch transformer --data-bin /nonexistent --save-dir NEW "
                               "--max-update 2 --src src --tgt tgt", ["--data-bin: expected a directory"]),
    "train_missing_arch": ("train.sh", "--data-bin BIN --save-dir NEW --max-update 2 --src src --tgt tgt",
                           ["missing required option --arch"]),
    "average_too_few": ("average.sh", "--save-dir EMPTY --last 5 --by update --output NEW",
                        ["has 0 checkpoint(s) named checkpoint_<epoch>_<update>.pt", "--last asks for 5"]),
    "average_bad_by": ("average.sh", "--save-dir EMPTY --last 5 --by step --output NEW",
                       ["--by: expected one of: update epoch"]),
    "evaluate_missing_checkpoint": ("evaluate.sh", "--data-bin BIN --checkpoint /nonexistent.pt --src src "
                                    "--tgt tgt --ref REF --out NEW", ["--checkpoint: expected a file at"]),
    "evaluate_wrong_reference": ("evaluate.sh", "--data-bin BIN --checkpoint FILE --src src --tgt tgt "
                                 "--ref TRAIN_REF --out NEW",
                                 ["--ref:", "has 200 lines but the 'test' set", "has 12 sentences"]),
    "evaluate_wrong_subset": ("evaluate.sh", "--data-bin BIN --checkpoint FILE --src src --tgt tgt --ref REF "
                              "--subset dev --out NEW", ["no 'dev' data for src-tgt"]),
    "evaluate_bad_beam": ("evaluate.sh", "--data-bin BIN --checkpoint FILE --src src --tgt tgt --ref REF "
                          "--beam 0 --out NEW", ["--beam: expected a whole number >= 1, got '0'"]),
    "evaluate_bad_lenpen": ("evaluate.sh", "--data-bin BIN --checkpoint FILE --src src --tgt tgt --ref REF "
                            "--lenpen high --out NEW", ["--lenpen: expected a number, got 'high'"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_cleanly(case, bad_input_env, tmp_path):
    script, args, fragments = BAD[case]
    new = tmp_path / "new"
    env = dict(bad_input_env, NEW=str(new))
    argv = [env.get(a, a) for a in args.split()]
    before = sorted(os.listdir(tmp_path))
    p = run_script(script, argv, check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith(f"{script}: error: "), p.stderr
    for fragment in fragments:
        assert fragment in p.stderr, (fragment, p.stderr)
    assert commands(p.stderr) == []  # stopped before running anything
    assert not new.exists()
    assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.parametrize("env, message", [
    ({"DEMO_ONLY": "nonexistent"}, "DEMO_ONLY: no system 'nonexistent'"),
    ({"DEMO_SEEDS": "0"}, "DEMO_SEEDS: expected a whole number >= 1, got '0'"),
    ({"DEMO_SEEDS": "1,2,1"}, "DEMO_SEEDS: '1,2,1' names a seed twice"),
    ({"DEMO_SEEDS": "three"}, "DEMO_SEEDS: expected a number of seeds (e.g. 3: seeds 1,2,3) or a comma-separated"),
])
def test_demo_rejects_bad_settings(tmp_path, env, message):
    demo_dir = tmp_path / "demo"
    p = run_script("demo.sh", [], check=False, env={**env, "DEMO_DIR": str(demo_dir)})
    assert p.returncode == 2
    assert p.stderr.startswith("demo.sh: error: ") and message in p.stderr, p.stderr
    if "DEMO_ONLY" in env:
        assert "transformer" in p.stderr  # the names that exist
    assert not demo_dir.exists() and not (tmp_path / "demo.partial").exists()


@pytest.mark.parametrize("script", ["prepare_bpe.sh", "preprocess.sh", "train.sh", "average.sh",
                                    "evaluate.sh", "demo.sh", "analyze_demo.sh"])
def test_help(script):
    p = run_script(script, ["--help"])
    assert "Usage:" in p.stdout


# A script of every kind of option the table of lib.sh's parse_options knows; it prints
# what it read.
TABLE_SCRIPT = r"""#!/usr/bin/env bash
# A script with one option of each kind.
#
# Usage: t.sh --n N [options] [-- EXTRA...]
#
# Prose after the options.
set -euo pipefail
. "$1/lib.sh"
shift
parse_options "$@" <<'EOF'
--n N           N       int:1        required
    a whole number
--x X           X       float        0.5
--mode M        MODE    choice:a|b   a
    a number and a mode (one help for both)
--code LANG     CODE    lang         -
    a language code
--in FILE       IN      file         -
    a file
--dir DIR       DIR     dir          -
    a directory
--name S        NAME    text         -
    anything
--on            ON      flag         -
    a flag
Repeatable:
--item V        ITEMS   list         -
    one item (repeatable)
--pass V        PASSED  pass         -
    handed on with the option
-- EXTRA...     EXTRA   rest:tool    -
    the tool's arguments
EOF
printf 'N=%s X=%s MODE=%s CODE=%s NAME=%s ON=%s\n' "$N" "$X" "$MODE" "$CODE" "$NAME" "$ON"
printf 'ITEMS:'; printf ' [%s]' "${ITEMS[@]}"; echo
printf 'PASSED:'; printf ' [%s]' "${PASSED[@]}"; echo
printf 'EXTRA:'; printf ' [%s]' "${EXTRA[@]}"; echo
"""


@pytest.fixture(scope="module")
def table_script(tmp_path_factory):
    path = tmp_path_factory.mktemp("table") / "t.sh"
    path.write_text(TABLE_SCRIPT)
    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")

    def run(*args):
        return subprocess.run(["bash", str(path), scripts, *args], capture_output=True, text=True,
                              env=tool_env({"PYTHON": sys.executable}))
    return run


def test_parse_options_reads_the_table(table_script, tmp_path):
    """lib.sh's parse_options: values into their variables (defaults where not given,
    the last of an option given twice), flags, repeatable options and the arguments
    after -- as arrays."""
    p = table_script("--n", "3", "--n", "4", "--mode", "b", "--code", "de", "--name", "a b", "--on",
                     "--item", "i 1", "--pass", "p", "--item", "i2", "--pass", "q", "--in", __file__,
                     "--dir", str(tmp_path), "--", "--n", "x", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["N=4 X=0.5 MODE=b CODE=de NAME=a b ON=1", "ITEMS: [i 1] [i2]",
                                     "PASSED: [--pass] [p] [--pass] [q]", "EXTRA: [--n] [x] [--help]"]
    p = table_script("--n", "1")
    assert p.stdout.splitlines()[0] == "N=1 X=0.5 MODE=a CODE= NAME= ON=0"


@pytest.mark.parametrize("args, message", [
    (["--n", "1", "--bogus"], "unknown option '--bogus' (see 't.sh --help'; tool options go after --)"),
    (["--n"], "option --n needs a value"),
    (["--x", "1"], "missing required option --n (see 't.sh --help')"),
    (["--n", "0"], "--n: expected a whole number >= 1, got '0'"),
    (["--n", ""], "missing required option --n (see 't.sh --help')"),
    (["--n", "1", "--x", "big"], "--x: expected a number, got 'big'"),
    (["--n", "1", "--mode", "c"], "--mode: expected one of: a b; got 'c'"),
    (["--n", "1", "--code", "d-e"], "--code: expected a language code (letters, digits, '_'), got 'd-e'"),
    (["--n", "1", "--in", "/nonexistent"], "--in: expected a file at '/nonexistent', which does not exist"),
    (["--n", "1", "--dir", "/nonexistent"], "--dir: expected a directory at '/nonexistent', which does not exist"),
    # the values are checked before the files: the first error in that order is reported
    (["--in", "/nonexistent", "--n", "1", "--x", "big"], "--x: expected a number, got 'big'"),
])
def test_parse_options_refuses_bad_values(table_script, args, message):
    p = table_script(*args)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == f"t.sh: error: {message}\n"


def test_parse_options_help_prints_the_table(table_script):
    """--help: the header, the table's options after the Usage paragraph (METAVAR, help
    beside it, an option without help on the line of the next one, the headings), the
    rest of the header after them; nothing else runs."""
    p = table_script("--bogus", "--help")
    assert p.returncode == 2  # the arguments are read in order: the unknown option first
    p = table_script("--help", "--bogus")
    assert p.returncode == 0, p.stderr
    assert p.stdout == (
        "A script with one option of each kind.\n"
        "\n"
        "Usage: t.sh --n N [options] [-- EXTRA...]\n"
        "\n"
        "  --n N            a whole number\n"
        "  --x X, --mode M  a number and a mode (one help for both)\n"
        "  --code LANG      a language code\n"
        "  --in FILE        a file\n"
        "  --dir DIR        a directory\n"
        "  --name S         anything\n"
        "  --on             a flag\n"
        "\n"
        "Repeatable:\n"
        "  --item V         one item (repeatable)\n"
        "  --pass V         handed on with the option\n"
        "  -- EXTRA...      the tool's arguments\n"
        "\n"
        "Prose after the options.\n")


def test_scripts_are_strict():
    """Every script stops on errors and prints its commands (lib.sh's run)."""
    scripts = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
    for name in sorted(os.listdir(scripts)):
        if name.endswith(".sh"):
            text = open(os.path.join(scripts, name)).read()
            assert "set -euo pipefail" in text, name


def _tiny_demo_config(tmp_path, extra=""):
    """The real demo configuration, shrunk to a corpus and a budget of seconds."""
    config = tmp_path / "demo_tiny.sh"
    config.write_text(
        f'. "{os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "demo.sh")}"\n'
        'DEMO_CORPUS_ARGS=(--seed 1 --train-size 200 --valid-size 16 --test-size 12)\n'
        'DEMO_BPE_ARGS=(--method sentencepiece --vocab-size 120)\n'
        'DEMO_TRAIN_ARGS=("${DEMO_TRAIN_ARGS[@]}" --save-interval-updates 2 --max-tokens 1024 --warmup-updates 2)\n'
        + extra
    )
    return config


@pytest.mark.timeout(900)  # the longest test: 225 s measured on 2 loaded cores, over the 300 s default's margin
def test_demo_runs_end_to_end_on_a_tiny_budget(tmp_path):
    """scripts/demo.sh with the real configuration, shrunk, and two seeds: corpus,
    segmentation, binarization, training (two runs at a time), averaging, decoding,
    scoring, the table of mean ± sd over the seeds with the paired test against the
    transformer, in configuration order; every seed's numbers kept; an older run in
    DEMO_DIR is replaced only at the end."""
    config = _tiny_demo_config(tmp_path)
    demo_dir = tmp_path / "demo"
    demo_dir.mkdir()
    (demo_dir / "old-run").write_text("previous results\n")
    p = p_demo = run_script("demo.sh", [], env={"DEMO_CONFIG": str(config), "DEMO_DIR": str(demo_dir),
                                                "DEMO_MAX_UPDATE": "4", "DEMO_ONLY": "enc-dc transformer",
                                                "DEMO_JOBS": "2", "DEMO_SEEDS": "2"})
    table = (demo_dir / "results.md").read_text()
    lines = table.splitlines()
    assert lines[0] == ("| system | arch | params | seeds | BLEU | reorder | gender | polysemy | long agreement | "
                        "attractor | train time (s) | Δ BLEU | p | vs transformer | seeds better / worse |")
    assert lines[2].startswith("| transformer | transformer | ") and lines[2].endswith("| baseline | - |")
    assert lines[3].startswith("| enc-dc | dc_transformer | ") and "| 2 | " in lines[3] and " ± " in lines[3]
    assert table in p.stdout
    assert "2 run(s) at a time" in p.stderr and "seed(s) 1 2" in p.stderr
    assert not (demo_dir / "old-run").exists() and not (tmp_path / "demo.partial").exists()
    result = json.loads((demo_dir / "results.json").read_text())
    assert [(e["system"], e["seeds_done"]) for e in result["systems"]] == [("transformer", [1, 2]), ("enc-dc", [1, 2])]
    assert result["systems"][1]["comparison"]["baseline"] == "transformer"
    assert result["systems"][1]["comparison"]["seeds_tested"] == 2
    for name in ("transformer", "enc-dc"):
        for seed in (1, 2):
            run = demo_dir / "systems" / name / f"seed{seed}"
            assert (run / "checkpoint_avg.pt").is_file()
            assert (run / "eval" / "phenomena.json").is_file()
            assert '| train | {"epoch": ' in (run / "train.log").read_text()
            assert f"| {name} | {seed} |" in table  # every seed's row below the table
    assert (demo_dir / "runs.tsv").read_text().splitlines()[1] == "transformer\t1\tsystems/transformer/seed1\ttransformer"

    # the analyses of the finished demo: the tools its systems allow, the others skipped;
    # efficiency and learning curves over both seeds
    p = run_script("analyze_demo.sh", ["--demo-dir", str(demo_dir)])
    out = demo_dir / "analysis"
    for png in ("bleu_breakdown/bleu_by_length.png", "bleu_breakdown/bleu_by_ngram.png",
                "efficiency/efficiency.png", "learning_curves/learning_curves.png",
                "divergence/divergence.png", "probing/probing.png"):
        assert (out / png).is_file(), png
    for tool in ("gates", "windows", "heatmaps"):
        assert f"skipping {tool}" in p.stderr and not (out / tool).exists()
    divergence = (out / "divergence" / "divergence.csv").read_text()
    assert "enc-dc" in divergence and "enc1" in divergence
    assert "systems/enc-dc/seed1/checkpoint_avg.pt" in p.stderr  # the checkpoint tools read the first seed
    curves = json.loads((out / "learning_curves" / "learning_curves.json").read_text())
    assert curves["enc-dc"]["runs"] == 2 and len(curves["enc-dc"]["per_run"]) == 2
    assert "| enc-dc | 2 |" in (out / "efficiency" / "efficiency.md").read_text()
    p = run_script("analyze_demo.sh", ["--demo-dir", str(demo_dir)], check=False)
    assert p.returncode == 2 and "--force" in p.stderr

    # the demo's page (report.html), written by demo.sh and again by analyze_demo.sh
    # with the paper's figures, in a browser
    assert f"fairseq-localness-report: wrote {demo_dir}/report.html" in p_demo.stderr
    if chromium_missing() is None:
        with Browser() as b:
            states = check_report_page(b, str(demo_dir), str(tmp_path / "page.png"))
            page = b.open(str(demo_dir / "report.html"))
            figures = page.eval("[...document.querySelectorAll('figure img')].map(i => i.getAttribute('src'))")
        assert states == {"transformer": ("done", None), "enc-dc": ("done", states["enc-dc"][1])}
        assert "analysis/divergence/divergence.png" in figures and "analysis/bleu_breakdown/bleu_by_length.png" in figures


def test_demo_failure_keeps_previous_results(tmp_path):
    """A system that fails to train stops the demo with its log's tail and a non-zero
    status; the previous results stay as they were."""
    config = _tiny_demo_config(
        tmp_path, 'DEMO_SYSTEMS=("broken|dc_transformer|--dc-kernel-size 0" "transformer|transformer|")\n')
    demo_dir = tmp_path / "demo"
    demo_dir.mkdir()
    (demo_dir / "results.md").write_text("previous results\n")
    p = run_script("demo.sh", [], check=False,
                   env={"DEMO_CONFIG": str(config), "DEMO_DIR": str(demo_dir), "DEMO_MAX_UPDATE": "2",
                        "DEMO_JOBS": "1", "DEMO_ONLY": "all"})
    assert p.returncode == 1
    assert "broken (seed 1) failed" in p.stderr and "dc-kernel-size" in p.stderr
    assert "transformer (transformer, seed 1) started" not in p.stderr  # stopped at the first failure
    assert (demo_dir / "results.md").read_text() == "previous results\n"


def test_analyze_demo_names_a_demo_of_the_earlier_layout(tmp_path):
    old = tmp_path / "demo"
    (old / "systems" / "transformer").mkdir(parents=True)
    (old / "results.tsv").write_text("system\tarch\tparams\tbleu\ttrain_seconds\tupdates\n")
    p = run_script("analyze_demo.sh", ["--demo-dir", str(old)], check=False)
    assert p.returncode == 2 and "earlier layout" in p.stderr and "run 'make demo' again" in p.stderr
    assert sorted(os.listdir(old)) == ["results.tsv", "systems"]
