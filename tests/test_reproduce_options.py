"""scripts/reproduce/*.sh: the drivers' options and inputs.

`--only` selects rows and the hardware options reach every train command; each
dataset has its own download directory; the choices where a paper is silent are
selectable; bad options, table rows (scripts/reproduce/common.sh's TABLE_ROWS) and
configurations (configs/papers/*.sh) stop with exit status 2 and a message before
any command.
"""
import os
import shlex
import shutil
import subprocess

import pytest

from conftest import REPO, tool_env
from reproduce_utils import REPRO, by_script, commands, dry_run, opt, reproduce

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


def test_architectures_that_are_not_registered_stop_a_real_run_naming_them(tmp_path):
    """Before a real run (not --dry-run) the rows' architectures are checked at once
    (``fairseq-localness-train-check arch``): the unregistered ones are named, sorted and
    once each, and nothing is run or written."""
    rows = [GOOD, "b|dc_wmt14_base|--arch transformer_nope|28.0|||", "c|dc_wmt14_base|--arch dc_nope|28.0|||",
            "d|dc_wmt14_base|--arch transformer_nope|28.0|||"]
    p = _run_table(_table_script(tmp_path, rows), "--work-dir", tmp_path / "w")
    assert p.returncode == 2, p.stderr
    assert "architecture(s) not registered with fairseq: dc_nope transformer_nope (see the ARCH" in p.stderr
    assert commands(p.stdout) == [] and not (tmp_path / "w").exists()


def test_the_architecture_check_takes_several_and_names_the_unregistered_ones(capsys):
    """``fairseq-localness-train-check arch ARCH...``: status 0 where every one is
    registered; else status 1, the unregistered ones (sorted, once each) on the first
    line and the expected architectures on the second."""
    from fairseq_localness.cli.train_check import cli_main

    cli_main(["arch", "--", "transformer", "hysan_transformer"])
    assert capsys.readouterr().out == ""
    with pytest.raises(SystemExit) as stop:
        cli_main(["arch", "--", "zz_nope", "transformer", "aa_nope", "zz_nope"])
    assert stop.value.code == 1
    first, second = capsys.readouterr().out.splitlines()
    assert first == "aa_nope zz_nope"
    assert second.startswith("fairseq_localness architectures: ") and "hysan_transformer" in second
