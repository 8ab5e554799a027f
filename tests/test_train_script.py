"""scripts/train.sh: the paper's batch kept on any number of processes, and resuming
from a checkpoint_last.pt that a killed run left unreadable.

The batch: for every paper configuration (configs/papers) and 1, 2, 8 and 16
processes (--cpu stands in for GPUs), `train.sh --dry-run --effective-tokens T`
prints a command whose --max-tokens x processes x --update-freq is the paper's batch
(at most T, and within a token per process and batch of it), or refuses with exit
status 2 when no split is possible. These dry runs use a stand-in data-bin (the
dictionaries and index files train.sh reads) and a stand-in for the architecture
check (it imports fairseq, seconds per call; tests/test_pipeline.py covers it), which
also stands in for the reading of the longest training pair (STUB_LONGEST); that
reading, with fairseq's own index reader, is tested by real dry runs below.

The preset: --preset tiny puts the demo's model and recipe between the defaults and
the arguments after --; configs/demo.sh reads them from the preset, so the two cannot
differ; an unknown name is refused, naming the presets.

Resumption: a truncated checkpoint_last.pt makes train.sh resume from the newest
readable checkpoint (by dry run on stand-in checkpoints, and once for real); an
old-format checkpoint is probed through the safe load, so one whose pickle would run
a command is refused (the command does not run), not taken for a cut-short file.
"""
import os
import shlex
import shutil
import struct
import subprocess
import sys

import pytest

from conftest import REPO, run_script

PROCESSES = (1, 2, 8, 16)


