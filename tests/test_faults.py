"""The pipeline and the tools on hostile input: line-breaking characters and NUL bytes,
files that are not line-parallel, a reference without a final newline, sentences
longer than the model accepts, a failed rerun, checkpoints of different models, a
model with nothing to dump, an impossible corpus size. Nothing silently wrong,
nothing lost, every error clean."""
import json
import os
import shutil
import time

import pytest
import torch

from conftest import (USER_DIR, get_tiny_data, parse_hypotheses, run_fairseq, run_script, train_command)

SMALL_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]
MAX_POSITIONS = 40  # of the model trained here: the long test sentence has more tokens


def commands(stderr):
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


def write_lines(path, lines, final_newline=True):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + ("\n" if final_newline else ""))


# --------------------------------------------------------------------------- prepare_bpe.sh
def test_carriage_returns_do_not_shift_the_moses_tokenized_pairs(tmp_path):
    """A lone \\r in source line 6 and target line 200: sacremoses (and every later
    tool) would read it as a line break and shift every pair after it; the lines are
    normalized first, each named, and every output line stays with its pair."""
    data = get_tiny_data()
    raw = tmp_path / "raw"
    shutil.copytree(data.raw_dir, raw)
    src, tgt = data.lines("train", "src"), data.lines("train", "tgt")
    assert len(src) == 200
    src[5] = src[5].replace(" ", " \r ", 1)
    tgt[199] = tgt[199].replace(" ", "\r", 1)
    write_lines(raw / "train.src", src)
    write_lines(raw / "train.tgt", tgt, final_newline=False)  # and no final newline
    out = tmp_path / "bpe"
    p = run_script("prepare_bpe.sh", ["--raw", raw, "--out", out, "--src", "src", "--tgt", "tgt",
                                      "--method", "subword-nmt", "--merges", "50", "--tokenize", "moses",
                                      "--splits", "train"])
    assert "train.src: replaced line-breaking characters or NUL bytes (\\r in line 6)" in p.stderr
    assert "train.tgt: replaced line-breaking characters or NUL bytes (\\r in line 200)" in p.stderr
    for lang, raw_lines in (("src", src), ("tgt", tgt)):
        segmented = (out / f"train.{lang}").read_text(encoding="utf-8").split("\n")
        assert segmented[-1] == "" and len(segmented) == 201, lang
        for i, (seg, line) in enumerate(zip(segmented, raw_lines)):
            words = seg.replace("@@ ", "").split()
            expected = line.replace("\r", " ").replace(".", " .").split()
            assert words == expected, (lang, i + 1, seg, line)


@pytest.mark.parametrize("script,inputs,option", [
    ("prepare_bpe.sh", ["--raw", "raw_dir"], "--out"),
    ("preprocess.sh", ["--data", "bpe_dir"], "--dest"),
])
def test_force_never_replaces_a_file(script, inputs, option, tmp_path):
    """An output directory that is a file is refused, even with --force, before any command."""
    data = get_tiny_data()
    out = tmp_path / "notes.txt"
    out.write_text("keep me\n")
    p = run_script(script, [inputs[0], getattr(data, inputs[1]), option, out, "--src", "src", "--tgt", "tgt",
                            "--force"], check=False)
    assert p.returncode == 2
    assert p.stderr.startswith(f"{script}: error: {option}: ") and "is not a directory" in p.stderr
    assert out.read_text() == "keep me\n" and commands(p.stderr) == []
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


# --------------------------------------------------------------------------- preprocess.sh
@pytest.mark.parametrize("fault,message", [
    ("short_target", "the files are not line-parallel ("),
    ("carriage_return", "line 3 holds \\r, which other tools read as a line break"),
    ("nul", "line 3 holds NUL"),
    ("line_separator", "line 3 holds U+2028"),
])
def test_preprocess_refuses_input_that_is_not_line_parallel(fault, message, tmp_path):
    data = get_tiny_data()
    bpe = tmp_path / "bpe"
    shutil.copytree(data.bpe_dir, bpe)
    tgt = data.lines("valid", "tgt", segmented=True)
    if fault == "short_target":
        tgt = tgt[:-1]
    else:
        tgt[2] = tgt[2].replace(" ", {"carriage_return": "\r", "nul": "\x00", "line_separator": "\u2028"}[fault], 1)
    write_lines(bpe / "valid.tgt", tgt)
    dest = tmp_path / "bin"
    p = run_script("preprocess.sh", ["--data", bpe, "--dest", dest, "--src", "src", "--tgt", "tgt"], check=False)
    assert p.returncode == 2, p.stderr[-2000:]
    assert p.stderr.startswith("preprocess.sh: error: --data (valid data for src-tgt): "), p.stderr
    assert message in p.stderr, p.stderr
    assert commands(p.stderr) == [] and not dest.exists()
    assert sorted(os.listdir(tmp_path)) == ["bpe"]


