"""Loading a checkpoint does not run its code (fairseq_localness.checkpoint).

Real checkpoints of every kind (fairseq's transformer and every model of this
package, bf16 with EMA and this package's optimizer, update checkpoints with their
optimizer state, an average, an EMA extracted by fairseq) load with
``weights_only=True`` and the allowlist, and need exactly it. A checkpoint whose
pickle would run a command (``os.system``, ``subprocess.call``, ``builtins.exec``,
``builtins.eval``: each writes a marker file) is refused through every entry point's
real command line, with one line naming what it needs, a non-zero exit status and no
marker; loaded on purpose (``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1``) the same file
does run, which is what makes "no marker" mean something.
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import USER_DIR, get_tiny_data, parse_hypotheses, run_fairseq, run_script, tool_env, train_command

from fairseq_localness import safe_load
from fairseq_localness.checkpoint import (TRUST_ENV, UntrustedCheckpointError, torch_load_checkpoint, trusting,
                                         unsafe_globals)

SMALL_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]
RUNS = {
    # name: (arch, fairseq-train options, model options, updates)
    "transformer": ("transformer", ["--save-interval-updates", "1", "--no-epoch-checkpoints"], SMALL_MODEL, 2),
    # bf16 on the CPU, fairseq's EMA (kept in fp32) and this package's optimizer in one run
    "localness_bf16_ema": ("localness_transformer_tiny", [
        "--bf16", "--cpu", "--store-ema", "--ema-fp32", "--ema-start-update", "0", "--optimizer", "adam_l2",
        "--no-epoch-checkpoints"], [], 1),
    "hybrid": ("hybrid_transformer_tiny", ["--no-epoch-checkpoints"], [], 1),
    "hysan": ("hysan_transformer_tiny", ["--no-epoch-checkpoints"], [], 1),
    "dc": ("dc_transformer_tiny", ["--no-epoch-checkpoints"], [], 1),
}
HYDRA_MESSAGES = ("is no longer experimental", "version_base parameter is not specified",
                  "Usage of deprecated keyword in package header", "is validated against ConfigStore schema",
                  "The strict flag in the compose API is deprecated", "Hydra14MigrationWarning")


# --------------------------------------------------------------------------- payloads
class OsSystem:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


class SubprocessCall(OsSystem):
    def __reduce__(self):
        return subprocess.call, (["touch", self.marker],)


class BuiltinsExec(OsSystem):
    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


class BuiltinsEval(OsSystem):
    def __reduce__(self):
        return eval, (f"open({self.marker!r}, 'w').close()",)


PAYLOADS = {"os.system": (OsSystem, "posix.system"), "subprocess": (SubprocessCall, "subprocess.call"),
            "exec": (BuiltinsExec, "builtins.exec"), "eval": (BuiltinsEval, "builtins.eval")}


def load_allowed(path):
    with torch.serialization.safe_globals([argparse.Namespace]):
        return torch.load(path, map_location="cpu", weights_only=True)


def malicious(real_checkpoint, path, payload, marker):
    """``real_checkpoint`` with one more entry whose unpickling runs ``payload``."""
    state = load_allowed(real_checkpoint)
    state["extra_state"]["payload"] = PAYLOADS[payload][0](str(marker))
    torch.save(state, path)
    return str(path)


# --------------------------------------------------------------------------- real checkpoints
@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Every kind of real checkpoint: {kind: path}, plus the transformer's train log
    (run with warnings shown)."""
    data = get_tiny_data()
    base = tmp_path_factory.mktemp("real_checkpoints")
    kinds, logs = {}, {}
    for name, (arch, extra, model_args, updates) in RUNS.items():
        save_dir = str(base / name)
        env = {"PYTHONWARNINGS": "default"} if name == "transformer" else None
        proc = run_fairseq("fairseq-train", train_command(arch, data, save_dir, extra, model_args, updates), env=env)
        logs[name] = proc.stderr
        for path in glob.glob(os.path.join(save_dir, "*.pt")):
            kinds[f"{name}/{os.path.basename(path)}"] = path
    from fairseq import checkpoint_utils

    from fairseq_localness.cli import average_checkpoints

    ema = str(base / "localness_bf16_ema" / "ema_extracted.pt")
    checkpoint_utils.save_ema_as_checkpoint(kinds["localness_bf16_ema/checkpoint_last.pt"], ema)
    kinds["ema extracted (save_ema_as_checkpoint)"] = ema
    avg = str(base / "transformer" / "average.pt")
    assert average_checkpoints.cli_main(["--inputs", str(base / "transformer"), "--num-update-checkpoints", "2",
                                         "--output", avg]) == 0
    kinds["average (fairseq-localness-average)"] = avg
    return {"kinds": kinds, "logs": logs, "base": base, "data": data}


