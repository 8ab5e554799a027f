"""Loading a checkpoint runs none of its code (fairseq_localness.checkpoint).

Real checkpoints of every kind (fairseq's transformer and every model of this
package; bf16 with EMA and this package's optimizer; --eval-bleu with early stopping
on BLEU, --report-accuracy and --keep-best-checkpoints; the fp16 optimizer's state
with its loss scale; update checkpoints with their optimizer state; an average; an
EMA extracted by fairseq) load, and name no global outside the allowlist. A
checkpoint that would run a command, by its pickle (``os.system``,
``subprocess.call``, ``builtins.exec``, ``builtins.eval``) or by a setting fairseq
evaluates (``adaptive_softmax_cutoff``), is refused through every entry point's real
command line, with one line naming what it needs or the setting, a non-zero exit
status and no marker; loaded on purpose (``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1``)
the pickle payload does run, which is what makes "no marker" mean something.
Crafted files (memory, malformed pickles, mutations): test_checkpoint_limits.py.
"""
import glob
import os
import pickletools
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from conftest import USER_DIR, get_tiny_data, parse_hypotheses, run_fairseq, run_script, tool_env, train_command
from forge import PAYLOADS, code_setting, data_pkl, load_real, set_model_option, with_payload, with_settings

from fairseq_localness.checkpoint import TRUST_ENV, UntrustedCheckpointError, torch_load_checkpoint, trusted, trusting
from fairseq_localness.checkpoint import scan

SMALL_MODEL = [
    "--encoder-layers", "1", "--decoder-layers", "1",
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
    "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
]
EVAL_BLEU = ["--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_b": 3}', "--eval-tokenized-bleu",
             "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", "--keep-best-checkpoints", "1",
             "--report-accuracy", "--no-epoch-checkpoints"]
RUNS = {
    # name: (arch, fairseq-train options, model options, updates)
    "transformer": ("transformer", ["--save-interval-updates", "1", "--no-epoch-checkpoints"], SMALL_MODEL, 2),
    # bf16 on the CPU, fairseq's EMA (kept in fp32) and this package's optimizer in one run
    "localness_bf16_ema": ("localness_transformer_tiny", [
        "--bf16", "--cpu", "--store-ema", "--ema-fp32", "--ema-start-update", "0", "--optimizer", "adam_l2",
        "--no-epoch-checkpoints"], [], 1),
    # early stopping on BLEU (Xu et al.'s drivers): numpy arrays of BLEU statistics in extra_state
    "hybrid_eval_bleu": ("hybrid_transformer_tiny", EVAL_BLEU, [], 1),
    # the fp16 optimizer's state (its loss scale), as --fp16 writes it on a GPU
    "hysan_fp16_state": ("hysan_transformer_tiny", ["--memory-efficient-fp16", "--cpu", "--no-epoch-checkpoints"],
                         [], 1),
    "dc": ("dc_transformer_tiny", ["--no-epoch-checkpoints"], [], 1),
}
HYDRA_MESSAGES = ("is no longer experimental", "version_base parameter is not specified",
                  "Usage of deprecated keyword in package header", "is validated against ConfigStore schema",
                  "The strict flag in the compose API is deprecated", "Hydra14MigrationWarning")
# torch's warnings about fairseq's calls (fairseq_localness.compat.torch_warnings)
TORCH_MESSAGES = ("'pin_memory' argument is set as true but no accelerator is found",
                  "`torch.cuda.amp.autocast(args...)` is deprecated",
                  "Support for mismatched key_padding_mask and attn_mask is deprecated")
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


def _globals_named(path):
    """Every global a checkpoint's pickle names, read with pickletools (independently
    of the package's scan)."""
    named = set()
    for op, arg, _ in pickletools.genops(data_pkl(path)):
        assert op.name != "STACK_GLOBAL", path  # torch.save writes protocol 2: GLOBAL only
        if op.name == "GLOBAL":
            named.add(scan.python3_name(*arg.split(" ", 1)))
    return named