# --------------------------------------------------------------------------- evaluate.sh
@pytest.fixture(scope="module")
def faulty_test_set(tmp_path_factory):
    """A small transformer (max positions 40) and a test set with a NUL byte in
    line 5, a sentence too long for the model in line 3, and a raw reference
    without a final newline; evaluate.sh run on it."""
    data = get_tiny_data()
    base = tmp_path_factory.mktemp("faulty")
    ckpts = base / "ckpts"
    run_fairseq("fairseq-train", train_command("transformer", data, str(ckpts), [
        "--max-source-positions", str(MAX_POSITIONS), "--max-target-positions", str(MAX_POSITIONS),
        "--skip-invalid-size-inputs-valid-test", "--no-epoch-checkpoints"], model_args=SMALL_MODEL))
    seg = base / "seg"
    seg.mkdir()
    src = data.lines("test", "src", segmented=True)
    src[2] = " ".join([src[2]] * 12)
    assert len(src[2].split()) > MAX_POSITIONS
    # a token of line 5 gets a NUL byte, in the text and (renamed in place, same id)
    # in the dictionary, so that fairseq-generate prints it in its S- line
    with open(os.path.join(data.data_bin, "dict.src.txt"), encoding="utf-8") as f:
        entries = f.read().split("\n")
    words = [e.split(" ")[0] for e in entries]
    token = next(t for t in src[4].split() if t in words)
    entries[words.index(token)] = entries[words.index(token)].replace(token, token + "\x00", 1)
    src[4] = " ".join(t + "\x00" if t == token else t for t in src[4].split())
    write_lines(seg / "test.src", src)
    write_lines(seg / "test.tgt", data.lines("test", "tgt", segmented=True))
    write_lines(seg / "dict.txt", entries[:-1])
    faulty_bin = base / "bin"
    run_fairseq("fairseq-preprocess", ["--source-lang", "src", "--target-lang", "tgt", "--testpref", seg / "test",
                                       "--destdir", faulty_bin, "--srcdict", seg / "dict.txt",
                                       "--tgtdict", seg / "dict.txt", "--workers", "1"])
    for name in ("SEGMENTATION", "TOKENIZATION", "sentencepiece.bpe.model"):
        shutil.copy(os.path.join(data.data_bin, name), faulty_bin / name)
    ref = base / "ref.tgt"
    write_lines(ref, data.lines("test", "tgt"), final_newline=False)
    out = base / "eval"
    p = run_script("evaluate.sh", ["--data-bin", faulty_bin, "--checkpoint", ckpts / "checkpoint_last.pt",
                                   "--src", "src", "--tgt", "tgt", "--ref", ref, "--beam", "1", "--out", out,
                                   "--", "--max-len-b", "5"], check=False)
    return {"base": base, "ckpt": ckpts / "checkpoint_last.pt", "bin": faulty_bin, "ref": ref, "out": out,
            "run": p, "n": len(src)}


def test_evaluate_skips_a_sentence_too_long_for_the_model_and_keeps_the_rest_aligned(faulty_test_set):
    p, out, n = faulty_test_set["run"], faulty_test_set["out"], faulty_test_set["n"]
    assert p.returncode == 0, p.stderr[-3000:]
    assert ("evaluate.sh: warning: 1 of 12 sentences are longer than the model accepts (max_positions=(40, 40)"
            in p.stderr), p.stderr[-3000:]
    assert "were not translated: line(s) 3;" in p.stderr
    for name in ("hyp.seg", "hyp.tok", "hyp.detok"):
        lines = (out / name).read_text(encoding="utf-8").split("\n")
        assert len(lines) == n + 1 and lines[-1] == "", name
        assert lines[2] == "" and all(lines[i] for i in range(n) if i != 2), (name, lines)
    bleu = json.loads((out / "bleu.json").read_text())
    assert bleu["skipped"] == 1 and bleu["skipped_lines"] == [3]
    assert "; 1 of 12 sentences skipped as too long (empty hypotheses)" in p.stdout.splitlines()[-1]


