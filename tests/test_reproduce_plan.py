"""scripts/reproduce/plan.py: what the reproduce driver (scripts/reproduce/common.sh)
computes and formats, tested as functions (the drivers' dry runs:
test_reproduce_dry_run.py)."""
import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

REPRO = os.path.join(REPO, "scripts", "reproduce")
_spec = importlib.util.spec_from_file_location("reproduce_plan", os.path.join(REPRO, "plan.py"))
plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plan)

ROWS = [
    "en-de.transformer|xu2019_wmt14_base|--arch transformer_wmt_en_de|27.67||88.0M|",
    "en-de.local_s|xu2019_wmt14_base|--hybrid-variant local_s  --hybrid-encoder-layers 1-3|28.11|en-de.transformer|+0.8M|",
    "vi-en.dc|dc_iwslt:vi-en||-|en-de.transformer||3.0",
]


def test_rows_are_split_as_the_driver_reads_them():
    rows = plan.parse_rows(ROWS)
    assert [r["name"] for r in rows] == ["en-de.transformer", "en-de.local_s", "vi-en.dc"]
    assert rows[0]["arch"] == "transformer_wmt_en_de" and rows[0]["extra"] == []
    assert rows[1]["arch"] == "" and rows[1]["extra"] == ["--hybrid-variant", "local_s", "--hybrid-encoder-layers", "1-3"]
    assert (rows[1]["bleu"], rows[1]["base"], rows[1]["params"], rows[1]["speed"]) == ("28.11", "en-de.transformer",
                                                                                         "+0.8M", "")
    assert (rows[2]["config"], rows[2]["pair"], rows[2]["bleu"], rows[2]["speed"]) == ("dc_iwslt", "vi-en", "-", "3.0")
    assert rows[0]["pair"] == ""


def test_bash_read_splits_as_bash_does():
    # `IFS='|' read -r a b c`: missing values empty, the rest of the line (with its '|')
    # in the last one, less a single trailing '|' after its only field
    assert plan.bash_read("a|b", 3) == ["a", "b", ""]
    assert plan.bash_read("a|b|c|d|e", 3) == ["a", "b", "c|d|e"]
    assert plan.bash_read("a|b|c|", 3) == ["a", "b", "c"]
    assert plan.bash_read("a|b|c||", 3) == ["a", "b", "c||"]
    assert plan.bash_read("a|b||", 3) == ["a", "b", ""]
    script = 'IFS="|" read -r a b c <<< "$1"; printf "%s\\n" "$a" "$b" "$c"'
    for line in ("a|b", "a|b|c|d|e", "a|b|c|", "a|b|c||", "a|b||", "|", "a| b |c |"):
        out = subprocess.run(["bash", "-c", script, "-", line], capture_output=True, text=True, check=True).stdout
        assert out.split("\n")[:3] == plan.bash_read(line, 3), line


@pytest.mark.parametrize("rows, message", [
    ([], "TABLE_ROWS is empty"),
    (["a|c|x|1|||"  + "|8"], "row 'a|c|x|1||||8': expected 7 fields"),
    (["a b|c||1|||"], "row 'a b|c||1|||': name 'a b': expected letters, digits, _ . + -"),
    (["a|c||1|||", "a|c||2|||"], "row name 'a' appears twice"),
    (["a|c||1.2.3|||"], "row 'a': paper BLEU: expected a number, got '1.2.3'"),
    (["a|c||x|||"], "row 'a': paper BLEU: expected a number, got 'x'"),
    (["a|c||1|b||", "b|c||1|||"], "row 'a': baseline 'b' is not an earlier row"),
    (["a|c|--arch|1|||"], "row 'a': '--arch' needs an architecture name"),
    (["a|c|--arch t --lr 1 --seed 2|1|||"], "row 'a' (extra args): '--seed' is set by the reproduce driver"),
])
def test_bad_rows_are_refused_with_the_drivers_message(rows, message):
    with pytest.raises(plan.RowError) as e:
        plan.parse_rows(rows)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("bleu", ["27", "27.5", "-1.5", ".5", "1e3", "2.E-1", "-"])
def test_paper_bleu_takes_what_require_float_takes(bleu):
    assert plan.parse_rows([f"a|c||{bleu}|||"])[0]["bleu"] == bleu