def test_every_kind_of_real_checkpoint_loads_and_names_only_the_allowlist(real):
    kinds = real["kinds"]
    assert {"transformer/checkpoint_1_1.pt", "transformer/checkpoint_1_2.pt", "transformer/checkpoint_last.pt",
            "localness_bf16_ema/checkpoint_last.pt", "hybrid_eval_bleu/checkpoint_last.pt",
            "hybrid_eval_bleu/checkpoint_best.pt", "hysan_fp16_state/checkpoint_last.pt",
            "dc/checkpoint_last.pt"} <= set(kinds)
    assert any(k.startswith("hybrid_eval_bleu/checkpoint.best_bleu_") for k in kinds)  # --keep-best-checkpoints
    named = set()
    for kind, path in kinds.items():
        named |= _globals_named(path)
        state = torch_load_checkpoint(path, map_location="cpu")
        assert state["model"] and all(torch.is_tensor(v) for v in state["model"].values()), kind
    assert named <= scan.GLOBALS
    # nothing is allowed that no checkpoint names, but the other tensor types' storages
    # and numpy's functions under their numpy 1 names
    numpy1 = {"numpy.core.multiarray._reconstruct"}
    assert scan.GLOBALS - named <= set(scan.STORAGE_TYPES) | numpy1, scan.GLOBALS - named
    assert {"argparse.Namespace", "numpy.ndarray", "numpy.dtype"} <= named
    bleu = torch_load_checkpoint(kinds["hybrid_eval_bleu/checkpoint_last.pt"])
    counts = {name: meter for _, name, _, meter in bleu["extra_state"]["metrics"]["valid"]}["_bleu_counts"]
    assert counts["sum"].dtype.kind == "i" and counts["sum"].shape == (4,)
    assert bleu["cfg"]["checkpoint"]["best_checkpoint_metric"] == "bleu"
    bf16 = torch_load_checkpoint(kinds["localness_bf16_ema/checkpoint_last.pt"])
    assert bf16["cfg"]["common"]["bf16"]  # (fairseq writes the weights in fp32)
    assert "ema" in bf16["extra_state"] and bf16["optimizer_history"][-1]["optimizer_name"] == "FP16Optimizer"
    fp16 = torch_load_checkpoint(kinds["hysan_fp16_state/checkpoint_last.pt"])
    assert fp16["last_optimizer_state"]["loss_scale"] > 0
    assert "exp_avg" in str(torch_load_checkpoint(kinds["transformer/checkpoint_last.pt"])["last_optimizer_state"])


def test_every_real_checkpoint_builds_its_model_through_fairseq(real):
    """Through the patched fairseq.checkpoint_utils, as every fairseq entry point loads."""
    from fairseq import checkpoint_utils

    for name in RUNS:
        models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
            [real["kinds"][f"{name}/checkpoint_last.pt"]], arg_overrides={"data": real["data"].data_bin})
        assert cfg.model.arch == RUNS[name][0]


def test_fairseq_train_prints_no_line_a_user_cannot_act_on(real):
    """None of hydra's deprecation warnings, none of torch's warnings about fairseq's
    calls (its decoder's masks, its data loader's ``pin_memory`` on the CPU, its
    ``autocast``) and no DEBUG line, in a training log with every warning shown."""
    log = real["logs"]["transformer"]  # run with PYTHONWARNINGS=default
    for message in HYDRA_MESSAGES + TORCH_MESSAGES:
        assert message not in log, message
    assert not [line for line in log.splitlines() if line.startswith("DEBUG:")], log[-3000:]