def test_evaluate_counts_every_hypothesis_of_a_test_set_with_a_nul_byte(faulty_test_set):
    p, out = faulty_test_set["run"], faulty_test_set["out"]
    assert p.returncode == 0, p.stderr[-3000:]
    assert b"\x00" in (out / "generate.out").read_bytes()  # grep would call the file binary
    hyps = parse_hypotheses((out / "generate.out").read_text(encoding="utf-8", errors="replace"))
    assert len(hyps) == faulty_test_set["n"] - 1  # all but the skipped one
    assert (out / "hyp.seg").read_text(encoding="utf-8").split("\n")[4] != ""


def test_evaluate_accepts_a_reference_without_final_newline(faulty_test_set):
    assert not faulty_test_set["ref"].read_bytes().endswith(b"\n")
    assert faulty_test_set["run"].returncode == 0, faulty_test_set["run"].stderr[-3000:]
    assert "has 11 lines" not in faulty_test_set["run"].stderr


def test_evaluate_refuses_a_reference_a_line_break_would_split(faulty_test_set, tmp_path):
    """A lone \\r inside a reference line: sacrebleu would read one more line. A
    Windows line end is fine."""
    data = get_tiny_data()
    lines = data.lines("test", "tgt")
    ref = tmp_path / "ref.tgt"
    write_lines(ref, [line + "\r" for line in lines])  # \r\n line ends
    lines[6] = lines[6].replace(" ", "\r", 1)
    bad = tmp_path / "bad.tgt"
    write_lines(bad, lines)
    args = ["--data-bin", faulty_test_set["bin"], "--checkpoint", faulty_test_set["ckpt"], "--src", "src",
            "--tgt", "tgt", "--out", tmp_path / "eval", "--ref"]
    p = run_script("evaluate.sh", args + [bad], check=False)
    assert p.returncode == 2 and commands(p.stderr) == []
    assert p.stderr.startswith(f"evaluate.sh: error: --ref: '{bad}' line 7 holds \\r"), p.stderr
    p = run_script("evaluate.sh", args + [ref, "--beam", "1", "--", "--max-len-b", "5"])
    assert json.loads((tmp_path / "eval" / "bleu.json").read_text())["skipped"] == 1


def test_a_failed_rerun_leaves_the_previous_results_as_they_were(faulty_test_set):
    out = faulty_test_set["out"]
    assert faulty_test_set["run"].returncode == 0, faulty_test_set["run"].stderr[-3000:]
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}
    p = run_script("evaluate.sh", ["--data-bin", faulty_test_set["bin"], "--checkpoint", faulty_test_set["ckpt"],
                                   "--src", "src", "--tgt", "tgt", "--ref", faulty_test_set["ref"], "--out", out,
                                   "--", "--no-such-generate-option"], check=False)
    assert p.returncode != 0
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    failed = faulty_test_set["base"] / "eval.failed"
    assert f"this run's outputs are in {failed}/, and '{out}' was left as it was" in p.stderr
    assert "--no-such-generate-option" in (failed / "generate.log").read_text()
    assert not list(faulty_test_set["base"].glob("eval.tmp.*"))
    assert not any(f.startswith("eval.") for f in os.listdir(faulty_test_set["base"]) if f != "eval.failed")


