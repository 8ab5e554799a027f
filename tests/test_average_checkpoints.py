"""fairseq-localness-average on small hand-made checkpoints (in-process, fast).

The round trip on real fairseq checkpoints is in test_checkpoint_loading.py and in
the pipeline test.
"""
import argparse
import collections
import os

import pytest
import torch

from fairseq_localness.cli import average_checkpoints as A
from fairseq_localness.checkpoint import torch_load_checkpoint


def make_ckpt(path, params, extra=None):
    state = {
        "args": argparse.Namespace(arch="transformer"),  # what torch's safe loader refuses
        "model": collections.OrderedDict(params),
        "optimizer_history": [{"num_updates": int(os.path.basename(path).split("_")[-1].split(".")[0])
                               if "_" in os.path.basename(path) else 0}],
    }
    state.update(extra or {})
    torch.save(state, path)
    return path


def params(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(3, 4, generator=g).to(dtype),
        "b": torch.randn(4, generator=g).to(dtype),
        "steps": torch.tensor([seed * 3 + 1]),  # an integer buffer
    }


def run(argv, capsys):
    code = A.cli_main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_average_of_files(tmp_path, capsys):
    files = [make_ckpt(str(tmp_path / f"c{i}.pt"), params(i)) for i in range(3)]
    code, out, err = run(["--inputs", *files, "--output", tmp_path / "avg.pt"], capsys)
    assert code == 0, err
    avg = torch_load_checkpoint(str(tmp_path / "avg.pt"))
    ps = [params(i) for i in range(3)]
    torch.testing.assert_close(avg["model"]["w"], sum(p["w"] for p in ps) / 3)
    assert avg["model"]["w"].dtype == torch.float32
    assert avg["model"]["steps"].item() == (1 + 4 + 7) // 3  # floor of the mean, integer dtype kept
    assert avg["model"]["steps"].dtype == torch.int64
    assert avg["args"].arch == "transformer"  # copied from the first input


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_is_accumulated_in_float64_and_cast_back(tmp_path, capsys, dtype):
    files = [make_ckpt(str(tmp_path / f"c{i}.pt"), params(i, dtype)) for i in range(4)]
    code, _, err = run(["--inputs", *files, "--output", tmp_path / "avg.pt"], capsys)
    assert code == 0, err
    avg = torch_load_checkpoint(str(tmp_path / "avg.pt"))["model"]
    assert avg["w"].dtype == dtype
    exact = sum(params(i, dtype)["w"].double() for i in range(4)) / 4
    assert torch.equal(avg["w"], exact.to(dtype))  # one rounding, at the end


def test_integer_weights_beyond_a_models_counters_are_refused_unless_forced(tmp_path, capsys, monkeypatch):
    """Integer and boolean weights are summed in 64 bits: a 100 MB checkpoint of one
    boolean tensor took 2.1 GB to average. More of them than a fairseq model's counters
    (MAX_INTEGER_VALUES) are refused before any sum, naming the file; --force averages
    them (the floor of the mean, in their own dtype)."""
    monkeypatch.setattr(A, "MAX_INTEGER_VALUES", 100)
    files = [make_ckpt(str(tmp_path / f"c{i}.pt"), dict(params(i), mask=torch.ones(101, dtype=torch.bool)))
             for i in range(2)]
    code, _, err = run(["--inputs", *files, "--output", tmp_path / "avg.pt"], capsys)
    assert code == 2 and err.strip().splitlines() == [
        f"fairseq-localness-average: error: '{files[0]}' holds 102 integer or boolean weight values, more than "
        "the 100 of a fairseq model's counters; their sums take 64 bits each (8 times a boolean's size). Expected a "
        "checkpoint of a trained model (pass --force to average anyway)"], err
    assert not (tmp_path / "avg.pt").exists()
    code, _, err = run(["--inputs", *files, "--output", tmp_path / "avg.pt", "--force"], capsys)
    assert code == 0, err
    avg = torch_load_checkpoint(str(tmp_path / "avg.pt"))["model"]
    assert avg["mask"].dtype == torch.bool and bool(avg["mask"].all())