def test_the_hydra_filter_hides_exactly_those_warnings():
    """In-process: fairseq's configuration prints hydra's deprecation warnings without
    the filter, none with it, and another warning still shows."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from fairseq_localness.compat.hydra_messages import filter_hydra_deprecation_warnings

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
    path = with_payload(real["kinds"]["transformer/checkpoint_last.pt"], tmp_path / "evil.pt", payload, marker)
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


def test_the_legacy_format_is_refused_in_one_line_and_loads_when_trusted(real, tmp_path, monkeypatch):
    """torch's pre-1.6 format allocates each storage at the size its pickle claims,
    before reading it: refused (fairseq-train writes the zip format)."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    state = load_real(real["kinds"]["transformer/checkpoint_last.pt"])
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(UntrustedCheckpointError, match=r"refusing to load checkpoint .*old.pt': it is in torch's "
                       r"legacy serialization format \(torch < 1.6\).*; if you trust this file, set "):
        torch_load_checkpoint(str(tmp_path / "old.pt"))
    with trusting():
        assert torch_load_checkpoint(str(tmp_path / "old.pt"))["model"]


def test_the_switch_takes_yes_or_no_only(monkeypatch, tmp_path):
    for value, expected in (("1", True), ("yes", True), ("0", False), ("", False)):
        monkeypatch.setenv(TRUST_ENV, value)
        assert trusted() is expected
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
EMA_SCRIPT = r"""
import sys
import fairseq_localness
from fairseq import checkpoint_utils
checkpoint_utils.save_ema_as_checkpoint(sys.argv[1], sys.argv[2])
"""
ANALYSIS_TOOLS = ("gates", "windows", "heatmaps", "divergence", "probing")


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
    if entry in ("fairseq-train --restore-file", "fairseq-train --finetune-from-model"):
        option = entry.split()[-1]
        return "fairseq", ("fairseq-train", train_command("transformer", data, str(work / "restore"),
                                                          [option, evil], SMALL_MODEL, 3))
    if entry == "from_pretrained":
        return "python", [sys.executable, "-c", HUB_SCRIPT, os.path.dirname(evil), os.path.basename(evil),
                          data.data_bin, USER_DIR]
    if entry == "save_ema_as_checkpoint":
        return "python", [sys.executable, "-c", EMA_SCRIPT, evil, str(work / "ema.pt")]
    if entry == "scripts/average.sh":
        save_dir = work / "avg"
        save_dir.mkdir()
        shutil.copy(real["kinds"]["transformer/checkpoint_1_1.pt"], save_dir / "checkpoint_1_1.pt")
        shutil.copy(evil, save_dir / "checkpoint_1_2.pt")
        return "script", ("average.sh", ["--save-dir", save_dir, "--last", "2", "--by", "update"])
    if entry == "fairseq-localness-average":
        return "fairseq", ("fairseq-localness-average", ["--inputs", evil, real["kinds"]["transformer/checkpoint_1_1.pt"],
                                                         "--output", work / "average.pt"])
    if entry == "scripts/evaluate.sh":
        return "script", ("evaluate.sh", ["--data-bin", data.data_bin, "--checkpoint", evil, "--src", "src",
                                          "--tgt", "tgt", "--ref", os.path.join(data.raw_dir, "test.tgt"),
                                          "--beam", "1", "--out", work / "eval", "--", "--max-len-b", "3"])
    if entry == "fairseq-localness-dump":
        return "fairseq", ("fairseq-localness-dump", [data.data_bin, "--path", evil, "--output", work / "dump.jsonl",
                                                      "--cpu"])
    tool = entry.split()[-1]
    if entry.startswith("fairseq-localness-analysis") and tool in ANALYSIS_TOOLS:
        extra = []  # what each tool checks before it loads the checkpoint
        if tool == "heatmaps":
            extra = ["--ids", "0"]
        elif tool == "probing":
            probe = work / "probe.txt"
            probe.write_text("".join(f"{split}\t{label}\ta b\n" for split in ("tr", "va", "te") for label in "01"))
            extra = ["--task", f"Probe={probe}", "--bpe", "none"]
        return "fairseq", ("fairseq-localness-analysis", [tool, data.data_bin, "--path", evil,
                                                          "--output-dir", work / tool, "--cpu", *extra])
    raise AssertionError(entry)


