"""scripts/reproduce/*.sh --table: the results table puts our numbers next to the
paper's once result files exist (BLEU, parameters, speed, significance), the paper's
BLEU as the main column; a dry run then skips the evaluated rows."""
import json
import os

import pytest

from reproduce_utils import REPRO, by_script, commands, dry_run, opt, reproduce

def _result(work, name, tok=None, sacre=None, params=None, ups=None, p=None, pbs=None):
    """The files a finished row leaves in ``work/runs/<name>``: BLEU, training log,
    significance (``p``: compare-mt, ``pbs``: paired bootstrap)."""
    row = work / "runs" / name
    (row / "eval").mkdir(parents=True)
    if tok is not None:
        (row / "eval" / "tok_bleu.json").write_text(json.dumps({"score": tok}))
    (row / "eval" / "bleu.json").write_text(json.dumps(
        {"score": sacre, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"}))
    (row / "train.log").write_text(
        f"2026 | INFO | fairseq_cli.train | num. shared model params: {params:,} (num. trained: {params:,})\n"
        f"2026 | INFO | train | epoch 001 | loss 4.1 | ups {ups} | num_updates 1000\n"
        f"2026 | INFO | train | epoch 002 | loss 3.9 | ups {ups + 0.2:.2f} | num_updates 2000\n")
    if p is not None:
        (row / "significance").mkdir()
        (row / "significance" / "significance.json").write_text(json.dumps(
            {"baseline": "transformer", "samples": 1000, "systems": {},
             "comparisons": [{"baseline": "transformer", "system": name, "p_value": p}]}))
    if pbs is not None:
        (row / "paired_bs").mkdir()
        (row / "paired_bs" / "paired_bs.json").write_text(json.dumps({"p_value": pbs, "samples": 1000}))


def _table(script, work):
    """``script --table`` over the results in ``work``; it succeeds."""
    p = reproduce(script, "--table", "--work-dir", work)
    assert p.returncode == 0, p.stderr
    return p


def test_table_puts_our_numbers_next_to_the_papers(tmp_path):
    work = tmp_path / "w"
    _result(work, "transformer", tok=28.0, sacre=27.1, params=60_524_544, ups=3.0)
    _result(work, "enc-dc", tok=29.40, sacre=28.3, params=73_128_960, ups=2.4, p=0.004)
    p = _table("dc_table1.sh", work)
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
    _result(result_dir, "iwslt.transformer", tok=31.0, sacre=30.0, params=11_878_400, ups=5.0)
    _result(result_dir, "iwslt.hysan_gated", tok=32.0, sacre=31.0, params=11_911_168, ups=4.0)
    p = _table("song2019_table2.sh", result_dir)
    assert "| iwslt.transformer | de-en | sacreBLEU | 31.27 | 30.00 | -1.27 | 31.00 | 11.9M | 11.88M |" in p.stdout
    assert "| iwslt.hysan_gated | de-en | sacreBLEU | 32.28 | 31.00 | -1.28 | 32.00 | +32K | +32,768 |" in p.stdout
    assert "extra column: multi-bleu (Moses-tok.)" in p.stdout
    # Xu et al.: a count that differs because our run shares the embeddings is marked;
    # the paper's significance test (Koehn's paired bootstrap)
    result_dir = tmp_path / "xu"
    _result(result_dir, "en-de.transformer", tok=27.5, sacre=27.0, params=60_524_544, ups=1.0)
    _result(result_dir, "en-de.hybrid_gate", tok=28.4, sacre=27.9, params=60_524_554, ups=1.0, pbs=0.002)
    p = _table("xu2019_table2.sh", result_dir)
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