def test_last_n_by_update_and_epoch(tmp_path, capsys):
    for upd in (10, 20, 30, 40):
        make_ckpt(str(tmp_path / f"checkpoint_1_{upd}.pt"), params(upd))
    for ep in (1, 2, 3):
        make_ckpt(str(tmp_path / f"checkpoint{ep}.pt"), params(100 + ep))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, out, err = run(["--inputs", tmp_path, "--num-update-checkpoints", 2, "--output", out_dir / "u.pt"], capsys)
    assert code == 0, err
    assert "checkpoint_1_40.pt" in out and "checkpoint_1_30.pt" in out and "checkpoint_1_20.pt" not in out
    avg = torch_load_checkpoint(str(out_dir / "u.pt"))
    torch.testing.assert_close(avg["model"]["w"], (params(40)["w"] + params(30)["w"]) / 2)
    assert avg["optimizer_history"][-1]["num_updates"] == 40  # the newest is the "first" input
    code, out, err = run(["--inputs", tmp_path, "--num-update-checkpoints", 2,
                          "--checkpoint-upper-bound", 25, "--output", out_dir / "b.pt"], capsys)
    assert code == 0 and "checkpoint_1_20.pt" in out and "checkpoint_1_10.pt" in out and "_30" not in out
    code, out, err = run(["--inputs", tmp_path, "--num-epoch-checkpoints", 3, "--output", out_dir / "e.pt"], capsys)
    assert code == 0, err
    torch.testing.assert_close(torch_load_checkpoint(str(out_dir / "e.pt"))["model"]["b"],
                               sum(params(100 + e)["b"] for e in (1, 2, 3)) / 3)


def _assert_nothing_written(directory, before):
    assert sorted(os.listdir(directory)) == before


@pytest.mark.parametrize("case", [
    "missing_file", "too_few", "mismatched_keys", "mismatched_shapes", "output_is_input",
    "output_dir_missing", "dir_without_num", "files_with_num", "bound_without_num", "not_a_checkpoint",
])
def test_bad_inputs_stop_before_writing(tmp_path, capsys, case):
    a = make_ckpt(str(tmp_path / "checkpoint_1_1.pt"), params(1))
    b = make_ckpt(str(tmp_path / "checkpoint_1_2.pt"), params(2))
    out = tmp_path / "avg.pt"
    argv, message = {
        "missing_file": (["--inputs", a, tmp_path / "nope.pt"], "nope.pt' does not exist"),
        "too_few": (["--inputs", tmp_path, "--num-update-checkpoints", 3],
                    "found 2 checkpoint(s) named checkpoint_<epoch>_<update>.pt"),
        "mismatched_keys": (None, "does not have the parameters of"),
        "mismatched_shapes": (None, "parameter 'w' has shape (2, 2)"),
        "output_is_input": (["--inputs", a, b, "--output", b], "is one of the inputs; refusing to overwrite"),
        "output_dir_missing": (["--inputs", a, b, "--output", tmp_path / "no" / "avg.pt"], "does not exist"),
        "dir_without_num": (["--inputs", tmp_path], "is a directory; give checkpoint files"),
        "files_with_num": (["--inputs", a, b, "--num-epoch-checkpoints", 2], "must be one directory"),
        "bound_without_num": (["--inputs", a, b, "--checkpoint-upper-bound", 3], "requires --num-epoch"),
        "not_a_checkpoint": (None, "(no 'model' entry)"),
    }[case]
    if case == "mismatched_keys":
        c = make_ckpt(str(tmp_path / "other.pt"), {"w": params(3)["w"], "extra": torch.zeros(1)})
        argv = ["--inputs", a, c]
    elif case == "mismatched_shapes":
        c = make_ckpt(str(tmp_path / "other.pt"), dict(params(3), w=torch.zeros(2, 2)))
        argv = ["--inputs", a, c]
    elif case == "not_a_checkpoint":
        c = str(tmp_path / "other.pt")
        torch.save({"weights": torch.zeros(1)}, c)
        argv = ["--inputs", a, c]
    if "--output" not in argv:
        argv = argv + ["--output", out]
    before = sorted(os.listdir(tmp_path))
    b_bytes = open(b, "rb").read()
    code, _, err = run(argv, capsys)
    assert code == 2
    assert message in err, err
    assert err.startswith("fairseq-localness-average: error: ")
    _assert_nothing_written(tmp_path, before)
    assert open(b, "rb").read() == b_bytes