ENTRY_POINTS = {  # entry point: the pickle payload its checkpoint carries (each payload through several)
    "fairseq-generate": "os.system",
    "fairseq-interactive": "subprocess",
    "fairseq-train resuming checkpoint_last.pt": "exec",
    "fairseq-train --restore-file": "eval",
    "fairseq-train --finetune-from-model": "os.system",
    "from_pretrained": "subprocess",
    "save_ema_as_checkpoint": "exec",
    "scripts/average.sh": "exec",
    "fairseq-localness-average": "subprocess",
    "scripts/evaluate.sh": "eval",
    "fairseq-localness-dump": "os.system",
    **{f"fairseq-localness-analysis {tool}": "eval" for tool in ANALYSIS_TOOLS},
}
SETTINGS_ENTRY_POINTS = [  # where a setting fairseq evaluates would run (the model is built), and the average
    "fairseq-generate", "fairseq-interactive", "fairseq-train --restore-file", "fairseq-train --finetune-from-model",
    "from_pretrained", "fairseq-localness-average", "scripts/evaluate.sh", "fairseq-localness-dump",
    *(f"fairseq-localness-analysis {tool}" for tool in ANALYSIS_TOOLS)]


def _run(kind, command, env=None):
    if kind == "fairseq":
        return run_fairseq(*command, check=False, env=env, input="a\n")
    if kind == "script":
        return run_script(*command, check=False, env=env)
    return subprocess.run(command, capture_output=True, text=True, env=tool_env(env), timeout=300)


def _refused_in_one_line(proc, needs):
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    refusals = [line for line in proc.stderr.splitlines() if "refusing to load checkpoint" in line]
    assert len(refusals) == 1, proc.stderr[-3000:]
    assert needs in refusals[0], refusals[0]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return refusals[0]


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_malicious_pickle_is_refused_through_every_entry_point(real, tmp_path, entry):
    payload = ENTRY_POINTS[entry]
    marker = tmp_path / "marker"
    evil = with_payload(real["kinds"]["transformer/checkpoint_last.pt"], tmp_path / "model.pt", payload, marker)
    kind, command = _entry_command(entry, evil, real, tmp_path)
    line = _refused_in_one_line(_run(kind, command, env={TRUST_ENV: "0"}), f"it needs {PAYLOADS[payload][1]},")
    assert f"{TRUST_ENV}=1" in line
    assert not marker.exists()


@pytest.mark.parametrize("entry", SETTINGS_ENTRY_POINTS)
def test_a_setting_holding_code_is_refused_through_every_entry_point(real, tmp_path, entry):
    """A checkpoint of nothing but data whose ``adaptive_softmax_cutoff`` (evaluated by
    fairseq's transformer decoder) is a shell command: refused, naming the setting;
    trusting the file does not change that (the settings are not the pickle)."""
    marker = tmp_path / "marker"
    evil = with_settings(real["kinds"]["transformer/checkpoint_last.pt"], tmp_path / "model.pt",
                         set_model_option("adaptive_softmax_cutoff", code_setting(marker)))
    kind, command = _entry_command(entry, evil, real, tmp_path)
    trust = "1" if entry == "fairseq-generate" else "0"
    line = _refused_in_one_line(_run(kind, command, env={TRUST_ENV: trust}),
                                "its setting cfg.model.adaptive_softmax_cutoff = ")
    assert "is not a Python literal" in line and "fairseq evaluates that setting" in line
    assert f"{TRUST_ENV}=1" not in line  # trusting the file would not run it
    assert not marker.exists()


def test_with_the_switch_a_foreign_checkpoint_loads(real, tmp_path):
    """A checkpoint with a global outside the allowlist (harmless here) is refused by
    default and translates with FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1."""
    import fractions

    data = real["data"]
    state = load_real(real["kinds"]["transformer/checkpoint_last.pt"])
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
