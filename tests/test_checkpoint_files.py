"""A checkpoint names no file; what it builds and translates with is checked up front.

fairseq reads some settings as paths (pretrained embeddings, a second checkpoint,
the hub's BPE and tokenizer files): from a checkpoint, none of them is opened
(fairseq_localness.checkpoint.files), and the files the hub does read beside a
checkpoint are regular, bounded and inside its folder. Sizes fairseq cannot build or
translate with and the NaN weights of a diverged run are refused when the checkpoint
is loaded, naming the setting or weight (fairseq_localness.checkpoint.values). With
the trust switch on, the settings are still bounded, and a refusal the switch cannot
help does not suggest it.

Each route goes through its real command line (the hub: a fresh interpreter calling
``from_pretrained``), with its memory capped at 1.5 GB (``prlimit --as``).
"""
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch

import forge
from conftest import (USER_DIR, get_tiny_data, parse_hypotheses, run_command, run_fairseq, tool_env, tool_path,
                      train_command)
from test_checkpoint_limits import SMALL_MODEL, refused

from fairseq_localness.checkpoint import MalformedCheckpointError, UntrustedCheckpointError, torch_load_checkpoint
from fairseq_localness.checkpoint import files
from fairseq_localness.checkpoint.errors import TRUST_ENV

