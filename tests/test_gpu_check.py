"""scripts/gpu_check.sh and its training summary (scripts/train_log_summary.py).

The check itself needs a CUDA GPU (docs/benchmark.md, "On a GPU"); here: its options
are checked before anything runs, it refuses a machine without CUDA in one line, and
the summary of its training runs counts what it says it counts, on logs in
fairseq-train's ``--log-format simple`` form.
"""
import os
import re
import subprocess
import sys
import tarfile

import pytest
import torch

from conftest import REPO, run_script

SUMMARY = os.path.join(REPO, "scripts", "train_log_summary.py")
TABLE = os.path.join(REPO, "scripts", "gpu_train_table.py")
PROBE = os.path.join(REPO, "scripts", "gpu_train_probe.py")


def _line(update, loss, wps=991.8):
    return (f"2026-11-26 11:18:02 | INFO | train_inner | epoch 001:     {update} / 81 loss={loss}, "
            f"nll_loss=8.164, ppl=286.74, wps={wps}, ups=1.06, wpb=936, bsz=104, num_updates={update}, lr=1.5e-05")


def _probe_log(speeds, kernels=None, peak=None, syncs=None):
    """A log as gpu_train_probe.py leaves it: one train_inner line per 25 updates with
    the given wps, and the probe's lines."""
    lines = [_line(25 * (i + 1), "5.0", wps) for i, wps in enumerate(speeds)]
    if syncs is not None:
        lines.insert(4, f"gpu_check: sync at transformer_encoder.py:231 ({int(syncs * 3)})")
        lines.insert(4, f"gpu_check: host syncs per step {syncs} (updates 104-106)")
    if kernels is not None:
        lines.insert(4, f"gpu_check: kernels per step {kernels} (updates 101-103)")
    if peak is not None:
        lines.append(f"gpu_check: peak memory {peak} MB")
    return "\n".join(lines) + "\n"