def test_a_rerun_replaces_every_file_of_the_previous_run_and_keeps_other_files(faulty_test_set, tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    (out / "tok_bleu.json").write_text("{}")  # of an earlier run with --tok-bleu: stale now
    p = run_script("evaluate.sh", ["--data-bin", faulty_test_set["bin"], "--checkpoint", faulty_test_set["ckpt"],
                                   "--src", "src", "--tgt", "tgt", "--ref", faulty_test_set["ref"], "--beam", "1",
                                   "--out", out, "--", "--max-len-b", "5"])
    assert sorted(os.listdir(out)) == ["bleu.json", "generate.log", "generate.out", "hyp.detok", "hyp.seg",
                                       "hyp.tok", "notes.txt"], p.stderr[-2000:]
    assert (out / "notes.txt").read_text() == "keep me\n"
    assert sorted(os.listdir(tmp_path)) == ["eval"]


def test_interactive_keeps_going_past_a_line_too_long_for_the_model(faulty_test_set):
    """fairseq-interactive translates the beginning of an over-long line with a
    warning naming it, instead of stopping and losing the lines after it."""
    data = get_tiny_data()
    lines = data.lines("test", "src", segmented=True)[:4]
    lines[1] = " ".join([lines[1]] * 6)
    proc = run_fairseq("fairseq-interactive", [
        data.data_bin, "--user-dir", USER_DIR, "--path", faulty_test_set["ckpt"], "--source-lang", "src",
        "--target-lang", "tgt", "--beam", "1", "--max-len-b", "5", "--buffer-size", "2", "--batch-size", "2"],
        input="\n".join(lines) + "\n")
    log = proc.stdout + proc.stderr
    n_tokens = len(lines[1].split()) + 1
    assert (f"input line 2 has {n_tokens} tokens (with the end of sentence), more than the model accepts "
            f"(max_positions={MAX_POSITIONS}); translating its first {MAX_POSITIONS - 1}") in log
    assert len(parse_hypotheses(proc.stdout)) == 4


# --------------------------------------------------------------------------- fairseq-localness-dump
def test_dump_says_a_transformer_has_nothing_to_dump(faulty_test_set, tmp_path):
    data = get_tiny_data()
    out = tmp_path / "stats.jsonl"
    proc = run_fairseq("fairseq-localness-dump", [data.data_bin, "--path", faulty_test_set["ckpt"], "--output", out],
                       check=False)
    assert proc.returncode == 2
    assert ("fairseq-localness-dump: error: the model of" in proc.stderr
            and "(--arch transformer) has no module that records statistics" in proc.stderr
            and "nothing to dump" in proc.stderr), proc.stderr[-2000:]
    assert os.listdir(tmp_path) == []


# --------------------------------------------------------------------------- fairseq-localness-average
def _save_model(path, arch, extra):
    from fairseq.models import ARCH_MODEL_REGISTRY

    from model_utils import TINY, ToyTask, parse_model_args

    args = parse_model_args(arch, TINY + extra)
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, ToyTask())
    args._name = arch
    torch.save({"args": None, "cfg": {"model": args}, "model": model.state_dict(),
                "optimizer_history": [{"num_updates": 1}]}, path)
    return model