def test_only_selects_in_the_tables_order_and_names_the_rows_on_a_typo():
    rows = plan.parse_rows(ROWS)
    assert plan.select(rows, "", "T: x") == [0, 1, 2]
    assert plan.select(rows, "vi-en.dc  en-de.transformer", "T: x") == [0, 2]
    with pytest.raises(plan.RowError, match=r"^--only: no row 'nope' in Xu, Table 1; expected some of: "
                                            r"en-de.transformer en-de.local_s vi-en.dc$"):
        plan.select(rows, "en-de.local_s nope", "Xu, Table 1: WMT14")


def test_the_rows_command_prints_one_separated_line_per_row_and_fails_with_status_2():
    script = os.path.join(REPRO, "plan.py")
    p = subprocess.run([sys.executable, script, "--prog", "t.sh", "rows", "--title", "T", "--only", "en-de.local_s"],
                       input="\n".join(ROWS) + "\n", capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    lines = [line.split("\x1f") for line in p.stdout.splitlines()]
    assert [len(f) for f in lines] == [10, 10, 10]
    assert lines[0] == ["en-de.transformer", "xu2019_wmt14_base", "", "transformer_wmt_en_de", "", "27.67", "",
                        "88.0M", "", "0"]
    assert lines[1][4] == "--hybrid-variant local_s --hybrid-encoder-layers 1-3" and lines[1][9] == "1"
    p = subprocess.run([sys.executable, script, "--prog", "t.sh", "rows", "--title", "T", "--only", "x"],
                       input="\n".join(ROWS) + "\n", capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("t.sh: error: --only: no row 'x' in T; expected some of: en-de.transformer ")


def test_list_lines_align_the_columns():
    lines = plan.list_lines(ROWS[:1] + ["short|cfg"], "Xu, Table 1")
    assert lines[0] == "Rows of Xu, Table 1:"
    assert lines[1] == "  " + "en-de.transformer".ljust(34) + " " + "xu2019_wmt14_base".ljust(32) \
        + " paper BLEU 27.67  --arch transformer_wmt_en_de"
    assert lines[2] == "  " + "short".ljust(34) + " " + "cfg".ljust(32) + " paper BLEU " + " " * 6 + " "


DATASETS = ["iwslt14_de_en", "wmt14_en_de"]


def options(*argv, paper_test="none"):
    return plan.parse_options(list(argv), DATASETS, "t.sh", paper_test)


def test_options_defaults_and_values():
    v = options()
    assert {k: v[k] for k in ("DRY_RUN", "GPUS", "SEED", "TRAINING_CHOICE", "SIGNIFICANCE", "WORK")} == dict(
        DRY_RUN="0", GPUS="1", SEED="1", TRAINING_CHOICE="paper", SIGNIFICANCE="paper", WORK="")
    assert v["SEEDS"] == [1] and v["RAW_DIRS"] == {} and v["RUN_TESTS"] == ""
    v = options("--dry-run", "--gpus", "04", "--seed", "007", "--max-tokens", "0100", "--raw-dir", "/r",
                "--raw-dir", "wmt14_en_de=/w=x", "--work-dir", "--cpu")
    assert (v["DRY_RUN"], v["GPUS"], v["SEED"], v["SEEDS"]) == ("1", "4", "7", [7])
    assert v["MAX_TOKENS"] == "0100"  # (passed on as given, like the shell did)
    assert v["RAW_ROOT"] == "/r" and v["RAW_DIRS"] == {"wmt14_en_de": "/w=x"} and v["WORK"] == "--cpu"
    assert options("--seeds", "3")["SEEDS"] == [1, 2, 3]
    v = options("--seeds", "05,1,7")
    assert v["SEEDS"] == [5, 1, 7] and v["SEED"] == "5"
    assert options("--raw-dir", "Some=dir")["RAW_ROOT"] == "Some=dir"  # not a dataset name: the root


def test_help_wins_unless_an_error_comes_first():
    assert options("--gpus", "0", "--help") == {"HELP": "1"}
    with pytest.raises(plan.RowError, match="unknown option '--x' \\(see 't.sh --help'\\)"):
        options("--x", "-h")


@pytest.mark.parametrize("argv, message", [
    (["--gpus"], "option --gpus needs a value"),
    (["--dry-run", "--table"], "--dry-run and --table: expected one of them, not both"),
    (["--gpus", "0"], "--gpus: expected a whole number >= 1, got '0'"),
    (["--seed", "-1"], "--seed: expected a whole number >= 0, got '-1'"),
    (["--seed", "1", "--seeds", "2"], "--seed and --seeds: expected one of them, not both"),
    (["--seeds", "1,2,01"], "--seeds: '1,2,01' names a seed twice"),
    (["--seeds", "0"], "--seeds: expected a whole number >= 1, got '0' (a number of seeds N"),
    (["--seeds", "1;2"], "--seeds: expected a number of seeds (e.g. 3: seeds 1,2,3)"),
    (["--max-tokens", "0"], "--max-tokens: expected a whole number >= 1, got '0'"),
    (["--precision", "fp8"], "--precision: expected one of: auto fp32 fp16 bf16; got 'fp8'"),
    (["--variant", "a b"], "--variant: expected a variant name, got 'a b'"),
    (["--bleu", "chrf"], "--bleu: expected one of: nist sacrebleu multi-bleu tok-compound; got 'chrf'"),
    (["--training", "x"], "--training: expected one of: paper fixed early-stop; got 'x'"),
    (["--patience", "0"], "--patience: expected a whole number >= 1, got '0'"),
    (["--significance", "t"], "--significance: expected one of: paper paired-bs compare-mt both none; got 't'"),
    (["--cpu", "--gpus", "2"], "--cpu and --gpus 2: expected one of them, not both"),
    (["--raw-dir", "wmt15_en_de=/x"], "--raw-dir DATASET=DIR: dataset: expected one of: iwslt14_de_en wmt14_en_de; "
                                      "got 'wmt15_en_de'"),
    (["--raw-dir", "wmt14_en_de="], "--raw-dir wmt14_en_de=: expected a directory after '='"),
    # the first error in the shell's order is the one reported
    (["--patience", "0", "--gpus", "0"], "--gpus: expected"),
    (["--bleu", "x", "--precision", "y"], "--precision: expected"),
])
def test_bad_options_name_the_option_and_what_it_takes(argv, message):
    with pytest.raises(plan.RowError) as e:
        options(*argv)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("significance, paper, tests", [
    ("paper", "none", ""), ("paper", "paired-bs", "paired-bs"), ("paper", "compare-mt", "compare-mt"),
    ("paper", "1", "compare-mt"), ("paper", "0", ""), ("both", "none", "paired-bs compare-mt"),
    ("none", "paired-bs", ""), ("compare-mt", "paired-bs", "compare-mt"),
])
def test_the_tests_to_run(significance, paper, tests):
    assert plan.run_tests(significance, paper) == tests
    assert options("--significance", significance, paper_test=paper)["RUN_TESTS"] == tests


def test_the_options_command_prints_assignments_bash_reads_back():
    script = os.path.join(REPRO, "plan.py")
    cmd = [sys.executable, script, "--prog", "t.sh", "options", "--datasets", " ".join(DATASETS), "--",
           "--only", "a 'b' $c", "--raw-dir", "wmt14_en_de=/d i r", "--seeds", "2", "--help-me"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr == "t.sh: error: unknown option '--help-me' (see 't.sh --help')\n"
    p = subprocess.run(cmd[:-1], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    shell = 'declare -A RAW_DIRS=(); eval "$1"; printf "%s|" "$ONLY" "${RAW_DIRS[wmt14_en_de]}" "${SEEDS[@]}" "$GPUS"'
    out = subprocess.run(["bash", "-c", shell, "-", p.stdout], capture_output=True, text=True, check=True).stdout
    assert out == "a 'b' $c|/d i r|1|2|1|"


CONFIG = {"DESCRIPTION": ["d"], "PAIRS": ["wmt14_en_de|en|de|32000|nist+multi-bleu"], "BPE": ["subword-nmt"],
          "ARCH": ["a"], "MODEL_ARGS": ["--share-all-embeddings"], "METHOD_ARGS": [],
          "TRAIN_ARGS": ["--max-tokens", "4096", "--save-interval-updates", "1000", "--keep-interval-updates", "5",
                         "--max-tokens", "2048"],
          "MAX_UPDATE": ["100000"], "EFFECTIVE_TOKENS": ["25000"], "AVERAGE_LAST": ["5"], "BEAM": ["4"],
          "LENPEN": ["0.6"], "GENERATE_ARGS": [], "PAPER_BLEU": ["tokenized"], "BPE_JOINT": ["yes"],
          "TRAINING": ["fixed"], "PATIENCE": ["10"], "PAPER_EMBEDDINGS": ["shared"]}


def check(**change):
    return plan.check_config({**CONFIG, **change}, "c.sh", DATASETS)


def test_a_configuration_gives_its_batch_and_checkpoint_interval():
    assert check() == {"CFG_MAX_TOKENS": "2048", "CFG_SAVE_INTERVAL": "1000",  # (the last --max-tokens)
                       "CFG_EVAL_BLEU_ARGS": '{"beam": 4, "lenpen": 0.6}'}


def test_eval_bleu_args_carry_the_papers_decoding_as_written():
    assert plan.eval_bleu_args("5", "1.", ["--max-len-a", "1.2", "--nbest", "1", "--max-len-b", "10"]) == \
        '{"beam": 5, "lenpen": 1., "max_len_a": 1.2, "max_len_b": 10}'
    assert json.loads(plan.eval_bleu_args("4", "0.6", ["--max-len-b", "50"])) == \
        {"beam": 4, "lenpen": 0.6, "max_len_b": 50}


@pytest.mark.parametrize("change, message", [
    (dict(BPE=["bpe"]), "c.sh: BPE: expected one of: subword-nmt sentencepiece; got 'bpe'"),
    (dict(BPE_JOINT=["1"]), "c.sh: BPE_JOINT: expected one of: yes no; got '1'"),
    (dict(TRAINING=["x"]), "c.sh: TRAINING: expected one of: fixed early-stop; got 'x'"),
    (dict(PAPER_EMBEDDINGS=["x"]), "c.sh: PAPER_EMBEDDINGS: expected one of: shared separate; got 'x'"),
    (dict(ARCH=[""]), "configuration c.sh: ARCH is empty"),
    (dict(PAPER_BLEU=[]), "configuration c.sh: PAPER_BLEU is empty"),
    (dict(MAX_UPDATE=["1e5"]), "c.sh: MAX_UPDATE: expected a whole number >= 1, got '1e5'"),
    (dict(PATIENCE=["0"]), "c.sh: PATIENCE: expected a whole number >= 1, got '0'"),
    (dict(LENPEN=["x"]), "c.sh: LENPEN: expected a number, got 'x'"),
    (dict(PAIRS=[]), "configuration c.sh: PAIRS is empty; expected entries 'dataset|src|tgt|bpe size|bleu kind"),
    (dict(PAIRS=["wmt15|en|de|1|nist"]), "c.sh: PAIRS entry 'wmt15|en|de|1|nist': dataset: expected one of: "
                                         "iwslt14_de_en wmt14_en_de; got 'wmt15'"),
    (dict(PAIRS=["wmt14_en_de|e-n|de|1|nist"]), "c.sh: PAIRS entry 'wmt14_en_de|e-n|de|1|nist': source language: "
                                                "expected a language code (letters, digits, '_'), got 'e-n'"),
    (dict(PAIRS=["wmt14_en_de|en||1|nist"]), "c.sh: PAIRS entry 'wmt14_en_de|en||1|nist': target language"),
    (dict(PAIRS=["wmt14_en_de|en|de|0|nist"]), "c.sh: PAIRS entry 'wmt14_en_de|en|de|0|nist': bpe size: expected"),
    (dict(PAIRS=["wmt14_en_de|en|de|1|bleu"]), "c.sh: PAIRS entry 'wmt14_en_de|en|de|1|bleu': bleu kind: expected "
                                               "one of: nist sacrebleu multi-bleu tok-compound; got 'bleu'"),
    (dict(PAIRS=["wmt14_en_de|en|de|1|nist+chrf"]), "c.sh: PAIRS entry 'wmt14_en_de|en|de|1|nist+chrf': extra bleu "
                                                    "kind: expected one of: nist sacrebleu multi-bleu tok-compound"),
    (dict(PAIRS=["wmt14_en_de|en|de|1|nist", "iwslt14_de_en|en|de|1|nist"]),
     "configuration c.sh: PAIRS lists the direction en-de twice"),
    (dict(METHOD_ARGS=["--x", "--patience", "3"]), "c.sh: METHOD_ARGS: '--patience' is set by the reproduce driver"),
    (dict(TRAIN_ARGS=["--save-interval-updates", "1"]), "configuration c.sh: TRAIN_ARGS has no --max-tokens"),
    (dict(TRAIN_ARGS=["--max-tokens", "0", "--save-interval-updates", "1"]),
     "c.sh: --max-tokens in TRAIN_ARGS: expected a whole number >= 1, got '0'"),
    (dict(TRAIN_ARGS=["--max-tokens", "1"]), "configuration c.sh: TRAIN_ARGS has no --save-interval-updates"),
    (dict(TRAIN_ARGS=["--max-tokens", "1", "--save-interval-updates", "1", "--keep-interval-updates", "4"]),
     "c.sh: --keep-interval-updates in TRAIN_ARGS: expected a whole number >= 5, got '4'"),
    (dict(TRAIN_ARGS=["--max-tokens", "1", "--save-interval-updates", "1"]),
     "c.sh: --keep-interval-updates in TRAIN_ARGS: expected a whole number >= 5, got '0'"),
])
def test_bad_configurations_name_the_file_and_the_value(change, message):
    with pytest.raises(plan.RowError) as e:
        check(**change)
    assert str(e.value).startswith(message)


def test_the_config_command_reads_what_config_values_writes(tmp_path):
    cfg = tmp_path / "c.sh"
    lines = ["DESCRIPTION='a \"b\" c'", "PAIRS=('wmt14_en_de|en|de|8|nist')", "BPE=subword-nmt", "ARCH=a",
             "MODEL_ARGS=()", "METHOD_ARGS=(--x 'y z')", "TRAIN_ARGS=(--max-tokens 64 --save-interval-updates 2 "
             "--keep-interval-updates 1)", "MAX_UPDATE=3", "EFFECTIVE_TOKENS=64", "AVERAGE_LAST=1", "BEAM=1",
             "LENPEN=1", "GENERATE_ARGS=()", "PAPER_BLEU=x"]
    cfg.write_text("\n".join(lines) + "\n")
    shell = (f'. {REPRO}/config.sh; config_defaults; . "$1"; config_values | "$2" {REPRO}/plan.py --prog t.sh '
             f'config --file "$1" --datasets "{" ".join(DATASETS)}"')
    p = subprocess.run(["bash", "-c", shell, "-", str(cfg), sys.executable], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["CFG_MAX_TOKENS=64", "CFG_SAVE_INTERVAL=2"]
    assert p.stdout.split("\n")[2] == """CFG_EVAL_BLEU_ARGS='{"beam": 1, "lenpen": 1}'"""
    cfg.write_text("\n".join(lines).replace("BEAM=1", "BEAM=(0 1)") + "\n")
    p = subprocess.run(["bash", "-c", shell, "-", str(cfg), sys.executable], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr == f"t.sh: error: {cfg}: BEAM: expected a whole number >= 1, got '0'\n"
    values = plan.read_values("A\x001\x00x y\x00B\x000\x00C\x002\x00--p\x00\x00")
    assert values == {"A": ["x y"], "B": [], "C": ["--p", ""]}


def test_the_help_names_every_option_plan_py_reads():
    with open(os.path.join(REPRO, "options.txt"), encoding="utf-8") as f:
        helped = set(re.findall(r"^  (--[a-z-]+)", f.read(), re.M))
    assert helped == set(plan.FLAGS) | set(plan.VALUES)


@pytest.mark.parametrize("value, seconds", [("90", 5400), ("2:30", 150), ("1:02:03", 3723), ("1-2", 93600),
                                            ("1-2:03", 93780), ("1-2:03:04", 93784)])
def test_slurm_times_read_every_format_of_sbatch(value, seconds):
    from fairseq_localness.slurm import times

    assert times.time_seconds(value) == seconds
    assert times.time_minutes(value, 60) == -(-seconds // 60)


@pytest.mark.parametrize("value, message", [
    ("soon", "--time: expected a SLURM time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS; got 'soon'"),
    ("1:-5", "--time: expected a SLURM time"),
    ("1:29", "--time 1:29: too short for one validation: a job is told to save and requeue --signal-delay 60 s "
             "before its limit; expected at least 90 s (2 min)"),
])
def test_the_driver_and_the_slurm_job_refuse_a_time_alike(value, message):
    """The driver's --slurm options (plan.py, which loads the SLURM job's parser from its
    file without importing the package) and `python -m fairseq_localness.slurm`'s
    check give the same message."""
    from fairseq_localness.slurm import UsageError, submit

    with pytest.raises(plan.RowError) as driver_error:
        plan.check_slurm(dict(plan.OPTION_DEFAULTS, SLURM="1", S_TIME=value, S_SIGNAL_DELAY="60"), {"--time"}, [])
    assert str(driver_error.value).startswith(message)
    args = type("Args", (), dict(time=value, signal_delay=60, slurm_arg=[]))()
    with pytest.raises(UsageError) as job_error:
        submit.check(args)
    assert str(job_error.value) == str(driver_error.value)


def test_plan_py_reads_the_time_without_importing_fairseq():
    code = (f"import importlib.util, sys; s = importlib.util.spec_from_file_location('p', {plan.__file__!r}); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(m.slurm_times().time_minutes('1-0', 60), 'fairseq' in sys.modules, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1440", "False", "False"]