def test_the_training_table_gives_ratios_to_the_transformer_per_dtype(tmp_path):
    """wps is the median after the warm-up (the intervals up to update 125, with the
    compilation and the profiled steps, are left out); kernels and peak memory are the
    probe's; every ratio is to the transformer of the same dtype; a cut run shows its
    updates and no ratio where it said nothing."""
    logs = tmp_path / "train"
    logs.mkdir()
    warm = [10.0, 20.0, 30.0, 40.0, 50.0]  # updates 25-125: left out
    (logs / "transformer.bf16.log").write_text(_probe_log(warm + [1000, 1100, 900, 1000, 1000, 1000, 1000], 1700, 4000,
                                                          syncs=2.0))
    (logs / "localness.bf16.log").write_text(_probe_log(warm + [900, 950, 850, 900, 900, 900, 900], 2125, 4400))
    (logs / "hysan.bf16.log").write_text(_probe_log(warm[:3]))
    (logs / "localness.dense.bf16.log").write_text(_probe_log(warm + [950] * 7, 1870, 4200))
    (logs / "transformer.fp16.log").write_text(_probe_log(warm + [2000] * 7, 1000, 3000))
    (logs / "localness.fp16.log").write_text(_probe_log(warm + [1500] * 7, 1500, 3300))
    device = tmp_path / "device.txt"
    device.write_text("NVIDIA H200, 143771 MiB, 570.1\ntorch 2.13.0 cuda 13.0 | fairseq 0.12.3\n")
    out = subprocess.run([sys.executable, TABLE, str(logs), str(device)], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines()[0].startswith("Measured on NVIDIA H200, 143771 MiB, 570.1; torch 2.13.0")
    assert "| system (bf16) | wps | speed ratio | kernels/step |" in out and "| system (fp16) |" in out
    assert out.index("| system (bf16)") < out.index("| transformer | 1,000 |") < out.index("| localness | 900 | 0.90 |")
    assert "| transformer | 1,000 | 1.00 | 1,700 | 1.00 | 2.0 | 4,000 | 1.00 | 300 |" in out
    assert "| localness | 900 | 0.90 | 2,125 | 1.25 | - | 4,400 | 1.10 | 300 |" in out
    assert "| hysan | - | - | - | - | - | - | - | 75 |" in out
    # a run with the models' --attention-impl: its own row, its ratios to the transformer's
    assert "| localness [dense] | 950 | 0.95 | 1,870 | 1.10 | - | 4,200 | 1.05 | 300 |" in out
    assert "| localness | 1,500 | 0.75 | 1,500 | 1.50 | - | 3,300 | 1.10 | 300 |" in out


def test_the_training_table_names_its_argument_when_it_is_no_folder(tmp_path):
    proc = subprocess.run([sys.executable, TABLE, str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 2 and "LOG_DIR" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_the_training_probe_refuses_a_machine_without_cuda_before_training(tmp_path):
    proc = subprocess.run([sys.executable, PROBE, str(tmp_path), "--max-update", "1"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "gpu_train_probe.py: error: no CUDA GPU (it counts GPU kernels and GPU memory)")


def _probe_with_trainer(monkeypatch, profile_from, steps):
    """gpu_train_probe.py installed over a stand-in of fairseq's Trainer whose step
    warns as the sync debug mode would (once, twice on odd updates) and once otherwise;
    the mode's settings recorded (``modes``). Returns the Trainer class and ``modes``."""
    import importlib.util
    import warnings

    from fairseq import trainer as fairseq_trainer

    from fairseq_localness.cli.bench_measure import SYNC_WARNING

    spec = importlib.util.spec_from_file_location("gpu_train_probe", PROBE)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)

    class Trainer:
        updates = 0

        def get_num_updates(self):
            return self.updates

        def train_step(self, samples, raise_oom=False):
            warnings.warn(SYNC_WARNING)  # e.g. a loss read with .item()
            if self.updates % 2:
                warnings.warn(SYNC_WARNING)
            warnings.warn("another warning")
            return self.updates

    monkeypatch.setattr(fairseq_trainer, "Trainer", Trainer)
    probe._install(profile_from=profile_from, steps=steps)
    return Trainer, modes


def test_the_training_probe_counts_the_hosts_waits_after_the_profiled_steps(monkeypatch, capsys):
    """gpu_train_probe.py's sync count: the steps after the profiled ones run with
    torch's sync debug mode warning (set around each step and restored), its warnings
    counted by their Python line; other steps and other warnings are not counted. (The
    mode needs a GPU: stood in for here.)"""
    Trainer, modes = _probe_with_trainer(monkeypatch, profile_from=5, steps=2)  # profiled: 5-6; counted: 7-8
    trainer = Trainer()
    for trainer.updates in (2, 6, 7, 8):  # the steps that make updates 3, 7, 8 and 9
        assert Trainer.train_step(trainer, []) == trainer.updates
        if trainer.updates == 2:
            assert modes == []  # a step before: not counted
    assert modes == ["warn", 0, "warn", 0]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gpu_check: host syncs per step 1.5 (updates 7-8)"  # (1 + 2) / 2
    assert len(out) == 3 and out[1].startswith("gpu_check: sync at test_gpu_check.py:")
    assert sorted(int(line.rsplit("(", 1)[1].rstrip(")")) for line in out[1:]) == [1, 2]


def test_the_training_probe_counts_calls_where_an_update_is_made_again(monkeypatch, capsys):
    """A step whose update fairseq skips (an fp16 overflow) or retries (out of memory)
    leaves the update counter where it was: the count is of calls, ``steps`` of them,
    reported once."""
    Trainer, modes = _probe_with_trainer(monkeypatch, profile_from=5, steps=2)
    trainer = Trainer()
    for trainer.updates in (6, 6, 6, 7):  # update 7 made three times, then 8
        Trainer.train_step(trainer, [])
    assert modes == ["warn", 0, "warn", 0]
    assert capsys.readouterr().out.splitlines()[0] == "gpu_check: host syncs per step 1.0 (updates 7-7)"


OVERFLOW = ("2026-11-26 11:18:02 | INFO | fairseq.trainer | NOTE: gradient overflow detected, ignoring gradient, "
            "setting loss scale to: 64.0")


def test_the_summary_counts_updates_non_finite_losses_and_overflows(tmp_path):
    logs = tmp_path / "train"
    logs.mkdir()
    (logs / "good.fp16.log").write_text("\n".join(
        [OVERFLOW, OVERFLOW, _line(20, "9.5"), _line(40, "7.25"),
         "2026-11-26 | INFO | fairseq_cli.train | done training in 4.0 seconds"]) + "\n")
    (logs / "bad.fp16.log").write_text("\n".join(
        [OVERFLOW] * 5 + [_line(20, "nan"), _line(40, "inf"), _line(60, "1.5e+01"),
                          "RuntimeError: CUDA out of memory"]) + "\n")
    (logs / "empty.bf16.log").write_text("")
    out = subprocess.run([sys.executable, SUMMARY, str(logs)], capture_output=True, text=True, check=True).stdout
    rows = [line.split("\t") for line in out.strip().splitlines()]
    assert rows[0] == ["run", "updates", "last loss", "NaN/inf losses", "loss-scale reductions", "ended"]
    assert rows[1:] == [
        ["bad.fp16", "60", "15.000", "2", "5", "RuntimeError: CUDA out of memory"],
        ["empty.bf16", "0", "-", "0", "0", "(empty log)"],
        ["good.fp16", "40", "7.250", "0", "2", "done"],
    ]


def test_the_summary_names_its_argument_when_it_is_no_folder(tmp_path):
    proc = subprocess.run([sys.executable, SUMMARY, str(tmp_path / "missing")], capture_output=True, text=True)
    assert proc.returncode == 2 and "LOG_DIR" in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--stages", "bench speed"], "--stages: unknown stage 'speed' (allowed: train bench probe tests)"),
    (["--systems", "transformer gpt"], "--systems: unknown system 'gpt'"),
    (["--budget", "10"], "--budget: expected a whole number >= 60, got '10'"),
    (["--bench-systems", "some"], "--bench-systems: expected one of: all; got 'some'"),
    (["--colour", "red"], "unknown option '--colour'"),
    (["--dtypes", "bf16 fp32"], "--dtypes: unknown precision 'fp32' (allowed: bf16 fp16)"),
    (["--updates", "100"], "--updates: expected a whole number >= 150, got '100'"),
    (["--bench-limit", "5"], "--bench-limit: expected a whole number >= 30, got '5'"),
    (["--run-limit", "1m"], "--run-limit: expected a whole number >= 30, got '1m'"),
    (["--bench-impls", "auto fast"], "--bench-impls: unknown value 'fast' (allowed: auto sdpa eager flex dense)"),
    (["--probe-variants", "auto,fast"],
     "--probe-variants: unknown variant 'fast' (allowed: auto static eager dense apart cpp graphs blocks)"),
    (["--bench-lengths", "128 512"], "--bench-lengths: expected comma-separated whole numbers"),
    (["--train-impls", "auto triton"], "--train-impls: unknown value 'triton' (allowed: auto sdpa eager flex dense)"),
    (["--train-impls", "dense auto dense"], "--train-impls: value 'dense' given twice"),
    (["--stages", "bench bench"], "--stages: stage 'bench' given twice"),
    (["--systems", "hysan transformer hysan"], "--systems: system 'hysan' given twice"),
], ids=["stage", "system", "budget", "bench-systems", "unknown", "dtypes", "updates", "bench-limit", "run-limit",
        "bench-impls", "probe-variants", "bench-lengths", "train-impls", "train-impls-twice", "stages-twice",
        "systems-twice"])
def test_bad_options_stop_before_anything_runs(tmp_path, args, message):
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.src.txt").write_text("a 1\n")
    proc = run_script("gpu_check.sh", ["--data-bin", data, "--out", tmp_path / "out", *args], check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_missing_data_bin_is_named(tmp_path):
    proc = run_script("gpu_check.sh", ["--data-bin", tmp_path / "nowhere", "--out", tmp_path / "out"], check=False)
    assert proc.returncode == 2 and "--data-bin: expected a directory at" in proc.stderr, proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_machine_without_cuda_is_refused_in_one_line(tmp_path):
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.src.txt").write_text("a 1\n")
    proc = run_script("gpu_check.sh", ["--data-bin", data, "--out", tmp_path / "out"], check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "gpu_check.sh: error: no CUDA GPU: this check measures and tests on a GPU (the CPU's benchmark is 'make bench')"]
    assert not (tmp_path / "out").exists()


STUB_PYTHON = r'''#!/usr/bin/env bash
# A Python for gpu_check.sh on a machine without CUDA: says CUDA is there, plays
# gpu_train_probe.py (a log of --max-update updates, its start and end recorded in
# $STUB_RUNS), and passes everything else to the real Python.
if [[ "$1" == "-c" ]]; then
    case "$2" in
        *cuda.is_available*) exit 0 ;;
        *"import xdist"*) exit 1 ;;
        *) echo "torch (stub) | fairseq (stub)"; exit 0 ;;
    esac
fi
if [[ "$1 $2" == "-m fairseq_localness.cli.benchmark" ]]; then
    args=" $* "
    dtype="${args#* --dtype }"; dtype="${dtype%% *}"
    impls="${args#* --attention-impl }"; impls="${impls%% --*}"
    lengths="${args#* --lengths }"; lengths="${lengths%% *}"
    repeats="${args#* --repeats }"; repeats="${repeats%% *}"
    systems=() collecting=0  # each argument after --systems, as it came ("|" between them)
    for a in "$@"; do
        [[ "$a" == --* ]] && collecting=0
        (( collecting )) && systems+=("$a")
        [[ "$a" == --systems ]] && collecting=1
    done
    listed=all; (( ${#systems[@]} )) && listed="$(IFS='|'; echo "${systems[*]}")"
    profile=no; [[ "$args" == *" --profile "* ]] && profile=yes
    group="${args#* --group-size }"; group="${group%% *}"
    echo "bench $dtype impls=${impls// /+} lengths=$lengths repeats=$repeats profile=$profile group=$group" \
        "systems=$listed" >> "$STUB_RUNS"
    if [[ "$repeats" == 1 ]]; then  # a warm-up run: wait for the others to start
        for (( i = 0; i < 100; i++ )); do
            (( $(grep -c "repeats=1 " "$STUB_RUNS") >= 4 )) && break
            sleep 0.1
        done
    fi
    echo "bench-end repeats=$repeats" >> "$STUB_RUNS"
    exit 0
fi
if [[ "$1" == *gpu_attention_probe.py ]]; then
    args=" $* "
    out="${args#* --out }"; out="${out%% *}"
    dtype="${args#* --dtype }"; dtype="${dtype%% *}"
    variants=""
    [[ "$args" == *" --variants "* ]] && { variants="${args#* --variants }"; variants=" ${variants%% *}"; }
    echo "probe $dtype$variants" >> "$STUB_RUNS"
    echo "| system |" > "$out"
    exit 0
fi
if [[ "$1" == *gpu_train_probe.py ]]; then
    args=" $* "
    arch="${args#* --arch }"; arch="${arch%% *}"
    rest="${args#* --max-update }"; updates="${rest%% *}"
    impl=auto; [[ "$args" == *" --attention-impl "* ]] && { impl="${args#* --attention-impl }"; impl="${impl%% *}"; }
    echo "start $arch $updates ${GPU_CHECK_PROFILE_FROM:-101} $(date +%s.%N) $impl" >> "$STUB_RUNS"
    if [[ "${GPU_CHECK_PROFILE_FROM:-101}" == 0 ]]; then  # a warm-up run: wait for the others to start
        for (( i = 0; i < 100; i++ )); do
            (( $(grep -c " 30 0 " "$STUB_RUNS") >= STUB_WARM_RUNS )) && break
            sleep 0.1
        done
    fi
    wps=1000; [[ "$arch" == transformer_* ]] || wps=900
    for (( u = 25; u <= updates; u += 25 )); do
        echo "2026-11-27 | INFO | train_inner | epoch 001: loss=5.0, wps=$wps, ups=1.0, num_updates=$u, lr=1e-05"
        (( u == 100 )) && [[ "${GPU_CHECK_PROFILE_FROM:-101}" != 0 ]] && echo "gpu_check: kernels per step 1700.0 (updates 101-103)"
    done
    echo "gpu_check: peak memory 4000 MB"
    echo "end $arch $(date +%s.%N)" >> "$STUB_RUNS"
    exit 0
fi
exec "$REAL_PYTHON" "$@"
'''


def _stub_machine(tmp_path):
    """A data folder, the stub Python (:data:`STUB_PYTHON`) and its record of runs."""
    data = tmp_path / "bin"
    data.mkdir()
    (data / "dict.src.txt").write_text("a 1\n")
    stub = tmp_path / "stub" / "python"
    stub.parent.mkdir()
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    return data, stub, tmp_path / "runs.txt"


def test_the_stages_bench_then_warm_up_in_parallel_then_time_one_run_at_a_time(tmp_path):
    """The benchmark and training stages' schedule, with a stand-in for the GPU runs:
    the benchmark in --dtypes' precision (bf16 by default) within --bench-limit; the warm-up
    starts every run at once (30 updates, not profiled), then the timed runs go one
    at a time, the transformer first, each with --updates updates and profiled; the
    summaries and the tarball (which holds them, not itself) are written."""
    data, stub, runs = _stub_machine(tmp_path)
    out = tmp_path / "out"
    env = {"PYTHON": str(stub), "STUB_RUNS": str(runs), "REAL_PYTHON": sys.executable, "STUB_WARM_RUNS": "2",
           "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    proc = run_script("gpu_check.sh", ["--data-bin", data, "--out", out, "--systems", "hysan transformer",
                                       "--stages", "bench train", "--bench-limit", "40", "--budget", "130",
                                       "--bench-impls", "auto eager", "--bench-lengths", "128",
                                       "--updates", "150", "--run-limit", "30"], env=env)
    lines = runs.read_text().splitlines()
    # the benchmark's warm-up: the four systems whose calls compile on CUDA, one round
    # each, all at once (each waits until all have started), within a third of the limit
    warm, timed, rest = lines[:8], lines[8:10], lines[10:]
    assert sorted(line.split(" systems=")[1] for line in warm[:4]) == [
        "hybrid (gate, enc 1-2)", "hysan e1 (gated)", "localness (query, enc 1-3)", "localness + rel_pos"]
    assert {line.split(" systems=")[0] for line in warm[:4]} == {
        "bench bf16 impls=auto+eager lengths=128 repeats=1 profile=no group=14"}
    assert warm[4:] == ["bench-end repeats=1"] * 4
    # (a third of the limit, 13 s, would leave the benchmark less than 30 s)
    assert "benchmark warm-up, bf16: 4 systems at once, one round each (at most 10 s)" in proc.stderr
    # then the benchmark itself, profiled, with what is left of its limit
    assert timed[0] == ("bench bf16 impls=auto+eager lengths=128 repeats=4 profile=yes group=14 systems=transformer|"
                        "localness (query, enc 1-3)|localness + rel_pos|hybrid (gate, enc 1-2)|hysan e1 (gated)|"
                        "enc-dc (f=2)|dec-dc (f=2)|full-dc (f=2)")
    assert timed[1] == "bench-end repeats=4"
    left = re.search(r"benchmark, bf16 \(at most (\d+) s\)", proc.stderr)
    assert left and 30 <= int(left.group(1)) <= 40, proc.stderr  # the limit less the warm-up's seconds
    assert sorted(os.listdir(out / "warm"))[:4] == [f"bench-bf16-{i}.log" for i in range(4)]
    events = [line.split() for line in rest]
    starts = [e for e in events if e[0] == "start"]
    assert sorted((e[1], e[2], e[3]) for e in starts[:2]) == [
        ("hysan_transformer_iwslt_de_en", "30", "0"), ("transformer_iwslt_de_en", "30", "0")]
    assert [(e[1], e[2], e[3]) for e in starts[2:]] == [
        ("transformer_iwslt_de_en", "150", "101"), ("hysan_transformer_iwslt_de_en", "150", "101")]
    # the two warm-up runs overlap (each waits until both have started, so both start
    # lines come before either end line); the timed runs do not
    kinds = [e[0] for e in events]
    assert kinds == ["start", "start", "end", "end", "start", "end", "start", "end"], kinds
    assert events[5][1] == "transformer_iwslt_de_en"
    assert sorted(n for n in os.listdir(out / "warm") if not n.startswith("bench-")) == [
        "hysan.bf16.log", "transformer.bf16.log"]
    assert sorted(os.listdir(out / "train")) == ["hysan.bf16.log", "transformer.bf16.log"]
    table = (out / "train.md").read_text()
    assert "| hysan | 900 | 0.90 | 1,700 | 1.00 | - | 4,000 | 1.00 | 150 |" in table, table
    assert "training transformer.bf16 (at most 30 s)" in proc.stderr
    device = (out / "device.txt").read_text().splitlines()
    assert device[-1].startswith("torch ") and "| fairseq " in device[-1] and "| triton " in device[-1]
    assert not any("Warning" in line or "INFO" in line for line in device)
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
    assert "./train.md" in names and "./warm/hysan.bf16.log" in names
    assert not any(name.endswith(".tar.gz") or name.endswith(".partial") for name in names)
    assert os.listdir(tmp_path / "tmp") == []  # the archive was written there, then moved


def test_train_impls_train_every_model_once_per_kernel_setting(tmp_path):
    """``--train-impls "auto dense"``: the transformer once (its attention is fairseq's),
    every other system once with the default kernels and once with ``--attention-impl
    dense``, in the warm-up and timed; the table has a row per run."""
    data, stub, runs = _stub_machine(tmp_path)
    out = tmp_path / "out"
    env = {"PYTHON": str(stub), "STUB_RUNS": str(runs), "REAL_PYTHON": sys.executable, "STUB_WARM_RUNS": "5"}
    run_script("gpu_check.sh", ["--data-bin", data, "--out", out, "--systems", "transformer localness hysan",
                                "--train-impls", "auto dense", "--updates", "150", "--run-limit", "30",
                                "--budget", "400"], env=env)
    starts = [line.split() for line in runs.read_text().splitlines() if line.startswith("start ")]
    expected = [("transformer_iwslt_de_en", "auto"), ("localness_transformer_iwslt_de_en", "auto"),
                ("localness_transformer_iwslt_de_en", "dense"), ("hysan_transformer_iwslt_de_en", "auto"),
                ("hysan_transformer_iwslt_de_en", "dense")]
    assert sorted((e[1], e[5]) for e in starts[:5]) == sorted(expected)  # the warm-up, all at once
    assert all(e[3] == "0" for e in starts[:5])
    assert [(e[1], e[5]) for e in starts[5:]] == expected  # then one at a time, in order
    assert sorted(os.listdir(out / "train")) == [
        "hysan.bf16.log", "hysan.dense.bf16.log", "localness.bf16.log", "localness.dense.bf16.log",
        "transformer.bf16.log"]
    table = (out / "train.md").read_text()
    assert "| localness [dense] | 900 | 0.90 |" in table and "| hysan | 900 | 0.90 |" in table, table
    assert "transformer [" not in table


def test_a_benchmark_limit_too_short_for_a_warm_up_runs_the_benchmark_alone(tmp_path):
    """Where a third of --bench-limit would leave the benchmark under 30 s and less than
    10 s remain for a warm-up, there is none: the benchmark gets the whole limit."""
    data, stub, runs = _stub_machine(tmp_path)
    env = {"PYTHON": str(stub), "STUB_RUNS": str(runs), "REAL_PYTHON": sys.executable}
    proc = run_script("gpu_check.sh", ["--data-bin", data, "--out", tmp_path / "out", "--stages", "bench",
                                       "--bench-limit", "35", "--budget", "130"], env=env)
    assert "no time for the bf16 benchmark's warm-up" in proc.stderr
    assert "benchmark, bf16 (at most 35 s)" in proc.stderr
    assert [line.split(" systems=")[0] for line in runs.read_text().splitlines()] == [
        "bench bf16 impls=auto lengths=128,512 repeats=4 profile=yes group=7", "bench-end repeats=4"]


def test_the_probe_stage_runs_the_attention_probe_in_the_first_dtype(tmp_path):
    """``--stages probe``: scripts/gpu_attention_probe.py in the first of --dtypes, its
    table to OUT/probe.md, within --probe-limit; the benchmark and the training stage
    do not run."""
    data, stub, runs = _stub_machine(tmp_path)
    out = tmp_path / "out"
    env = {"PYTHON": str(stub), "STUB_RUNS": str(runs), "REAL_PYTHON": sys.executable}
    proc = run_script("gpu_check.sh", ["--data-bin", data, "--out", out, "--stages", "probe", "--dtypes", "fp16 bf16",
                                       "--probe-limit", "45", "--budget", "130"], env=env)
    assert runs.read_text().splitlines() == ["probe fp16"]
    assert "attention probe, fp16 (at most 45 s)" in proc.stderr
    assert (out / "probe.md").read_text() == "| system |\n"
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        assert "./probe.md" in tar.getnames()
    # --probe-variants: the probe's paths, passed on
    runs.unlink()
    run_script("gpu_check.sh", ["--data-bin", data, "--out", tmp_path / "out2", "--stages", "probe",
                                "--probe-variants", "auto,dense", "--budget", "130"], env=env)
    assert runs.read_text().splitlines() == ["probe bf16 auto,dense"]


def test_the_attention_probe_measures_each_systems_sublayers_on_the_cpu(tmp_path):
    """The probe itself on the CPU (no GPU columns): the transformer's first encoder and
    decoder self-attention (fairseq's) and a model's own, each variant, with host and
    wall times and the ratio to the transformer's; bad options stop with the option named."""
    out = tmp_path / "probe.md"
    script = os.path.join(REPO, "scripts", "gpu_attention_probe.py")
    proc = subprocess.run([sys.executable, script, "--size", "tiny", "--shapes", "2x8", "--iters", "1", "--dtype",
                           "fp32", "--cpu", "--systems", "hysan e1 (gated)", "--variants", "auto,eager", "--out",
                           str(out), "--decode", "none", "--calls", "1"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text, calls = out.read_text().split("\nOne call")
    # the CPU's own paths: torch has no backward pass of the fused call there
    assert "| fused call (Gaussian, window) | forward + backward | - | - |" in calls
    assert "| SDPA (float mask) | forward + backward |" in calls
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0][:4] == ["| system", "sublayer", "B x T", "variant"]
    got = [(r[0][2:], r[1], r[3]) for r in rows[1:]]
    assert got == [("transformer", "encoder (MultiheadAttention)", "auto"),
                   ("transformer", "decoder (MultiheadAttention)", "auto"),
                   ("hysan e1 (gated)", "encoder (AttentionCore)", "auto"),
                   ("hysan e1 (gated)", "decoder (AttentionCore)", "auto"),
                   ("hysan e1 (gated)", "encoder (AttentionCore)", "eager"),
                   ("hysan e1 (gated)", "decoder (AttentionCore)", "eager")]
    assert all(float(r[4]) > 0 and float(r[5]) >= float(r[4]) * 0.9 for r in rows[1:])
    assert [r[6] for r in rows[1:3]] == ["1.00", "1.00"]
    assert [r[7].rstrip(" |") for r in rows[1:]] == ["0"] * 6  # the CPU's own paths: no fused call in training
    # CUDA's paths taken on the CPU: HySAN's branches are one fused call per sublayer
    proc = subprocess.run([sys.executable, script, "--size", "tiny", "--shapes", "2x8", "--iters", "1", "--dtype",
                           "fp32", "--cpu", "--cuda-paths", "--systems", "hysan e1 (gated)",
                           "localness (query, enc 1-3)", "--variants", "auto,eager,apart,cpp,dense,blocks", "--out",
                           str(out),
                           "--decode", "2x8", "--decode-steps", "3", "--decode-iters", "1", "--decode-systems",
                           "hysan e1 (gated)", "localness (query, enc 1-3)", "--calls", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    searches, text = out.read_text().split("\n\nAttention sublayers")
    text, calls = text.split("\nOne call, B x H x T x Dh = 2 x 8 x 16 x 64")
    # last, one call of each kind at a tiny shape: its host and wall time, forward and with a backward
    # pass (the fused call's by torch's reference implementation here, on CUDA's paths)
    call_rows = [line.split(" | ") for line in calls.splitlines() if line.startswith("| ") and "---" not in line]
    assert [(r[0][2:], r[1]) for r in call_rows[1:]] == [
        (name, side) for side in ("forward", "forward + backward")
        for name in ("fused call (Gaussian, window)", "SDPA (float mask)", "one operator (add)")]
    assert all(float(r[2]) > 0 and float(r[3].rstrip(" |")) >= float(r[2]) for r in call_rows[1:])
    # first the beam search, each system with its steps' attention fused (CUDA's paths: one
    # call per decoder layer and step where the step has attention of its own) and not
    decode = [line.split(" | ") for line in searches.splitlines() if line.startswith("| ") and "---" not in line]
    assert "Beam search (beam 4)" in searches.splitlines()[0] and "CUDA's paths" in searches.splitlines()[0]
    assert decode[0][:3] == ["| system", "beam search", "steps' attention"]
    got = [(r[0][2:], r[1], r[2], int(r[5].rstrip(" |"))) for r in decode[1:]]
    assert [g[:3] for g in got] == [(name, "2 x 8, 3 steps", path) for name in (
        "transformer", "hysan e1 (gated)", "localness (query, enc 1-3)") for path in ("fused", "kernels")]
    fused = {(name, path): count for name, _, path, count in got}
    assert fused.pop(("hysan e1 (gated)", "fused")) > 0 and set(fused.values()) == {0}  # (fairseq's decoders)
    assert all(float(r[3]) > 0 for r in decode[1:]) and [r[4] for r in decode[1:3]] == ["1.00", "1.00"]
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert "CUDA's paths" in text.splitlines()[0]
    hysan, localness = "hysan e1 (gated)", "localness (query, enc 1-3)"
    assert [(r[0][2:], r[1].split()[0], r[3], r[7].rstrip(" |")) for r in rows[1:]] == [
        ("transformer", "encoder", "auto", "0"), ("transformer", "decoder", "auto", "0"),
        (hysan, "encoder", "auto", "1"), (hysan, "decoder", "auto", "1"),
        (localness, "encoder", "auto", "1"), (localness, "decoder", "auto", "0"),
        (hysan, "encoder", "eager", "0"), (hysan, "decoder", "eager", "0"),
        (localness, "encoder", "eager", "0"), (localness, "decoder", "eager", "0"),
        # the gate after the call, the Gaussian's centres and windows before it; nothing of the kind
        # in localness's decoder (fairseq's attention)
        (hysan, "encoder", "apart", "1"), (hysan, "decoder", "apart", "1"), (localness, "encoder", "apart", "1"),
        # Inductor's C++ wrapper: the sublayers with a fused call (none in localness's decoder)
        (hysan, "encoder", "cpp", "1"), (hysan, "decoder", "cpp", "1"), (localness, "encoder", "cpp", "1"),
        # attention_impl "dense": no fused call, only for the sublayers that have one in auto
        (hysan, "encoder", "dense", "0"), (hysan, "decoder", "dense", "0"), (localness, "encoder", "dense", "0"),
        # the fused calls on the smaller blocks: the sublayers with a fused call
        (hysan, "encoder", "blocks", "1"), (hysan, "decoder", "blocks", "1"), (localness, "encoder", "blocks", "1")]
    bad = subprocess.run([sys.executable, script, "--shapes", "32by128", "--cpu"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and "--shapes: expected BxT, e.g. 32x128, got '32by128'" in bad.stderr
    for args, message in ((["--decode", "8by128"], "--decode: expected BxT, e.g. 32x128, got '8by128'"),
                          (["--decode-systems", "nope"], "--decode-systems: unknown 'nope'"),
                          (["--decode-steps", "0"], "--decode-steps and --decode-iters: at least 1")):
        bad = subprocess.run([sys.executable, script, "--cpu"] + args, capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)
