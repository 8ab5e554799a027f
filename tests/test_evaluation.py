"""Checkpoint averaging, evaluation (sacrebleu, tokenized BLEU with compound splitting,
BLEU by length and n-gram order) and paired bootstrap significance (compare-mt), end
to end on one tiny trained model; bad inputs rejected with exit status 2."""
import json
import os
import re
import subprocess
import sys

import pytest

from conftest import SCRIPTS, run_fairseq, run_script, train_command


def commands(stderr):
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def evaluated(tiny_data_bin, tmp_path_factory):
    """Train 3 updates (a checkpoint per update; fairseq-train directly, train.sh is
    tested elsewhere), average the last 2, evaluate with every option."""
    base = tmp_path_factory.mktemp("evaluation")
    ckpts, out = base / "ckpts", base / "eval"
    lang = ["--src", tiny_data_bin.src, "--tgt", tiny_data_bin.tgt]
    run_fairseq("fairseq-train", train_command("transformer", tiny_data_bin, str(ckpts), max_update=3, extra_args=[
        "--cpu", "--save-interval-updates", "1", "--no-epoch-checkpoints"]))
    # the warnings a user sees: Python's defaults (conftest's tool_env hides them all)
    shown = {"PYTHONWARNINGS": ""}
    avg = run_script("average.sh", ["--save-dir", ckpts, "--last", "2", "--by", "update"], env=shown)
    ev = run_script("evaluate.sh", [
        "--data-bin", tiny_data_bin.data_bin, "--checkpoint", ckpts / "checkpoint_avg_last2.pt", *lang,
        "--ref", os.path.join(tiny_data_bin.raw_dir, "test.tgt"), "--beam", "2", "--lenpen", "0.6",
        "--out", out, "--tok-bleu", "--compound-split", "--tok-lang", "de",
        "--breakdown", os.path.join(tiny_data_bin.bpe_dir, "test.src"), "--breakdown-buckets", "8,12",
        "--", "--max-len-a", "1.2", "--max-len-b", "5"], env=shown)
    return {"base": base, "ckpts": ckpts, "out": out, "average": avg, "evaluate": ev,
            "ref": os.path.join(tiny_data_bin.raw_dir, "test.tgt")}