def test_every_kind_of_real_checkpoint_loads_and_needs_exactly_the_allowlist(real):
    kinds = real["kinds"]
    assert {"transformer/checkpoint_1_1.pt", "transformer/checkpoint_1_2.pt", "transformer/checkpoint_last.pt",
            "localness_bf16_ema/checkpoint_last.pt", "hybrid/checkpoint_last.pt", "hysan/checkpoint_last.pt",
            "dc/checkpoint_last.pt"} <= set(kinds)
    needed = set()
    for kind, path in kinds.items():
        needed |= set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        assert unsafe_globals(path) == [], kind
        state = torch_load_checkpoint(path, map_location="cpu")
        assert state["model"] and all(torch.is_tensor(v) for v in state["model"].values()), kind
    # exactly what the allowlist holds: nothing more is allowed than some checkpoint needs
    assert needed == {"argparse.Namespace"} == {f"{g.__module__}.{g.__name__}" for g in safe_load.CHECKPOINT_GLOBALS}
    bf16 = torch_load_checkpoint(kinds["localness_bf16_ema/checkpoint_last.pt"])
    assert bf16["cfg"]["common"]["bf16"]  # (fairseq writes the weights in fp32)
    assert "ema" in bf16["extra_state"] and bf16["optimizer_history"][-1]["optimizer_name"] == "FP16Optimizer"
    assert "exp_avg" in str(torch_load_checkpoint(kinds["transformer/checkpoint_last.pt"])["last_optimizer_state"])


def test_every_real_checkpoint_builds_its_model_through_fairseq(real):
    """Through the patched fairseq.checkpoint_utils, as every fairseq entry point loads."""
    from fairseq import checkpoint_utils

    for name in RUNS:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [real["kinds"][f"{name}/checkpoint_last.pt"]], arg_overrides={"data": real["data"].data_bin})
        assert cfg.model.arch == RUNS[name][0]


def test_fairseq_train_prints_none_of_hydras_deprecation_warnings(real):
    log = real["logs"]["transformer"]  # run with PYTHONWARNINGS=default
    for message in HYDRA_MESSAGES:
        assert message not in log, message