MEMORY_CAP = ["prlimit", f"--as={1500 * 1024 * 1024}"]
LANGS = ["--source-lang", "src", "--target-lang", "tgt"]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real transformer checkpoint, and its translations of the test set."""
    data = get_tiny_data()
    save_dir = str(tmp_path_factory.mktemp("files") / "run")
    run_fairseq("fairseq-train", train_command("transformer", data, save_dir, ["--no-epoch-checkpoints"],
                                               SMALL_MODEL, 2))
    return {"path": os.path.join(save_dir, "checkpoint_last.pt"), "data": data}


def _generate(program, data, path, timeout=60, env=None):
    """``program`` (fairseq-generate or -interactive) on ``path``, memory capped."""
    args = [data.data_bin, "--user-dir", USER_DIR, *LANGS, "--path", path, "--beam", "1", "--max-len-b", "3"]
    if program == "fairseq-generate":
        args += ["--gen-subset", "test"]
    return run_command([*MEMORY_CAP, "--", tool_path(program), *args], env=tool_env(env), timeout=timeout,
                       input="\n".join(data.lines("test", "src", segmented=True)) + "\n")


def _one_line(proc, program, fragment):
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "refusing to load checkpoint" in line]
    assert len(errors) == 1 and errors[0].startswith(f"{program}: error: refusing to load checkpoint "), \
        proc.stderr[-3000:]
    assert fragment in errors[0], errors[0]
    return errors[0]


# --------------------------------------------------------------------------- the list of file settings
SETTING = r"(?:self\.)?(?:cfg|args|model_cfg|w2v_args|task_cfg|config|override_args|common_eval)(?:\.\w+)*\.(\w+)\b"
OPENS = re.compile(
    r"\b(?:open|cached_path|load_archive_file|load_checkpoint_to_cpu|load_model_ensemble(?:_and_task)?|"
    r"load_pretrained_component_from_model|load_embedding|parse_embedding|load_dictionary|load|load_align_dict|"
    r"np\.load|torch\.load|PathManager\.\w+|os\.path\.\w+|upgrade_state_dict_with_xlm_weights|load_sampling_weights|"
    r"SentencePieceProcessor|Load|from_pretrained|S2TDataConfig|S2SDataConfig)\(\s*(?:\[\s*)?(?:\w+\s*=\s*)?"
    r"(?:Path\()?" + SETTING)
PATH_LIKE = re.compile(r"(path|file|_dir|dir$|checkpoint|_from|json|yaml|dict$|_dict|model$|codes|vocab|merges|_bpe|"
                       r"lexicon|stats|root|manifest|url)")
NOT_FILES = {  # settings whose names look like a file's, read and found to name none
    "__dict__", "_asdict", "json", "yaml", "model", "best_checkpoint_metric", "checkpoint_activations",
    "checkpoint_suffix", "keep_best_checkpoints", "load_checkpoint_on_all_dp_ranks", "maximize_best_checkpoint_metric",
    "no_epoch_checkpoints", "no_last_checkpoints", "pipeline_checkpoint", "write_checkpoints_asynchronously",
    "eval_bleu_remove_bpe", "fp16_adam_stats", "input_from", "negatives_from_everywhere", "output_dictionary_size",
    "reset_dict", "target_dictionary", "tgt_dict_size", "enable_reservsed_directions_shared_datasets",
    "audio_root",  # a data config's (config.yaml in the data directory), not a setting
}


def _fairseq_source_settings():
    """(settings passed straight to a call that opens or loads a file, settings whose
    name looks like a file's), read from fairseq's installed source."""
    import fairseq

    opened, named = set(), set()
    for folder, dirs, names in os.walk(os.path.dirname(fairseq.__file__)):
        dirs[:] = [d for d in dirs if d != "examples"]
        for name in names:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    text = f.read()
                opened |= set(OPENS.findall(text))
                named |= {s for s in re.findall(r"\b" + SETTING, text) if PATH_LIKE.search(s)}
    return opened, named


def test_the_list_of_file_settings_covers_fairseqs_source():
    """Every setting fairseq opens as a file is unset from a checkpoint, kept inside
    the data directory, or one fairseq takes from its own command line only; a new
    one (or a new setting whose name looks like a file's) fails here until it is
    sorted into one of those lists."""
    opened, named = _fairseq_source_settings()
    known = set(files.FILE_SETTINGS) | files.DATA_RELATIVE | files.COMMAND_LINE_ONLY
    assert {"encoder_embed_path", "pretrained_checkpoint", "sentencepiece_model", "gpt2_encoder_json",
            "replace_unk"} <= opened
    assert opened <= known, opened - known
    assert named <= known | NOT_FILES, named - known - NOT_FILES
    assert not (set(files.FILE_SETTINGS) & (files.COMMAND_LINE_ONLY | files.DATA_RELATIVE))


# --------------------------------------------------------------------------- in the loader
def _fifo(path):
    os.mkfifo(path)
    return str(path)


def test_file_settings_are_unset_when_loaded_trusted_or_not(real, tmp_path, monkeypatch):
    """A FIFO, /dev/zero or a file descriptor number named by a setting is dropped
    (in cfg and in legacy args), and the refusals of a second checkpoint or a data
    file outside the data directory do not suggest trusting the file."""
    fifo = _fifo(tmp_path / "fifo")

    def change(cfg):
        cfg["model"].encoder_embed_path, cfg["model"].decoder_embed_path = fifo, 0
        cfg["bpe"] = {"_name": "sentencepiece", "sentencepiece_model": "/dev/zero"}
        cfg["generation"]["replace_unk"] = "/etc/passwd"

    path = forge.with_settings(real["path"], tmp_path / "cfg.pt", change)
    legacy = forge.with_legacy_args(real["path"], tmp_path / "args.pt",
                                    lambda args: setattr(args, "load_pretrained_decoder_from", fifo))
    for trust in ("0", "1"):
        monkeypatch.setenv(TRUST_ENV, trust)
        cfg = torch_load_checkpoint(path)["cfg"]
        assert not hasattr(cfg["model"], "encoder_embed_path") and not hasattr(cfg["model"], "decoder_embed_path")
        assert cfg["bpe"]["sentencepiece_model"] is None and cfg["generation"]["replace_unk"] is None
        assert not hasattr(torch_load_checkpoint(legacy)["args"], "load_pretrained_decoder_from")
    monkeypatch.setenv(TRUST_ENV, "0")
    real_cfg = forge.load_real(real["path"])["cfg"]
    assert real_cfg["model"].data == real_cfg["task"]["data"]  # (fairseq-train's copy of its arguments)
    real_cfg["model"].data = None  # a data directory but the task's: a nested task's, unset (test_checkpoint_archive)
    assert torch_load_checkpoint(real["path"])["cfg"] == real_cfg  # nothing else of a real checkpoint is dropped

    def fconv(cfg):
        cfg["model"].pretrained, cfg["model"].pretrained_checkpoint = "True", str(tmp_path / "self.pt")

    message = refused(forge.with_settings(real["path"], tmp_path / "self.pt", fconv), UntrustedCheckpointError,
                      "its setting cfg.model.pretrained = 'True' makes fairseq load a second checkpoint")
    assert TRUST_ENV not in message
    message = refused(forge.with_settings(real["path"], tmp_path / "yaml.pt",
                                          lambda cfg: cfg["task"].__setitem__("config_yaml", "../../etc/x.yaml")),
                      UntrustedCheckpointError, "its setting cfg.task.config_yaml = '../../etc/x.yaml' names a file "
                      "outside the data directory")
    assert TRUST_ENV not in message
    # how to translate is the command line's: the hub's first translate stopped on temperature 0 or min_len 1000
    generation = forge.with_settings(real["path"], tmp_path / "generation.pt", lambda cfg: cfg["generation"].update(
        temperature=0.0, min_len=1000, constraints="ordered"))
    legacy = forge.with_legacy_args(real["path"], tmp_path / "args_generation.pt",
                                    lambda args: setattr(args, "diverse_beam_groups", 3))
    assert torch_load_checkpoint(generation)["cfg"]["generation"] == real_cfg["generation"]
    assert not hasattr(torch_load_checkpoint(legacy)["args"], "diverse_beam_groups")
    # a language is part of a file name (dict.{lang}.txt): 'a/b' would read a FIFO in a folder beside the hub's
    message = refused(forge.with_settings(real["path"], tmp_path / "lang.pt",
                                          lambda cfg: cfg["task"].__setitem__("source_lang", "a/b")),
                      UntrustedCheckpointError, "its setting cfg.task.source_lang = 'a/b' holds a path separator")
    assert TRUST_ENV not in message
    refused(forge.with_legacy_args(real["path"], tmp_path / "pairs.pt",
                                   lambda args: setattr(args, "lang_pairs", ["src-tgt", "..\\x-tgt"])),
            UntrustedCheckpointError, "its setting args.lang_pairs = ")


def test_a_file_named_by_a_checkpoint_is_not_opened_by_fairseq_generate(real, tmp_path):
    """Pretrained embeddings named by the settings (a FIFO, which would hang
    fairseq-generate when opened, and /dev/zero, which would fill memory) are not
    read: the checkpoint translates with its stored weights, within the memory cap,
    and the log says which settings were not read."""
    data = real["data"]

    def change(cfg):
        cfg["model"].encoder_embed_path, cfg["model"].decoder_embed_path = _fifo(tmp_path / "fifo"), "/dev/zero"

    path = forge.with_settings(real["path"], tmp_path / "model.pt", change)
    proc = _generate("fairseq-generate", data, path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(parse_hypotheses(proc.stdout)) == len(data.lines("test", "src"))
    assert "not reading the files its settings name (cfg.model.decoder_embed_path, cfg.model.encoder_embed_path)" \
        in proc.stderr


HUB_SCRIPT = r"""
import json, sys, time
import fairseq_localness
from fairseq.models.transformer import TransformerModel
from fairseq_localness.checkpoint import CheckpointError
results = {}
for folder in sys.argv[1:]:
    start = time.monotonic()
    try:
        hub = TransformerModel.from_pretrained(folder, checkpoint_file="model.pt",
                                               user_dir=fairseq_localness.__path__[0], beam=1, max_len_b=3)
        results[folder] = "translated: " + hub.translate("a b")
    except CheckpointError as e:
        results[folder] = str(e)
    results[folder + " seconds"] = time.monotonic() - start
print(json.dumps(results))
"""


def test_the_hub_reads_only_bounded_regular_files_beside_the_checkpoint(real, tmp_path):
    """Through ``from_pretrained``, in one process capped at 1.5 GB: the BPE files a
    checkpoint's settings name are never read (sentencepiece's /dev/zero, gpt2's, a
    missing file); the files beside it are read only when regular, bounded and
    inside the folder (a FIFO, a link out of the folder, a 200 MB sparse file are
    refused); each refusal is one line within 10 seconds. With its sentencepiece
    model beside it, the checkpoint translates; and a checkpoint naming itself as
    fconv_self_att's pretrained checkpoint is refused instead of loading itself."""
    data = real["data"]
    spm = {"_name": "sentencepiece", "sentencepiece_model": "sentencepiece.bpe.model"}

    def folder(name, bpe=None, beside=None, change=None):
        where = tmp_path / name
        where.mkdir()
        for dictionary in ("dict.src.txt", "dict.tgt.txt"):
            shutil.copy(os.path.join(data.data_bin, dictionary), where)

        def settings(cfg):
            cfg["bpe"] = dict(bpe or spm)
            if change:
                change(cfg)

        forge.with_settings(real["path"], where / "model.pt", settings)
        if beside:
            beside(where / "sentencepiece.bpe.model")
        return str(where)

    def sparse(path):
        with open(path, "wb") as f:
            f.truncate(200 << 20)

    cases = {
        folder("beside", beside=lambda p: shutil.copy(data.spm_model, p)): "translated: ",
        folder("named_zero", {"_name": "sentencepiece", "sentencepiece_model": "/dev/zero"}):
            "the hub cannot build the bpe 'sentencepiece' its settings name",
        folder("named_missing", {"_name": "subword_nmt", "bpe_codes": "/nonexistent/codes"}):
            "the hub cannot build the bpe 'subword_nmt' its settings name",
        folder("gpt2", {"_name": "gpt2", "gpt2_encoder_json": "/dev/zero", "gpt2_vocab_bpe": "/etc/passwd"}):
            "the hub cannot build the bpe 'gpt2' its settings name",
        folder("fifo", beside=_fifo): "its file 'sentencepiece.bpe.model', which the hub reads, is not a regular file",
        folder("link", beside=lambda p: os.symlink("/dev/zero", p)):
            "its file 'sentencepiece.bpe.model', which the hub reads, is a link to '/dev/zero', outside",
        folder("large", beside=sparse): "its file 'sentencepiece.bpe.model', which the hub reads, is 209,715,200 bytes",
        folder("fconv", change=lambda cfg: (setattr(cfg["model"], "pretrained", "True"), setattr(
            cfg["model"], "pretrained_checkpoint", str(tmp_path / "fconv" / "model.pt")))):
            "its setting cfg.model.pretrained = 'True' makes fairseq load a second checkpoint",
    }
    proc = subprocess.run([*MEMORY_CAP, sys.executable, "-c", HUB_SCRIPT, *cases], capture_output=True, text=True,
                          env=tool_env(), timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    for where, fragment in cases.items():
        assert fragment in results[where] and "\n" not in results[where], (where, results[where])
        assert results[where + " seconds"] < 10, results
        assert "passwd" not in results[where] and "root:" not in results[where]
        if not fragment.startswith("translated"):
            assert results[where].startswith("refusing to load checkpoint "), results[where]
            assert TRUST_ENV not in results[where]


# --------------------------------------------------------------------------- building and translating
def test_impossible_sizes_and_diverged_weights_are_refused_when_loaded(real, tmp_path, monkeypatch):
    def nan(state):
        state["model"]["encoder.layers.0.fc1.weight"][0, 0] = float("nan")

    def inf_ema(state):
        state["extra_state"]["ema"] = {k: v.clone() for k, v in state["model"].items()}
        state["extra_state"]["ema"]["decoder.embed_tokens.weight"][1] = float("inf")

    cases = [
        (forge.with_settings(real["path"], tmp_path / "positions.pt",
                             forge.set_model_option("max_target_positions", 1)),  # no room for a word
         "its setting cfg.model.max_target_positions = 1 is not a size fairseq can build or translate with "
         "(a whole number of at least 2)"),
        (forge.with_legacy_args(real["path"], tmp_path / "dim.pt", lambda a: setattr(a, "encoder_embed_dim", "16")),
         "its setting args.encoder_embed_dim = '16' is not a size"),
        (forge.with_settings(real["path"], tmp_path / "heads.pt", forge.set_model_option("decoder_attention_heads", 3)),
         "its setting cfg.model.decoder_embed_dim = 16 is not a multiple of cfg.model.decoder_attention_heads = 3"),
        (forge.with_state(real["path"], tmp_path / "nan.pt", nan),
         "its weight encoder.layers.0.fc1.weight holds 1 NaN or infinite values (of 512): the training run that "
         "wrote it diverged"),
        (forge.with_state(real["path"], tmp_path / "ema.pt", inf_ema), "its EMA's weight decoder.embed_tokens.weight"),
    ]
    for trust in ("0", "1"):
        monkeypatch.setenv(TRUST_ENV, trust)
        for path, fragment in cases:
            assert TRUST_ENV not in refused(path, MalformedCheckpointError, fragment)


def test_a_weight_under_many_names_is_checked_for_nan_once(monkeypatch):
    """The finite check goes over each view of a storage once, however many names it
    has (130,000 names of one 10M-element tensor took an hour), and still over each
    view: a NaN in the second half of a storage whose halves are two weights is found."""
    from fairseq_localness.checkpoint import values

    calls = []
    isfinite = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: calls.append(t.numel()) or isfinite(t))
    shared = torch.zeros(1000)
    values.check_finite({"model": collections.OrderedDict((f"w{i}", shared) for i in range(500))}, "many.pt")
    assert calls == [1000]
    storage = torch.zeros(10)
    storage[7] = float("nan")
    halves = collections.OrderedDict(a=storage[:5], b=storage[5:], c=storage[:5])
    with pytest.raises(MalformedCheckpointError, match="its weight b holds 1 NaN or infinite values"):
        values.check_finite({"model": halves}, "halves.pt")


@pytest.mark.parametrize("program, change, fragment", [
    ("fairseq-generate", lambda s: setattr(s["cfg"]["model"], "max_source_positions", 0),
     "its setting cfg.model.max_source_positions = 0 is not a size"),
    ("fairseq-interactive", lambda s: s["model"]["decoder.output_projection.weight"].fill_(float("nan")),
     "its weight decoder.output_projection.weight holds 1,664 NaN or infinite values"),
])
def test_fairseq_refuses_what_would_fail_in_generation_in_one_line(real, tmp_path, program, change, fragment):
    """What used to load and then fail in generation with a traceback (every sentence
    too long for max_source_positions = 0; beam search on NaN scores) is refused
    before the model is built, in one line, within the memory cap."""
    path = forge.with_state(real["path"], tmp_path / "model.pt", change)
    start = time.monotonic()
    proc = _generate(program, real["data"], path)
    _one_line(proc, program, fragment)
    assert time.monotonic() - start < 60


# --------------------------------------------------------------------------- the trust switch
def test_with_the_switch_the_settings_are_still_bounded(real, tmp_path, monkeypatch):
    """Trusted, a cycle or 2**40 values by shared references in the settings are
    refused within seconds (the settings are walked whether or not the file is
    trusted), and neither refusal, trusted or not, suggests the switch."""
    state = forge.load_real(real["path"])
    loop = []
    loop.append(loop)
    state["cfg"]["model"].layers_note = loop
    cycle = str(tmp_path / "cycle.pt")
    torch.save(state, cycle)
    bomb = forge.with_settings(real["path"], tmp_path / "bomb.pt",
                               forge.set_model_option("note", forge.shared_reference_bomb(40)))
    for trust in ("1", "0"):
        monkeypatch.setenv(TRUST_ENV, trust)
        for path, fragment in ((cycle, "its cfg contains itself (a cycle)"),
                               (bomb, "its cfg expands to more than 10000 values when copied")):
            message = refused(path, UntrustedCheckpointError, fragment)
            assert TRUST_ENV not in message
    # a cycle outside the settings: the refusal suggests the switch, which does load it
    elsewhere = forge.with_state(real["path"], tmp_path / "extra.pt", lambda s: s["extra_state"].__setitem__("l", loop))
    assert f"set {TRUST_ENV}=1" in refused(elsewhere, UntrustedCheckpointError, "it contains itself (a cycle)")
    monkeypatch.setenv(TRUST_ENV, "1")
    real_cfg = forge.load_real(real["path"])["cfg"]
    real_cfg["model"].data = None  # (a data directory but the task's: unset, test_checkpoint_archive)
    assert torch_load_checkpoint(elsewhere)["cfg"] == real_cfg


def test_an_analysis_tool_reads_no_fifo_in_the_data_directory_a_checkpoint_records(real, tmp_path):
    """Given no data directory, an analysis tool reads the dictionaries of the one the
    checkpoint records: a FIFO there hung the task's setup; it is refused in one line."""
    from fairseq_localness.analysis.checkpoint import load_checkpoint

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(os.path.join(real["data"].data_bin, "dict.tgt.txt"), data)
    _fifo(data / "dict.src.txt")
    path = forge.with_settings(real["path"], tmp_path / "recorded.pt",
                               lambda cfg: cfg["task"].__setitem__("data", str(data)))
    start = time.monotonic()
    with pytest.raises(UntrustedCheckpointError) as e:
        load_checkpoint(path, cpu=True)
    assert time.monotonic() - start < 10 and "\n" not in str(e.value)
    assert "the dictionary 'dict.src.txt' in the data directory it records" in str(e.value), str(e.value)
    assert "is not a regular file" in str(e.value)
    # the split's data too (memory-mapped by fairseq: any size, but a regular file)
    os.remove(data / "dict.src.txt")
    shutil.copy(os.path.join(real["data"].data_bin, "dict.src.txt"), data)
    _fifo(data / "valid.src-tgt.src.idx")
    with pytest.raises(UntrustedCheckpointError, match=r"the data file 'valid.src-tgt.src.idx' in the data directory "
                                                       r"it records .* is not a regular file"):
        load_checkpoint(path, cpu=True)