def test_average_refuses_checkpoints_of_different_models(tmp_path, capsys):
    """A transformer and a hybrid local_pattern model have the same parameter names
    and shapes; averaging them needs --force."""
    from fairseq_localness.cli import average_checkpoints as A

    a = _save_model(tmp_path / "transformer.pt", "transformer", [])
    b = _save_model(tmp_path / "local_pattern.pt", "hybrid_transformer", ["--hybrid-variant", "local_pattern"])
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    out = tmp_path / "avg.pt"
    assert A.cli_main(["--inputs", str(tmp_path / "transformer.pt"), str(tmp_path / "local_pattern.pt"),
                       "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is not the same model as" in err and "--arch hybrid_transformer (model hybrid_transformer) vs " \
        "transformer (model transformer)" in err and "--force" in err
    assert not out.exists()
    # same architecture, another model option
    _save_model(tmp_path / "gate.pt", "hybrid_transformer", [])
    assert A.cli_main(["--inputs", str(tmp_path / "gate.pt"), str(tmp_path / "local_pattern.pt"),
                       "--output", str(out)]) == 2
    assert "--hybrid-variant local_pattern vs gate" in capsys.readouterr().err
    assert A.cli_main(["--inputs", str(tmp_path / "transformer.pt"), str(tmp_path / "local_pattern.pt"),
                       "--output", str(out), "--force"]) == 0
    assert out.exists()


def test_average_accepts_checkpoints_of_one_run_with_other_training_settings(tmp_path, capsys):
    """Only the model counts: a resumed run's --max-update, --lr or dropout differ."""
    from fairseq_localness.cli import average_checkpoints as A

    _save_model(tmp_path / "a.pt", "hybrid_transformer", ["--max-update", "10", "--dropout", "0.1"])
    _save_model(tmp_path / "b.pt", "hybrid_transformer", ["--max-update", "20", "--dropout", "0.3", "--lr", "0.1"])
    assert A.cli_main(["--inputs", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"),
                       "--output", str(tmp_path / "avg.pt")]) == 0, capsys.readouterr().err


def test_average_accepts_checkpoints_that_differ_only_in_their_kernels(tmp_path, capsys):
    """--attention-impl changes the kernels, not the model: a run resumed with another
    value, or saved before the option existed (no attention_impl in its config)."""
    from fairseq_localness.cli import average_checkpoints as A

    _save_model(tmp_path / "dense.pt", "hybrid_transformer", ["--attention-impl", "dense"])
    _save_model(tmp_path / "auto.pt", "hybrid_transformer", [])
    older = torch.load(tmp_path / "auto.pt", weights_only=False)
    del older["cfg"]["model"].attention_impl
    torch.save(older, tmp_path / "older.pt")
    assert A.cli_main(["--inputs", str(tmp_path / "dense.pt"), str(tmp_path / "auto.pt"), str(tmp_path / "older.pt"),
                       "--output", str(tmp_path / "avg.pt")]) == 0, capsys.readouterr().err
    # a model option still counts
    _save_model(tmp_path / "concat.pt", "hybrid_transformer", ["--hybrid-variant", "concat"])
    assert A.cli_main(["--inputs", str(tmp_path / "dense.pt"), str(tmp_path / "concat.pt"),
                       "--output", str(tmp_path / "avg2.pt")]) == 2
    assert "--hybrid-variant concat vs gate" in capsys.readouterr().err


# --------------------------------------------------------------------------- fairseq-localness-corpus
def test_corpus_refuses_a_size_the_grammar_cannot_make_unique_sentences_for(tmp_path, capsys):
    from fairseq_localness import corpus as C

    start = time.monotonic()
    assert C.cli_main(["--out", str(tmp_path / "big"), "--train-size", "100000000"]) == 2
    assert time.monotonic() - start < 60
    err = capsys.readouterr().err
    assert ("fairseq-localness-corpus: error: --train-size 100000000: the grammar cannot make 100,000,900 unique "
            "sentences at these shares (the grammar has 2,010,000 distinct sentences with polysemy and without "
            "reorder, gender, long_agreement, fewer than the shares ask for); expected train + valid + test <= "
            "32,000,000") in err, err
    assert not (tmp_path / "big").exists()
    # every share 0: one set of phenomena, 5,025,000 sentences drawn very unevenly
    assert C.cli_main(["--out", str(tmp_path / "plain"), "--train-size", "2000000", "--share-reorder", "0",
                       "--share-gender", "0", "--share-polysemy", "0", "--share-long-agreement", "0"]) == 2
    assert "draws per sentence (repeats are drawn again), more than 10" in capsys.readouterr().err


def test_expected_draws_match_the_generator(monkeypatch):
    """The size check's model of the grammar (distinct sentences per set of
    phenomena and their probabilities) predicts the draws the generator makes."""
    from fairseq_localness import corpus as C
    from fairseq_localness.corpus import generate

    shares = {p: 0.0 for p in C.PHENOMENA}  # one set: no phenomenon, 5,025,000 sentences
    assert C.distinct_sentences(False, False, False, False) == 5_025_000
    cfg = C.CorpusConfig(seed=5, train_size=10_000, valid_size=1, test_size=1, shares=shares)
    draws = 0
    original = C.generate_example

    def counting(rng, wanted):
        nonlocal draws
        draws += 1
        return original(rng, wanted)

    monkeypatch.setattr(generate, "generate_example", counting)
    C.generate_corpus(cfg)
    predicted, short = C.draws_per_sentence(shares, 10_002)
    assert short is None
    assert abs(draws / 10_002 - predicted) < 0.05 * predicted, (draws / 10_002, predicted)
    assert predicted > 1.5  # repeats are frequent at this size: the check is not trivial


def test_corpus_streams_with_a_progress_bar(tmp_path, monkeypatch, capsys):
    from fairseq_localness import corpus as C
    from fairseq_localness.corpus import generate

    monkeypatch.setattr(generate, "PROGRESS_FROM", 100)
    assert C.cli_main(["--out", str(tmp_path / "c"), "--train-size", "300", "--valid-size", "10",
                       "--test-size", "10"]) == 0
    err = capsys.readouterr().err
    assert "generating" in err and "320/320" in err
    ref = C.generate_corpus(C.CorpusConfig(train_size=300, valid_size=10, test_size=10))
    assert (tmp_path / "c" / "train.src").read_text().splitlines() == [C.detokenize(e.src) for e in ref["train"]]