def test_average_then_evaluate_writes_every_score(evaluated, tiny_data_bin):
    assert "checkpoint_1_3.pt" in evaluated["average"].stdout and "checkpoint_1_2.pt" in evaluated["average"].stdout
    out = evaluated["out"]
    n = len(tiny_data_bin.lines("test", "tgt"))

    bleu = json.loads((out / "bleu.json").read_text())
    assert bleu["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert isinstance(bleu["score"], float)

    tok = json.loads((out / "tok_bleu.json").read_text())
    assert tok["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none|smooth:exp|version:")
    assert tok["compound_split"] is True and tok["tokenizer"].startswith("moses -l de")
    assert len(read_lines(out / "hyp.tok_bleu")) == n and len(read_lines(out / "ref.tok_bleu")) == n
    cmds = commands(evaluated["evaluate"].stderr)
    assert any("tok_bleu.py" in c and "--compound-split" in c and "--lang de" in c for c in cmds)
    assert "tokenized BLEU = " in evaluated["evaluate"].stdout

    # The same number by hand: Moses tokenization, the compound-splitting regex, sacrebleu on tokens.
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesTokenizer

    mt = MosesTokenizer(lang="de")

    def by_hand(lines):
        return [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", mt.tokenize(x, escape=False, return_str=True))
                for x in lines]

    hyps, refs = by_hand(read_lines(out / "hyp.detok")), by_hand(read_lines(evaluated["ref"]))
    assert read_lines(out / "hyp.tok_bleu") == hyps and read_lines(out / "ref.tok_bleu") == refs
    assert tok["score"] == pytest.approx(BLEU(tokenize="none").corpus_score(hyps, [refs]).score, abs=1e-9)

    bd = json.loads((out / "breakdown" / "bleu_breakdown.json").read_text())
    assert bd["buckets"] == [8, 12] and bd["baseline"] == "checkpoint_avg_last2"
    assert sum(r["sentences"] for r in bd["by_length"]) == n
    assert [r["n"] for r in bd["by_ngram"]] == [1, 2, 3, 4]
    assert bd["overall"]["checkpoint_avg_last2"]["bleu"] == pytest.approx(bleu["score"], abs=0.05)
    for name in ("bleu_by_length.csv", "bleu_by_ngram.csv", "bleu_by_length.png", "bleu_by_ngram.png"):
        assert (out / "breakdown" / name).is_file(), name
    assert not [p for p in os.listdir(out) if ".tmp." in p]


def test_averaging_and_evaluation_print_no_line_a_user_cannot_act_on(evaluated):
    """No DEBUG line (fairseq's import sets the root logger to DEBUG before
    fairseq-generate configures its own: hydra's ``Setting JobRuntime:``), no
    ``pin_memory`` warning from fairseq-generate's data loader on the CPU."""
    for step in ("average", "evaluate"):
        log = evaluated[step].stdout + evaluated[step].stderr
        assert "Setting JobRuntime" not in log, step
        assert not [line for line in log.splitlines() if line.startswith("DEBUG:")], (step, log[-3000:])
        assert "'pin_memory' argument is set as true" not in log, step


# Hand-tokenized: Moses splits punctuation and quotes, keeps hyphenated words; compound
# splitting then separates every hyphen between two non-spaces, left to right.
KNOWN_REF = ['Das Know-how ist gut, sagte er.', 'Der E-Mail-Verkehr war "schnell".', 'Sie kamen um 8 Uhr an.']
KNOWN_HYP = ['Das Know-how ist gut, sagt er.', 'Der E-Mail-Verkehr ist "schnell".', 'Sie kam um 8 Uhr.']
KNOWN_REF_TOK = ['Das Know ##AT##-##AT## how ist gut , sagte er .',
                 'Der E ##AT##-##AT## Mail ##AT##-##AT## Verkehr war " schnell " .',
                 'Sie kamen um 8 Uhr an .']
KNOWN_HYP_TOK = ['Das Know ##AT##-##AT## how ist gut , sagt er .',
                 'Der E ##AT##-##AT## Mail ##AT##-##AT## Verkehr ist " schnell " .',
                 'Sie kam um 8 Uhr .']


@pytest.mark.parametrize("split", [True, False])
def test_tokenized_bleu_of_a_known_example(tmp_path, split):
    ref, hyp = tmp_path / "ref", tmp_path / "hyp"
    ref.write_text("".join(x + "\n" for x in KNOWN_REF))
    hyp.write_text("".join(x + "\n" for x in KNOWN_HYP))
    args = [sys.executable, os.path.join(SCRIPTS, "tok_bleu.py"), "--ref", ref, "--hyp", hyp, "--lang", "de",
            "--tokenized-dir", tmp_path, "--output", tmp_path / "tok.json"] + (["--compound-split"] if split else [])
    subprocess.run([str(a) for a in args], check=True, capture_output=True)
    result = json.loads((tmp_path / "tok.json").read_text())

    from sacrebleu.metrics import BLEU

    def unsplit(line):
        return line.replace(" ##AT##-##AT## ", "-")

    hyps = KNOWN_HYP_TOK if split else [unsplit(x) for x in KNOWN_HYP_TOK]
    refs = KNOWN_REF_TOK if split else [unsplit(x) for x in KNOWN_REF_TOK]
    assert read_lines(tmp_path / "hyp.tok_bleu") == hyps and read_lines(tmp_path / "ref.tok_bleu") == refs
    expected = BLEU(tokenize="none").corpus_score(hyps, [refs]).score
    assert result["score"] == pytest.approx(expected, abs=1e-9)
    assert result["compound_split"] is split and result["tok"] == "none"
    # splitting compounds adds matching tokens: a higher score here
    split_score = BLEU(tokenize="none").corpus_score(KNOWN_HYP_TOK, [KNOWN_REF_TOK]).score
    unsplit_score = BLEU(tokenize="none").corpus_score([unsplit(x) for x in KNOWN_HYP_TOK],
                                                       [[unsplit(x) for x in KNOWN_REF_TOK]]).score
    assert split_score > unsplit_score


def test_significance_between_two_systems(evaluated, tmp_path):
    """The model's translations against a much better system (the reference with a word
    dropped from every third sentence): the better one wins (nearly) every sample."""
    ref = evaluated["ref"]
    better = tmp_path / "better.txt"
    better.write_text("".join(" ".join(line.split()[:-1] if i % 3 == 0 else line.split()) + "\n"
                              for i, line in enumerate(read_lines(ref))))
    model = evaluated["out"] / "hyp.detok"
    out = tmp_path / "sig"
    out.mkdir()  # an earlier result there is replaced
    (out / "significance.json").write_text('{"samples": 1}\n')
    (out / "stale.txt").write_text("from the earlier run\n")
    p = run_script("significance.sh", ["--ref", ref, "--baseline", f"model={model}", "--system", f"better={better}",
                                       "--samples", "200", "--seed", "3", "--out", out])
    assert any("compare_mt_bootstrap.py" in c and "--samples 200" in c for c in commands(p.stderr))
    assert "compare-mt " in p.stderr and "bootstrap=200,prob_thresh=0.05" in p.stderr
    res = json.loads((out / "significance.json").read_text())
    assert res["baseline"] == "model" and res["samples"] == 200 and res["seed"] == 3
    assert set(res["systems"]) == {"model", "better"}
    assert res["systems"]["better"]["bleu"] > res["systems"]["model"]["bleu"]
    (c,) = res["comparisons"]
    assert (c["baseline"], c["system"]) == ("model", "better")
    assert c["win"] > 0.9 and c["loss"] < 0.05
    assert c["win"] + c["tie"] + c["loss"] == pytest.approx(1.0)
    assert c["better"] == "better" and c["compare_mt_verdict"] == "s2>s1" and c["p_value"] < 0.05
    # compare-mt's BLEU on 13a tokens is sacrebleu's BLEU
    from sacrebleu.metrics import BLEU

    assert res["systems"]["better"]["bleu"] == pytest.approx(
        BLEU().corpus_score(read_lines(better), [read_lines(ref)]).score, abs=1e-6)
    assert (out / "index.html").is_file() and (out / "compare_mt.txt").is_file()
    assert "Aggregate Scores" in (out / "compare_mt.txt").read_text()
    assert not (out / "stale.txt").exists()
    assert not [x for x in os.listdir(tmp_path) if ".tmp." in x]


# --------------------------------------------------------------------------- bad inputs
@pytest.fixture(scope="module")
def bad_env(tiny_data_bin, tmp_path_factory):
    base = tmp_path_factory.mktemp("bad_eval")
    short = base / "short.txt"
    short.write_text("one line\n")
    other = base / "other_dir"
    other.mkdir()
    (other / "keep.txt").write_text("not a significance result\n")
    ref = os.path.join(tiny_data_bin.raw_dir, "test.tgt")
    return {"REF": ref, "HYP": ref, "SHORT": str(short), "OTHER": str(other), "BIN": tiny_data_bin.data_bin,
            "FILE": os.path.join(tiny_data_bin.data_bin, "dict.src.txt"),
            "SRC": os.path.join(tiny_data_bin.bpe_dir, "test.src")}


SIG = "significance.sh"
EVAL = "evaluate.sh"
EVAL_BASE = "--data-bin BIN --checkpoint FILE --src src --tgt tgt --ref REF --out NEW"
BAD = {
    "sig_malformed_pair": (SIG, "--ref REF --baseline base=HYP --system HYP --out NEW",
                           ["--system: expected NAME=HYP"]),
    "sig_bad_name": (SIG, "--ref REF --baseline a/b=HYP --system s=HYP --out NEW",
                     ["--baseline: expected NAME=HYP with a NAME of letters"]),
    "sig_missing_hyp_file": (SIG, "--ref REF --baseline base=HYP --system s=/nonexistent.txt --out NEW",
                             ["--system s: expected a file at '/nonexistent.txt'"]),
    "sig_empty_hyp_path": (SIG, "--ref REF --baseline base= --system s=HYP --out NEW",
                           ["--baseline: expected NAME=HYP, the file after '=' is missing"]),
    "sig_missing_ref": (SIG, "--ref /nonexistent.ref --baseline base=HYP --system s=HYP --out NEW",
                        ["--ref: expected a file at '/nonexistent.ref'"]),
    "sig_wrong_length": (SIG, "--ref REF --baseline base=HYP --system s=SHORT --out NEW",
                         ["--system s:", "has 1 lines but --ref", "has 12"]),
    "sig_same_name": (SIG, "--ref REF --baseline x=HYP --system x=HYP --out NEW", ["the name 'x' is used twice"]),
    "sig_no_system": (SIG, "--ref REF --baseline base=HYP --out NEW", ["missing required option --system"]),
    "sig_bad_samples": (SIG, "--ref REF --baseline base=HYP --system s=HYP --samples 0 --out NEW",
                        ["--samples: expected a whole number >= 1, got '0'"]),
    "sig_out_is_other_dir": (SIG, "--ref REF --baseline base=HYP --system s=HYP --out OTHER",
                             ["--out:", "not the output of an earlier significance.sh run", "--force"]),
    "eval_compound_without_tok_bleu": (EVAL, f"{EVAL_BASE} --compound-split",
                                       ["--compound-split: applies to tokenized BLEU", "--tok-bleu"]),
    "eval_missing_breakdown_source": (EVAL, f"{EVAL_BASE} --breakdown /nonexistent.src",
                                      ["--breakdown: expected a file at '/nonexistent.src'"]),
    "eval_breakdown_wrong_length": (EVAL, f"{EVAL_BASE} --breakdown SHORT",
                                    ["--breakdown:", "has 1 lines but --ref has 12"]),
    "eval_bad_buckets": (EVAL, f"{EVAL_BASE} --breakdown SRC --breakdown-buckets 10-20",
                         ["--breakdown-buckets: expected increasing whole numbers"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_cleanly(case, bad_env, tmp_path):
    script, args, fragments = BAD[case]
    new = tmp_path / "new"
    env = dict(bad_env, NEW=str(new))
    argv = []
    for a in args.split():
        name, sep, value = a.partition("=")
        argv.append(f"{name}={env.get(value, value)}" if sep and "--" not in name else env.get(a, a))
    p = run_script(script, argv, check=False)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert p.stderr.startswith(f"{script}: error: "), p.stderr
    for fragment in fragments:
        assert fragment in p.stderr, (fragment, p.stderr)
    assert commands(p.stderr) == [] and not new.exists()
    assert os.listdir(bad_env["OTHER"]) == ["keep.txt"]


@pytest.mark.parametrize("script", ["significance.sh", "evaluate.sh", "train.sh", "average.sh"])
def test_help_documents_the_options(script):
    text = run_script(script, ["--help"]).stdout
    expected = {"significance.sh": ["--baseline NAME=HYP", "--samples N", "significance.json", "index.html"],
                "evaluate.sh": ["--tok-bleu", "--compound-split", "##AT##", "--breakdown SRC", "beam 6"],
                "train.sh": ["--gpus N", "--nodes N", "--effective-tokens T", "--precision", "checkpoint_last.pt"],
                "average.sh": ["--last 5", "--last 20"]}[script]
    for fragment in expected:
        assert fragment in text, (script, fragment)