def test_the_hydra_filter_hides_exactly_those_warnings():
    """In-process: fairseq's configuration prints hydra's deprecation warnings without
    the filter, none with it, and another warning still shows."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_localness.compat import filter_hydra_deprecation_warnings

    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, [get_tiny_data().data_bin, "--path", "x.pt"])
    for with_filter in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if with_filter:
                filter_hydra_deprecation_warnings()
            convert_namespace_to_omegaconf(args)
            warnings.warn("another deprecation", UserWarning)
        messages = [str(w.message) for w in caught]
        hydra = [m for m in messages if any(h in m for h in HYDRA_MESSAGES)]
        assert len(hydra) == (0 if with_filter else 6), messages
        assert "another deprecation" in messages


# --------------------------------------------------------------------------- in-process refusal
@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_a_payload_is_refused_before_it_runs_and_runs_when_trusted(real, tmp_path, payload, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    marker = tmp_path / "marker"
    path = malicious(real["kinds"]["transformer/checkpoint_last.pt"], tmp_path / "evil.pt", payload, marker)
    with pytest.raises(UntrustedCheckpointError) as e:
        torch_load_checkpoint(path)
    message = str(e.value)
    assert "\n" not in message and PAYLOADS[payload][1] in message and f"{TRUST_ENV}=1" in message
    assert message.startswith(f"refusing to load checkpoint '{path}': it needs {PAYLOADS[payload][1]},")
    with open(path, "rb") as f:  # as fairseq reads it: an open file, left where it was
        with pytest.raises(UntrustedCheckpointError):
            torch_load_checkpoint(f, map_location="cpu")
        assert f.tell() == 0
    assert not marker.exists()
    with trusting():  # the switch: full unpickling, the payload runs
        state = torch_load_checkpoint(path)
    assert marker.exists() and state["model"]
    assert TRUST_ENV not in os.environ  # restored


def test_a_legacy_format_payload_is_refused_by_the_weights_only_unpickler(real, tmp_path):
    marker = tmp_path / "marker"
    state = load_allowed(real["kinds"]["transformer/checkpoint_last.pt"])
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert torch_load_checkpoint(str(tmp_path / "old.pt"))["model"]  # a real one loads
    state["extra_state"]["payload"] = BuiltinsExec(str(marker))
    torch.save(state, tmp_path / "evil.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(UntrustedCheckpointError, match=r"refusing to load checkpoint .*evil.pt': it needs exec"):
        torch_load_checkpoint(str(tmp_path / "evil.pt"))
    assert not marker.exists()


def test_the_switch_takes_yes_or_no_only(monkeypatch, tmp_path):
    for value, expected in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv(TRUST_ENV, value)
        assert safe_load.trusted() is expected
    monkeypatch.setenv(TRUST_ENV, "maybe")
    with pytest.raises(ValueError, match=f"{TRUST_ENV}='maybe': expected 1"):
        torch_load_checkpoint(str(tmp_path / "x.pt"))
    with pytest.raises(TypeError, match="weights_only is decided by"):
        torch_load_checkpoint(str(tmp_path / "x.pt"), weights_only=False)


# --------------------------------------------------------------------------- every entry point
HUB_SCRIPT = r"""
import sys
from fairseq.models.transformer import TransformerModel
save_dir, name, data_bin, user_dir = sys.argv[1:]
model = TransformerModel.from_pretrained(save_dir, checkpoint_file=name, data_name_or_path=data_bin,
                                         user_dir=user_dir, beam=1, max_len_b=3)