def test_interrupted_write_keeps_the_previous_output(tmp_path, capsys, monkeypatch):
    a = make_ckpt(str(tmp_path / "a.pt"), params(1))
    b = make_ckpt(str(tmp_path / "b.pt"), params(2))
    out = tmp_path / "avg.pt"
    out.write_bytes(b"previous result")
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(10)  # half-written ...
        raise KeyboardInterrupt  # ... and interrupted

    monkeypatch.setattr(A.torch, "save", failing_save)
    with pytest.raises(KeyboardInterrupt):
        A.cli_main(["--inputs", a, b, "--output", str(out)])
    assert out.read_bytes() == b"previous result"
    assert sorted(os.listdir(tmp_path)) == ["a.pt", "avg.pt", "b.pt"]  # no temporary left behind


def test_tied_parameters_are_not_double_counted(tmp_path, capsys):
    """fairseq state dicts hold shared embeddings under several names, one storage."""
    shared = torch.ones(2, 2)
    a = make_ckpt(str(tmp_path / "a.pt"), {"enc.embed": shared, "dec.embed": shared})
    b = make_ckpt(str(tmp_path / "b.pt"), {"enc.embed": shared * 3, "dec.embed": shared * 3})
    code, _, err = run(["--inputs", a, b, "--output", tmp_path / "avg.pt"], capsys)
    assert code == 0, err
    avg = torch_load_checkpoint(str(tmp_path / "avg.pt"))["model"]
    assert torch.equal(avg["enc.embed"], torch.full((2, 2), 2.0))
    assert torch.equal(avg["dec.embed"], torch.full((2, 2), 2.0))


def test_a_tie_undone_by_views_of_another_shape_is_refused_before_any_copy(tmp_path, capsys, monkeypatch):
    """One weight under 300 names in the first input, 300 one-element views of one
    storage in the second: the shapes are compared before the sum is copied for each
    name the second input unties (300 copies of the first input's weight, gigabytes
    from two small files, before the refusal)."""
    shared = torch.zeros(1000)
    a = make_ckpt(str(tmp_path / "a.pt"), {f"w{i}": shared for i in range(300)})
    storage = torch.zeros(300)
    b = make_ckpt(str(tmp_path / "b.pt"), {f"w{i}": storage[i:i + 1] for i in range(300)})
    copies = []
    clone = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda t, *a, **k: copies.append(t.numel()) or clone(t, *a, **k))
    code, _, err = run(["--inputs", a, b, "--output", tmp_path / "avg.pt"], capsys)
    assert code != 0 and "parameter 'w0' has shape (1,) in" in err and err.count("\n") == 1, err
    assert copies.count(1000) <= 1, copies  # (the first input's sum, once)
    assert not (tmp_path / "avg.pt").exists()


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def test_a_checkpoint_that_would_run_code_is_refused_unless_trusted(tmp_path, capsys, monkeypatch):
    """Loaded with weights_only=True: a file needing a global besides argparse.Namespace
    stops the average with one line naming it, before it runs; --trust-checkpoint
    loads it in full (so the payload runs: the refusal above was real), for this
    command only."""
    from fairseq_localness.checkpoint import TRUST_ENV

    monkeypatch.delenv(TRUST_ENV, raising=False)
    marker = tmp_path / "ran"
    a = make_ckpt(str(tmp_path / "a.pt"), params(1))
    b = make_ckpt(str(tmp_path / "b.pt"), params(2), extra={"extra_state": {"x": _RunsCode(str(marker))}})
    code, _, err = run(["--inputs", a, b, "--output", tmp_path / "avg.pt"], capsys)
    assert code == 2 and not marker.exists()
    assert err.count("\n") == 1 and err.startswith(
        f"fairseq-localness-average: error: refusing to load checkpoint '{b}': it needs builtins.exec,"), err
    assert f"set {TRUST_ENV}=1" in err
    assert not (tmp_path / "avg.pt").exists()
    code, _, err = run(["--inputs", a, b, "--output", tmp_path / "avg.pt", "--trust-checkpoint"], capsys)
    assert code == 0, err
    assert marker.exists() and (tmp_path / "avg.pt").exists()
    assert TRUST_ENV not in os.environ
