"""scripts/reproduce/*.sh: real runs against stand-ins for the pipeline steps.

A run checks that every dataset can be prepared, then executes what its dry run
printed, in order, and resumes; a dataset that cannot be prepared stops it before
any work. With --seeds, every row is trained once per seed in its own run directory,
and the table (fairseq-localness-results) shows the mean ± sd over the seeds and the
paired test on the pooled seeds; bad --seeds stop before any command.
"""
import json
import os
import shlex

import pytest

from conftest import fairseq_import_stub
from reproduce_utils import by_script, commands, dry_run, opt, reproduce

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


def test_a_run_stopped_by_a_failing_step_leaves_its_table_and_page(tmp_path):
    """A training that fails stops the run with its status, and the run leaves the table
    and the page so far (report.html): the finished row done, the failed one with its
    log's last line."""
    work = tmp_path / "w"
    failing = dict(STUBS, **{"train.sh": STUBS["train.sh"] + '; if [[ $(arg --arch) == dc_* ]]; then '
                             'echo "RuntimeError: CUDA out of memory" >> "$dir/train.log"; exit 3; fi'})
    env = _stub_steps(tmp_path, failing)
    p = reproduce("dc_table1.sh", "--only", "transformer enc-dc", "--work-dir", work, "--data-dir",
                  tmp_path / "data", env=env)
    assert p.returncode == 3, p.stderr
    assert f"fairseq-localness-report: wrote {work}/report.html" in p.stderr
    result = json.loads((work / "results.json").read_text())
    assert [(e["system"], e["seeds_done"]) for e in result["systems"]][:2] == [("transformer", [1]), ("enc-dc", [])]
    html = (work / "report.html").read_text()
    row = html[html.index('<tr id="row-enc-dc"'):]
    assert 'data-state="failed"' in row[:row.index("</tr>")]
    assert "its log ends: <code>RuntimeError: CUDA out of memory</code>" in html
    run = json.loads((work / "run.json").read_text())
    assert run["command"].endswith(f"dc_table1.sh --only transformer\\ enc-dc --work-dir {work} --data-dir "
                                   f"{tmp_path / 'data'}") and run["hardware"].startswith("1 GPU(s) per run; ")


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