print("LOADED", model.translate("a"))
"""


def _entry_command(entry, evil, real, work):
    """(runner, args) that load the checkpoint ``evil`` through ``entry``."""
    data = real["data"]
    lang = ["--source-lang", "src", "--target-lang", "tgt"]
    if entry == "fairseq-generate":
        return "fairseq", ("fairseq-generate", [data.data_bin, "--user-dir", USER_DIR, *lang, "--path", evil,
                                                "--gen-subset", "test", "--beam", "1", "--max-len-b", "3"])
    if entry == "fairseq-interactive":
        return "fairseq", ("fairseq-interactive", [data.data_bin, "--user-dir", USER_DIR, *lang, "--path", evil,
                                                   "--beam", "1", "--max-len-b", "3"])
    if entry == "fairseq-train resuming checkpoint_last.pt":
        save_dir = work / "resume"
        save_dir.mkdir()
        shutil.copy(evil, save_dir / "checkpoint_last.pt")
        return "fairseq", ("fairseq-train", train_command("transformer", data, str(save_dir), [], SMALL_MODEL, 3))
    if entry == "fairseq-train --restore-file":
        return "fairseq", ("fairseq-train", train_command("transformer", data, str(work / "restore"),
                                                          ["--restore-file", evil], SMALL_MODEL, 3))
    if entry == "from_pretrained":
        return "python", [sys.executable, "-c", HUB_SCRIPT, os.path.dirname(evil), os.path.basename(evil),
                          data.data_bin, USER_DIR]
    if entry == "scripts/average.sh":
        save_dir = work / "avg"
        save_dir.mkdir()
        shutil.copy(real["kinds"]["transformer/checkpoint_1_1.pt"], save_dir / "checkpoint_1_1.pt")
        shutil.copy(evil, save_dir / "checkpoint_1_2.pt")
        return "script", ("average.sh", ["--save-dir", save_dir, "--last", "2", "--by", "update"])
    if entry == "scripts/evaluate.sh":
        return "script", ("evaluate.sh", ["--data-bin", data.data_bin, "--checkpoint", evil, "--src", "src",
                                          "--tgt", "tgt", "--ref", os.path.join(data.raw_dir, "test.tgt"),
                                          "--beam", "1", "--out", work / "eval", "--", "--max-len-b", "3"])
    if entry == "fairseq-localness-analysis gates":
        return "fairseq", ("fairseq-localness-analysis", ["gates", data.data_bin, "--path", evil,
                                                          "--output-dir", work / "gates", "--cpu"])
    raise AssertionError(entry)


ENTRY_POINTS = {  # entry point: the payload its checkpoint carries (each payload through two)
    "fairseq-generate": "os.system",
    "fairseq-interactive": "subprocess",
    "fairseq-train resuming checkpoint_last.pt": "exec",
    "fairseq-train --restore-file": "eval",
    "from_pretrained": "subprocess",
    "scripts/average.sh": "exec",
    "scripts/evaluate.sh": "eval",
    "fairseq-localness-analysis gates": "os.system",
}


def _run(kind, command, env=None):
    if kind == "fairseq":
        return run_fairseq(*command, check=False, env=env, input="a\n")
    if kind == "script":
        return run_script(*command, check=False, env=env)
    return subprocess.run(command, capture_output=True, text=True, env=tool_env(env), timeout=300)


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_malicious_checkpoint_is_refused_through_every_entry_point(real, tmp_path, entry):
    payload = ENTRY_POINTS[entry]
    marker = tmp_path / "marker"
    evil = malicious(real["kinds"]["transformer/checkpoint_last.pt"], tmp_path / "model.pt", payload, marker)
    kind, command = _entry_command(entry, evil, real, tmp_path)
    proc = _run(kind, command, env={TRUST_ENV: "0"})
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    refusals = [line for line in proc.stderr.splitlines() if "refusing to load checkpoint" in line]
    assert len(refusals) == 1, proc.stderr[-3000:]
    assert f"it needs {PAYLOADS[payload][1]}," in refusals[0] and f"{TRUST_ENV}=1" in refusals[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not marker.exists()


def test_with_the_switch_a_foreign_checkpoint_loads(real, tmp_path):
    """A checkpoint with a global outside the allowlist (harmless here) is refused by
    default and translates with FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1."""
    import fractions

    data = real["data"]
    state = load_allowed(real["kinds"]["transformer/checkpoint_last.pt"])
    state["extra_state"]["note"] = fractions.Fraction(1, 3)
    path = str(tmp_path / "foreign.pt")
    torch.save(state, path)
    with pytest.raises(UntrustedCheckpointError, match="it needs fractions.Fraction,"):
        torch_load_checkpoint(path)
    proc = run_fairseq("fairseq-generate", [
        data.data_bin, "--user-dir", USER_DIR, "--source-lang", "src", "--target-lang", "tgt", "--path", path,
        "--gen-subset", "test", "--beam", "1", "--max-len-b", "3"], env={TRUST_ENV: "1"})
    assert len(parse_hypotheses(proc.stdout)) == len(data.lines("test", "src"))
    assert f"{TRUST_ENV}=1: loading checkpoints with full unpickling" in proc.stderr