def write_idx(path, sizes):
    """A fairseq mmap index (MMIDIDX, as fairseq's MMapIndexedDataset.Index.writer
    writes it: magic, version, dtype code, count, sizes, pointers) with these sentence
    sizes, and the matching .bin of int32 tokens."""
    import numpy as np

    sizes = np.asarray(sizes, dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1]) * 4]).astype(np.int64)
    with open(path, "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))  # version, dtype code: int32
        f.write(struct.pack("<Q", len(sizes)))
        f.write(sizes.tobytes() + pointers.tobytes())
    with open(path[:-len(".idx")] + ".bin", "wb") as f:
        f.write(np.full(int(sizes.sum()), 4, dtype=np.int32).tobytes())


def fake_data_bin(path, longest, src="en", tgt="de", train=None):
    """What train.sh reads of a data-bin: the dictionaries and the train/valid index
    files; the longest training pair has `longest` tokens (one longer pair exceeds
    fairseq's 1024 positions and is not counted). `train`: the (source, target)
    sizes of the training pairs instead."""
    os.makedirs(path, exist_ok=True)
    for lang in (src, tgt):
        with open(os.path.join(path, f"dict.{lang}.txt"), "w") as f:
            f.write("a 1\n")
    src_sizes, tgt_sizes = train or ([10, longest, 30, 2000], [12, longest - 5, 31, 1900])
    write_idx(os.path.join(path, f"train.{src}-{tgt}.{src}.idx"), src_sizes)
    write_idx(os.path.join(path, f"train.{src}-{tgt}.{tgt}.idx"), tgt_sizes)
    for lang in (src, tgt):
        write_idx(os.path.join(path, f"valid.{src}-{tgt}.{lang}.idx"), [5, 6])
    return str(path)


@pytest.fixture(scope="module")
def stub_env(tmp_path_factory):
    """PYTHON: this Python, except that the check of the fairseq-train arguments
    (which imports fairseq; the scripts run fairseq-localness-train-check as a module
    where PYTHON's directory does not have it) passes at once, reports STUB_HARDWARE
    (default "0 0 0": no CUDA GPU, no torch_xla) as the hardware, says what a
    --resume-from directory resumes from (the real check: train_check resume) and
    reports STUB_LONGEST (default 100) as the longest training pair; the architecture
    check passes at once too."""
    directory = tmp_path_factory.mktemp("stub")
    python = os.path.join(str(directory), "python")
    real = shlex.quote(sys.executable)
    with open(python, "w") as f:
        f.write('#!/bin/bash\n'
                'if [[ "$*" == *"fairseq_localness.cli.train_check args"* ]]; then\n'
                '    for a in "$@"; do\n'
                '        [[ "$a" == -- ]] && break\n'
                '        [[ "$a" == --hardware ]] && echo "hardware: ${STUB_HARDWARE:-0 0 0}"\n'
                f'        [[ "$a" == --resume-from=* ]] && {{ {real} -m fairseq_localness.cli.train_check resume '
                '"${a#--resume-from=}" || exit; }\n'
                '    done\n'
                '    [[ " $* " == *" --print-longest-pair "* ]] && echo "${STUB_LONGEST:-100}"\n'
                '    exit 0\n'
                'fi\n'
                '[[ "$*" == *"fairseq_localness.cli.train_check arch"* ]] && exit 0\n'
                f'exec {real} "$@"\n')
    os.chmod(python, 0o755)
    return {"PYTHON": python}


def config_batches():
    """{configuration: (EFFECTIVE_TOKENS, --max-tokens)} of every paper setting."""
    code = ('for f in "$1"/*.sh; do unset EFFECTIVE_TOKENS TRAIN_ARGS; . "$f"; mt=; prev=; '
            'for w in "${TRAIN_ARGS[@]}"; do [[ $prev == --max-tokens ]] && mt=$w; prev=$w; done; '
            'echo "$(basename "$f" .sh) $EFFECTIVE_TOKENS $mt"; done')
    out = subprocess.run(["bash", "-c", code, "-", os.path.join(REPO, "configs", "papers")],
                         capture_output=True, text=True, check=True).stdout
    return {name: (int(t), int(m)) for name, t, m in (line.split() for line in out.splitlines())}


def dry_run(data_bin, save_dir, processes, tokens, cap, env, *extra):
    return run_script("train.sh", [
        "--arch", "transformer", "--data-bin", data_bin, "--save-dir", save_dir, "--max-update", "10",
        "--src", "en", "--tgt", "de", "--cpu", "--gpus", str(processes), "--effective-tokens", str(tokens),
        "--dry-run", "--", "--max-tokens", str(cap), *extra], env=env, check=False)


def last(cmd, option):
    idx = [i for i, w in enumerate(cmd) if w == option]
    return cmd[idx[-1] + 1] if idx else None


def fairseq_command(stdout):
    line = next(l for l in stdout.splitlines() if "dry run, not training:" in l)
    return shlex.split(line.split("dry run, not training:", 1)[1])


def test_every_paper_batch_is_kept_on_1_2_8_and_16_processes(tmp_path, stub_env):
    batches = config_batches()
    assert len(batches) == 12 and batches["dc_wmt14_base"] == (4960, 4960)
    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    seen = {}
    for name, (tokens, cap) in sorted(batches.items()):
        for n in PROCESSES:
            if (tokens, cap, n) in seen:
                continue
            p = dry_run(data_bin, tmp_path / "ckpt", n, tokens, cap, stub_env)
            assert p.returncode == 0, (name, n, p.stderr)
            cmd = fairseq_command(p.stdout)
            m, u = int(last(cmd, "--max-tokens")), int(last(cmd, "--update-freq"))
            world = int(last(cmd, "--distributed-world-size"))
            assert world == n
            effective = m * world * u
            # the paper's batch: never above it, below it by less than one token per
            # process and accumulated batch (far under a percent), one process within the cap
            assert tokens - world * u < effective <= tokens and m <= cap, (name, n, m, u)
            assert f"{m} x {n} x {u} = {effective} tokens per update" in p.stderr
            assert "longest training pair: 100 tokens" in p.stderr
            if m < cap:  # validation keeps the configuration's batch
                assert last(cmd, "--max-tokens-valid") == str(cap)
            seen[(tokens, cap, n)] = (m, u)
    # the rows the issue measured: the DC batch and the 8 x 4096 batch on many GPUs
    assert seen[(4960, 4960, 8)] == (620, 1) and seen[(4960, 4960, 16)] == (310, 1)
    assert seen[(32768, 4096, 1)] == (4096, 8) and seen[(32768, 4096, 16)] == (2048, 1)
    assert seen[(25000, 3125, 1)] == (3125, 8) and seen[(25000, 3125, 16)] == (1562, 1)
    assert seen[(2048, 2048, 16)] == (128, 1) and seen[(4096, 4096, 8)] == (512, 1)
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("case", ["too_many_processes", "share_below_longest_pair", "cap_below_longest_pair"])
def test_no_possible_split_is_refused_naming_the_numbers(tmp_path, stub_env, case):
    data_bin = fake_data_bin(tmp_path / "bin", longest=200)
    processes, tokens, cap, fragments = {
        "too_many_processes": (16, 8, 8, ["a batch of 8 tokens per update cannot be split over 16 processes",
                                          "expected at most 8 processes"]),
        "share_below_longest_pair": (16, 2048, 2048, ["2048 tokens per update over 16 processes leaves 128 tokens "
                                                      "per process", "the longest training pair has 200 tokens",
                                                      "expected at most 10 processes"]),
        "cap_below_longest_pair": (1, 4096, 150, ["--max-tokens 150 is smaller than the longest training pair "
                                                  "(200 tokens)", "expected --max-tokens >= 200"]),
    }[case]
    p = dry_run(data_bin, tmp_path / "ckpt", processes, tokens, cap, dict(stub_env, STUB_LONGEST="200"))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("train.sh: error: --effective-tokens"), p.stderr
    for fragment in fragments:
        assert fragment in p.stderr, (fragment, p.stderr)
    assert "dry run, not training" not in p.stdout and not (tmp_path / "ckpt").exists()


# --------------------------------------------------------------------------- the longest pair
@pytest.mark.parametrize("check", ["console_script", "module"])
def test_the_longest_pair_is_read_with_fairseqs_own_reader_the_first_pair_included(tmp_path, check):
    """The longest training pair is the first one; a longer pair beyond the model's
    --max-source-positions is not counted (fairseq drops it before batching). Real dry
    runs: the sizes are read by fairseq's index reader, so each is where fairseq puts it
    (a reader with a header of its own, 8 bytes too long, read every size two entries
    late and never saw the first two pairs). The check runs as the console script
    fairseq-localness-train-check, or, where the Python's directory has none (an
    install older than the script), as its module."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    data_bin = fake_data_bin(tmp_path / "bin", 0, train=([150, 10, 30, 20, 40, 300], [140, 12, 31, 25, 41, 290]))
    # the stand-in is in fairseq's format: fairseq's reader gives its sizes back
    dataset = MMapIndexedDataset(os.path.join(data_bin, "train.en-de.en"))  # held: its sizes live in its map
    assert dataset.sizes.tolist() == [150, 10, 30, 20, 40, 300]
    del dataset
    env = None
    if check == "module":
        python = tmp_path / "python" / "python"
        python.parent.mkdir()
        python.write_text(f'#!/bin/bash\nexec {shlex.quote(sys.executable)} "$@"\n')
        python.chmod(0o755)
        env = {"PYTHON": str(python)}
    p = dry_run(data_bin, tmp_path / "ckpt", 1, 4096, 4096, env, "--max-source-positions", "200")
    assert p.returncode == 0, p.stderr
    assert "longest training pair: 150 tokens" in p.stderr, p.stderr
    # and it decides: 2048 tokens over 16 processes leave 128 per process, below the first pair
    p = dry_run(data_bin, tmp_path / "ckpt", 16, 2048, 2048, env, "--max-source-positions", "200")
    assert p.returncode == 2, p.stderr
    assert "the longest training pair has 150 tokens" in p.stderr and "expected at most 13 processes" in p.stderr
    assert not (tmp_path / "ckpt").exists()


# --------------------------------------------------------------------------- the preset
def bash_array(file, name):
    code = f'. "$1"; printf "%s\\n" "${{{name}[@]}}"'
    return subprocess.run(["bash", "-c", code, "-", file], capture_output=True, text=True,
                          check=True).stdout.splitlines()


def test_the_tiny_preset_is_the_demos_model_and_recipe_between_the_defaults_and_extra(tmp_path, stub_env):
    preset = bash_array(os.path.join(REPO, "configs", "presets", "tiny.sh"), "PRESET_ARGS")
    demo = os.path.join(REPO, "configs", "demo.sh")
    demo_train = bash_array(demo, "DEMO_TRAIN_ARGS")
    assert demo_train[:10] == ["--lr", "2e-3", "--warmup-updates", "100", "--clip-norm", "1.0", "--dropout", "0.1",
                               "--max-tokens", "2048"]
    assert preset == bash_array(demo, "DEMO_MODEL_ARGS") + demo_train[:10] + ["--num-workers", "0"]
    # and they cannot drift apart: the demo reads its model and learning-rate settings
    # from the preset, so a change there is a change of the demo
    configs = tmp_path / "configs"
    shutil.copytree(os.path.join(REPO, "configs"), configs)
    tiny = configs / "presets" / "tiny.sh"
    tiny.write_text(tiny.read_text().replace("--encoder-layers 2", "--encoder-layers 3").replace("--lr 2e-3",
                                                                                               "--lr 1e-3"))
    changed = bash_array(str(tiny), "PRESET_ARGS")
    assert changed != preset and "3" in changed and "1e-3" in changed
    assert changed == bash_array(str(configs / "demo.sh"), "DEMO_MODEL_ARGS") + \
        bash_array(str(configs / "demo.sh"), "DEMO_TRAIN_ARGS")[:10] + ["--num-workers", "0"]
    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    args = ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", tmp_path / "ckpt", "--max-update", "10",
            "--src", "en", "--tgt", "de", "--cpu", "--dry-run"]
    cmd = fairseq_command(run_script("train.sh", args + ["--preset", "tiny", "--", "--max-tokens", "1000"],
                                     env=stub_env).stdout)
    start = cmd.index("--tensorboard-logdir") + 2  # the last of the recipe's defaults
    assert cmd[start:start + len(preset)] == preset
    assert last(cmd, "--lr") == "2e-3" and last(cmd, "--encoder-embed-dim") == "64"
    assert last(cmd, "--max-tokens") == "1000"  # the arguments after -- win
    for bad in ("huge", "../tiny", "tiny.sh"):
        p = run_script("train.sh", args + ["--preset", bad], env=stub_env, check=False)
        assert p.returncode == 2
        assert p.stderr.startswith(f"train.sh: error: --preset: unknown preset '{bad}'; expected one of: tiny"), p.stderr
    assert not (tmp_path / "ckpt").exists()


# --------------------------------------------------------------------------- resumption
def save(path, updates, truncate_to=None):
    import torch

    torch.save({"model": {"w": torch.zeros(64, 64)}, "optimizer_history": [{"num_updates": updates}]}, path)
    if truncate_to is not None:
        with open(path, "r+b") as f:
            f.truncate(truncate_to)


def resume_dry_run(data_bin, save_dir, env):
    return run_script("train.sh", ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", save_dir,
                                   "--max-update", "10", "--src", "en", "--tgt", "de", "--cpu", "--dry-run"],
                      env=env, check=False)


def test_an_unreadable_checkpoint_last_resumes_from_the_newest_readable_one(tmp_path, stub_env):
    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    d = tmp_path / "ckpt"
    d.mkdir()
    for i, (name, updates) in enumerate([("checkpoint_1_2.pt", 2), ("checkpoint_1_4.pt", 4),
                                         ("checkpoint_best.pt", 2), ("checkpoint_avg_last2.pt", 3),
                                         ("checkpoint_last.pt", 4)]):
        save(d / name, updates)
        os.utime(d / name, (1000 + i, 1000 + i))  # written in this order
    os.utime(d / "checkpoint_best.pt", (999, 999))  # the best so far: an earlier update
    # readable: fairseq's own resume, nothing added
    p = resume_dry_run(data_bin, d, stub_env)
    assert p.returncode == 0, p.stderr
    assert f"resuming from {d}/checkpoint_last.pt" in p.stderr
    assert "--restore-file" not in fairseq_command(p.stdout)
    # cut short during a save: the newest readable checkpoint that fairseq wrote (not
    # the average, which has averaged weights)
    size = os.path.getsize(d / "checkpoint_last.pt")
    with open(d / "checkpoint_last.pt", "r+b") as f:
        f.truncate(size // 2)
    p = resume_dry_run(data_bin, d, stub_env)
    assert p.returncode == 0, p.stderr
    assert last(fairseq_command(p.stdout), "--restore-file") == str(d / "checkpoint_1_4.pt")
    assert f"{d}/checkpoint_last.pt cannot be read" in p.stderr and "checkpoint_1_4.pt (--restore-file)" in p.stderr
    # the newest one is broken too: the next
    save(d / "checkpoint_1_4.pt", 4, truncate_to=100)
    os.utime(d / "checkpoint_1_4.pt", (1003, 1003))
    p = resume_dry_run(data_bin, d, stub_env)
    assert last(fairseq_command(p.stdout), "--restore-file") == str(d / "checkpoint_1_2.pt")
    # none left: an error, and nothing is removed
    for name in ("checkpoint_1_2.pt", "checkpoint_best.pt"):
        os.remove(d / name)
    p = resume_dry_run(data_bin, d, stub_env)
    assert p.returncode == 2, p.stderr
    assert "checkpoint_last.pt cannot be read" in p.stderr and "no other checkpoint there can be read" in p.stderr
    assert sorted(os.listdir(d)) == ["checkpoint_1_4.pt", "checkpoint_avg_last2.pt", "checkpoint_last.pt"]


def test_the_argument_check_says_what_the_run_resumes_from_in_the_same_process(tmp_path, capsys):
    """``fairseq-localness-train-check args --resume-from DIR``, which train.sh runs
    where the run directory exists: the resume line once the arguments pass, then the
    longest pair (last); ``resume DIR`` gives the same line; nothing for bad
    arguments."""
    from fairseq_localness.cli.train_check import cli_main

    data_bin = fake_data_bin(tmp_path / "bin", longest=77)
    d = tmp_path / "ckpt"
    d.mkdir()
    argv = ["--", data_bin, "--task", "translation", "--source-lang", "en", "--target-lang", "de", "--arch",
            "transformer", "--save-dir", str(d)]
    expected = [("none", None), ("last", None), ("unreadable ", 100), (f"unreadable {d}/checkpoint_1_2.pt", 100)]
    for what, truncate in expected:
        if what == "last":
            save(d / "checkpoint_last.pt", 4)
        if what == "unreadable ":
            save(d / "checkpoint_last.pt", 4, truncate_to=truncate)
        if what.endswith(".pt"):
            save(d / "checkpoint_1_2.pt", 2)
        cli_main(["args", "--prog=train.sh", "--print-longest-pair", "--resume-from", str(d), *argv])
        assert capsys.readouterr().out.splitlines() == [f"resume: {what}", "77"]
        cli_main(["resume", str(d)])
        assert capsys.readouterr().out.splitlines() == [f"resume: {what}"]
    def no_listing(path):
        raise PermissionError(13, "Permission denied")

    with pytest.MonkeyPatch.context() as patch:  # (as root, a folder's mode does not stop os.listdir)
        patch.setattr(os, "listdir", no_listing)
        cli_main(["resume", str(d)])
    assert capsys.readouterr().out == (f"resume: refused cannot read the run directory '{d}' (Permission denied); "
                                       "expected a folder this user can list\n")
    with pytest.raises(SystemExit) as stop:
        cli_main(["args", "--prog=train.sh", "--resume-from", str(d), *argv, "--no-such-option"])
    assert stop.value.code == 2 and capsys.readouterr().out == ""


@pytest.mark.parametrize("hardware, args, expected", [
    ("1 8 0", ["--gpus", "2"], "train.sh: error: --gpus 2: this machine has 1 CUDA GPU(s); expected --gpus <= 1"),
    ("1 8 0", [], "--fp16"),
    ("1 6 0", [], None),  # compute capability 6: fp32
    ("0 0 1", [], "--bf16"),  # torch_xla, no CUDA GPU: fairseq's --bf16 trains on the TPU
    ("2 8 0", ["--cpu"], None),  # --cpu: the hardware is not asked
], ids=["too_few_gpus", "fp16_on_capability_8", "fp32_on_capability_6", "bf16_on_a_tpu", "cpu"])
def test_the_hardware_line_of_the_check_decides_gpus_and_precision(tmp_path, stub_env, hardware, args, expected):
    """train.sh reads the CUDA devices, the capability and torch_xla from the line
    'hardware: N CC XLA' of its one check process (the stub reports STUB_HARDWARE)."""
    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    p = run_script("train.sh", ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", tmp_path / "run",
                                "--max-update", "10", "--src", "en", "--tgt", "de", "--dry-run", *args],
                   env=dict(stub_env, STUB_HARDWARE=hardware), check=False)
    if expected and expected.startswith("train.sh: error"):
        assert p.returncode == 2 and p.stderr.startswith(expected), p.stderr
        return
    assert p.returncode == 0, p.stderr
    command = fairseq_command(p.stdout)
    precision = [w for w in command if w in ("--fp16", "--bf16")]
    assert precision == ([expected] if expected else []), command
    if expected == "--fp16":
        assert "precision: --fp16 (--precision auto; 1 CUDA GPU(s), compute capability 8.x)" in p.stderr, p.stderr


@pytest.mark.parametrize("slurm", [[], ["--slurm"]], ids=["here", "slurm"])
def test_a_run_directory_with_a_line_break_is_refused_before_anything_is_written(tmp_path, stub_env, slurm):
    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    save = tmp_path / "run\nx"
    p = run_script("train.sh", ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", save, "--max-update",
                                "10", "--src", "en", "--tgt", "de", "--cpu", *slurm], env=stub_env, check=False)
    assert p.returncode == 2 and p.stderr.startswith(
        f"train.sh: error: --save-dir: '{save}' has a line break; train.sh reads the run directory as one line: "
        "expected a directory without one"), p.stderr
    assert not save.exists()


@pytest.mark.parametrize("name", ["run%j", "run\\x"], ids=["percent", "backslash"])
def test_a_slurm_run_directory_that_sbatch_would_read_as_a_pattern_is_refused(tmp_path, stub_env, name):
    """sbatch expands '%j' in the job's log paths (SAVE_DIR/slurm/logs/...): with --slurm such a
    directory is refused before anything is written; a run here may have it."""
    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    save = tmp_path / name
    p = run_script("train.sh", ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", save, "--max-update",
                                "10", "--src", "en", "--tgt", "de", "--cpu", "--slurm"], env=stub_env, check=False)
    assert p.returncode == 2 and p.stderr.startswith(
        f"train.sh: error: --save-dir: '{save}' has a '%' or a backslash; sbatch reads the job's log paths"), p.stderr
    assert p.stderr.count("\n") == 1 and not save.exists()
    # a relative directory: its absolute path is checked
    (tmp_path / name).mkdir()
    p = run_script("train.sh", ["--arch", "transformer", "--data-bin", data_bin, "--save-dir", "run", "--max-update",
                                "10", "--src", "en", "--tgt", "de", "--cpu", "--slurm"], env=stub_env, check=False,
                   cwd=str(tmp_path / name))
    assert p.returncode == 2 and p.stderr.startswith(
        f"train.sh: error: --save-dir: '{tmp_path / name}/run' has a '%' or a backslash"), p.stderr
    assert os.listdir(tmp_path / name) == []


def test_the_hardware_line_names_devices_capability_and_xla(capsys):
    """``train_check args --hardware``: 'hardware: N CC XLA', whole numbers, XLA 0 or 1
    (on this machine: its own devices)."""
    import re as regex

    import torch

    from fairseq_localness.cli.train_check import cli_main

    cli_main(["args", "--prog=train.sh", "--hardware", "--", "data", "--task", "translation", "--arch", "transformer"])
    line, = capsys.readouterr().out.splitlines()
    n, cc, xla = regex.fullmatch(r"hardware: (\d+) (\d+) ([01])", line).groups()
    assert int(n) == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert (int(cc) > 0) == (int(n) > 0)


class _RunsCommand:
    """Unpickled, runs `touch MARKER` (what a malicious checkpoint would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def test_an_old_format_checkpoint_that_would_run_a_command_is_refused_not_passed_over(tmp_path, stub_env):
    """An old (non-zip) checkpoint_last.pt is probed by loading it, through the safe
    load: one whose pickle calls os.system stops train.sh with the refusal (the command
    does not run), rather than counting as cut short and resuming from an older
    checkpoint; with FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1 it is loaded on purpose."""
    import torch

    data_bin = fake_data_bin(tmp_path / "bin", longest=100)
    d = tmp_path / "ckpt"
    d.mkdir()
    marker = tmp_path / "ran"
    save(d / "checkpoint_1_2.pt", 2)
    torch.save({"model": {}, "args": _RunsCommand(str(marker))}, d / "checkpoint_last.pt",
               _use_new_zipfile_serialization=False)
    p = resume_dry_run(data_bin, d, stub_env)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("train.sh: error: --save-dir: "), p.stderr
    assert "refusing to load checkpoint" in p.stderr and f"{d}/checkpoint_last.pt" in p.stderr, p.stderr
    assert "FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS" in p.stderr
    assert not marker.exists() and "dry run" not in p.stdout
    p = resume_dry_run(data_bin, d, dict(stub_env, FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS="1"))
    assert p.returncode == 0, p.stderr
    assert f"resuming from {d}/checkpoint_last.pt" in p.stderr and marker.exists()


def test_a_truncated_checkpoint_last_resumes_a_real_run(tiny_data_bin, tmp_path):
    """Train 2 updates (a checkpoint per update), cut checkpoint_last.pt short as a kill
    during fairseq's copy would, rerun for 3 updates: it continues from update 2."""
    import torch

    save_dir = tmp_path / "ckpt"
    args = ["--arch", "transformer", "--data-bin", tiny_data_bin.data_bin, "--save-dir", save_dir,
            "--src", tiny_data_bin.src, "--tgt", tiny_data_bin.tgt, "--cpu", "--", "--encoder-layers", "1",
            "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
            "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
            "--decoder-attention-heads", "2", "--max-tokens", "512", "--num-workers", "0",
            "--save-interval-updates", "1", "--no-epoch-checkpoints", "--disable-validation"]
    run_script("train.sh", ["--max-update", "2"] + args)
    last_pt = save_dir / "checkpoint_last.pt"
    assert (save_dir / "checkpoint_1_2.pt").is_file()
    with open(last_pt, "r+b") as f:
        f.truncate(os.path.getsize(last_pt) // 3)
    with pytest.raises(Exception):
        torch.load(last_pt, map_location="cpu", weights_only=False)
    p = run_script("train.sh", ["--max-update", "3"] + args)
    log = p.stdout + p.stderr
    assert "resuming from the newest readable checkpoint" in p.stderr and "checkpoint_1_2.pt" in p.stderr
    assert "Loaded checkpoint" in log and "(epoch 1 @ 2 updates)" in log
    state = torch.load(last_pt, map_location="cpu", weights_only=False)  # readable again
    assert state["optimizer_history"][-1]["num_updates"] == 3


def test_help_promises_the_resume_and_the_split():
    text = run_script("train.sh", ["--help"]).stdout
    for fragment in ("newest readable checkpoint", "--effective-tokens T", "m x processes x u is at most T"):
        assert fragment in text, fragment


def test_a_fifo_or_folder_as_checkpoint_last_is_refused_without_waiting(tmp_path):
    """``checkpoint_last.pt`` that is a FIFO (opening it would wait for a writer) or a
    folder: the resume check refuses it at once, naming it; a FIFO among the older
    checkpoints is passed over as unreadable."""
    import threading

    from fairseq_localness.cli.train_check import resume_point

    d = tmp_path / "ckpt"
    d.mkdir()
    os.mkfifo(d / "checkpoint_last.pt")
    answer = []
    worker = threading.Thread(target=lambda: answer.append(resume_point(str(d))), daemon=True)
    worker.start()
    worker.join(20)
    assert answer and answer[0].startswith(f"refused {d}/checkpoint_last.pt is not a regular file"), answer
    os.remove(d / "checkpoint_last.pt")
    os.mkdir(d / "checkpoint_last.pt")
    assert resume_point(str(d)).startswith("refused ")
    os.rmdir(d / "checkpoint_last.pt")
    save(d / "checkpoint_last.pt", 4, truncate_to=100)
    os.mkfifo(d / "checkpoint_best.pt")
    answer.clear()
    worker = threading.Thread(target=lambda: answer.append(resume_point(str(d))), daemon=True)
    worker.start()
    worker.join(20)
    assert answer == ["unreadable "]
