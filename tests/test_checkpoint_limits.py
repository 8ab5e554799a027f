"""Crafted checkpoints: bounded memory and time, one line always, literals only.

Every file here is one a model zoo or a shared run directory could hold in place of
a checkpoint. Each is refused (or, for mutations that leave a valid checkpoint,
loaded) within seconds, before anything large is allocated, with one line naming
the file and the reason, and never a traceback or a hang, through the loader and
through fairseq's real command lines. fairseq's ``eval()`` of its settings parses
literals only (fairseq_localness.checkpoint.literals).
"""
import argparse
import collections
import contextlib
import io
import json
import math
import os
import random
import re
import struct
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
import torch

import forge
from conftest import (SCRIPTS, USER_DIR, get_tiny_data, parse_hypotheses, run_command, run_fairseq, tool_env, tool_path,
                      train_command)

from fairseq_localness.checkpoint import (CheckpointError, MalformedCheckpointError, UntrustedCheckpointError,
                                          torch_load_checkpoint)
from fairseq_localness.checkpoint import literals, scan, settings
from fairseq_localness.checkpoint.literals import NotALiteral, literal

SMALL_MODEL = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
               "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """A real transformer checkpoint trained with --eval-bleu (numpy statistics in it)."""
    data = get_tiny_data()
    save_dir = str(tmp_path_factory.mktemp("limits") / "run")
    run_fairseq("fairseq-train", train_command("transformer", data, save_dir, [
        "--eval-bleu", "--eval-bleu-args", '{"beam": 1, "max_len_b": 3}', "--best-checkpoint-metric", "bleu",
        "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints"], SMALL_MODEL, 2))
    return {"path": os.path.join(save_dir, "checkpoint_last.pt"), "data": data}


def refused(path, kind=CheckpointError, fragment=""):
    """The one-line refusal of ``path``, checked: its kind, the file, ``fragment``, time."""
    start = time.monotonic()
    with pytest.raises(CheckpointError) as e:
        torch_load_checkpoint(path, map_location="cpu")
    assert time.monotonic() - start < 10
    message = str(e.value)
    assert isinstance(e.value, kind), message
    assert "\n" not in message and message.startswith(f"refusing to load checkpoint '{path}': "), message
    assert fragment in message, message
    return message


# --------------------------------------------------------------------------- crafted files
def _pickle_of(path):
    return forge.data_pkl(path)


def _crafted(real, tmp, case):
    """(path, kind, fragment) of one crafted file."""
    r, out = real["path"], str(tmp / f"{case}.pt")
    m = str(tmp / "marker")
    if case == "bytearray of 2 GiB":  # 4 opcodes ask torch's allowed bytearray for 2 GiB
        ops = forge.pickle_ops(b"c__builtin__\nbytearray\n", b"J\xff\xff\xff\x7f", b"\x85R")
        return forge.as_checkpoint(ops, out, r), UntrustedCheckpointError, "it needs builtins.bytearray"
    if case == "STACK_GLOBAL of memoized strings":
        ops = forge.pickle_ops(forge.binunicode("os"), b"q\x00", forge.binunicode("system"), b"q\x01",
                               b"h\x00h\x01\x93", forge.binunicode(f"touch {m}"), b"\x85R")
        return forge.as_checkpoint(ops, out, r), UntrustedCheckpointError, "it needs os.system"
    if case == "INST":
        ops = forge.pickle_ops(b"(", forge.binunicode(f"touch {m}"), b"ios\nsystem\n")
        return forge.as_checkpoint(ops, out, r), UntrustedCheckpointError, "the opcode INST"
    if case == "OBJ":
        ops = forge.pickle_ops(b"(cos\nsystem\n", forge.binunicode(f"touch {m}"), b"o")
        return forge.as_checkpoint(ops, out, r), UntrustedCheckpointError, "it needs os.system"
    if case == "unknown opcode":
        return forge.as_checkpoint(b"\x80\x02\xff.", out, r), MalformedCheckpointError, "opcode b'\\xff' unknown"
    if case == "protocol-4 plain pickle":
        import pickle
        return forge.write(out, pickle.dumps({"model": {}}, protocol=4)), UntrustedCheckpointError, "a plain pickle"
    if case == "empty file":
        return forge.write(out, b""), MalformedCheckpointError, "it is empty"
    if case == "random bytes":
        return forge.write(out, random.Random(0).randbytes(4096)), MalformedCheckpointError, "not in torch.save's zip"
    if case == "cut short":
        data = forge.file_bytes(r)
        return forge.write(out, data[: len(data) // 2]), MalformedCheckpointError, "cut short"
    if case == "deflated pickle":
        return forge.repack(r, out, compress=("/data.pkl",)), UntrustedCheckpointError, "is compressed"
    if case == "no data.pkl":
        return forge.repack(r, out, drop=("/data.pkl",)), MalformedCheckpointError, "without torch's data.pkl"
    if case == "missing storage record":
        return forge.repack(r, out, drop=("/data/0",)), MalformedCheckpointError, "has no record"
    if case == "storage larger than its record":
        return forge.repack(r, out, replace={"/data/0": b"\0"}), MalformedCheckpointError, "its record holds 1"
    if case == "tensor repeated from one element":
        return (forge.tensor_file({"w": torch.ones(1).expand(10 ** 9)}, out), UntrustedCheckpointError,
                "more elements than its storage")
    if case == "numpy array of 10**10 elements":
        path = forge.tensor_file({"a": np.zeros(2, dtype=np.int64)}, tmp / "array.pt")
        data = _pickle_of(path).replace(b"K\x00\x85", b"J\x00\xe4\x0bT\x85")  # _reconstruct's shape (0,) -> (10**10,)
        return forge.as_checkpoint(data, out, path), MalformedCheckpointError, "_reconstruct called with anything"
    if case == "object array":
        return (forge.tensor_file({"a": np.array([1, "x"], dtype=object)}, out), UntrustedCheckpointError,
                "numpy array of dtype 'O8'")
    if case == "structured array":
        return (forge.tensor_file({"a": np.zeros(2, dtype=[("x", "i4")])}, out), UntrustedCheckpointError,
                "numpy array of dtype 'V4'")
    if case == "pickle of 17 MiB":
        state = forge.load_real(r)
        state["extra_state"]["blob"] = "x" * (17 << 20)
        torch.save(state, out)
        return out, UntrustedCheckpointError, "more than the 16777216 a fairseq checkpoint needs"
    if case == "a model larger than it stores":  # the positions' table is not stored: 5,000,000 x 16 floats
        def large(cfg):
            cfg["model"].max_source_positions = cfg["model"].max_target_positions = 5_000_000
        return (forge.with_settings(r, out, large), UntrustedCheckpointError,
                "its settings describe a model of more than")
    if case == "a cycle":
        loop = []
        loop.append(loop)
        return (forge.with_settings(r, out, lambda cfg: cfg["common"].__setitem__("x", loop)), UntrustedCheckpointError,
                "contains itself")
    if case == "settings bomb (2**40 values)":
        bomb = forge.shared_reference_bomb(40)
        return (forge.with_settings(r, out, lambda cfg: cfg["common"].__setitem__("x", bomb)), UntrustedCheckpointError,
                "its cfg expands to more than 10000 values")
    if case == "a class as a setting":
        return (forge.with_settings(r, out, forge.set_model_option("arch", zipfile.ZipFile)), UntrustedCheckpointError,
                "it needs zipfile.ZipFile")
    if case == "a namespace class as a value":
        return (forge.with_settings(r, out, lambda cfg: cfg["common"].__setitem__("x", argparse.Namespace)),
                UntrustedCheckpointError, "holds a type")
    if case == "unregistered architecture":
        return (forge.with_settings(r, out, forge.set_model_option("arch", "evil_arch")), UntrustedCheckpointError,
                "cfg.model.arch = 'evil_arch' names no registered architecture")
    if case == "unregistered task":
        return (forge.with_settings(r, out, lambda cfg: cfg["task"].__setitem__("_name", "evil_task")),
                UntrustedCheckpointError, "cfg.task._name = 'evil_task' names no registered task")
    if case == "unregistered criterion":
        return (forge.with_settings(r, out, lambda cfg: cfg["criterion"].__setitem__("_name", "evil")),
                UntrustedCheckpointError, "names no registered criterion")
    if case == "interpolation":
        return (forge.with_settings(r, out, lambda cfg: cfg["common"].__setitem__("log_file", "${oc.env:HOME}")),
                UntrustedCheckpointError, "cfg.common.log_file = '${oc.env:HOME}' is an OmegaConf interpolation")
    if case == "a second pickle named DATA.PKL":  # torch's reader would take it, ignoring case
        top = forge.members(r)[0][0].split("/")[0]
        ops = forge.pickle_ops(b"c__builtin__\nbytearray\n", b"J\xff\xff\xff\x7f", b"\x85R")
        return (forge.repack(r, out, add=[(f"{top}/DATA.PKL", ops)]), UntrustedCheckpointError,
                "have the same name (ignoring case)")
    if case == "a member outside the folder":
        return (forge.repack(r, out, add=[("other/data.pkl", b"")]), UntrustedCheckpointError,
                "is outside the folder")
    if case == "an escaped interpolation in legacy args":  # '\x24{' is '${' once read with ast.literal_eval
        return (forge.with_legacy_args(r, out, lambda a: setattr(a, "adam_betas", "'\\x24{oc.env:HOME}'")),
                UntrustedCheckpointError, "(or a literal of one)")
    if case == "namespaces fanned out":
        def fan(a):
            inner = [argparse.Namespace() for _ in range(5)]
            a.fan = [argparse.Namespace(x=inner) for _ in range(5)]
        return forge.with_legacy_args(r, out, fan), UntrustedCheckpointError, "more than 16 namespaces"
    if case == "a long list in legacy args":  # each value a hydra override: 40,000 took 5 minutes
        return (forge.with_legacy_args(r, out, lambda a: setattr(a, "update_freq", [1] * 2000)),
                UntrustedCheckpointError, "its args expands to more than 1000 values")
    if case == "bytes as a setting":
        return (forge.with_settings(r, out, lambda cfg: cfg["common"].__setitem__("x", b"${x}")),
                UntrustedCheckpointError, "its setting cfg.common.x is a bytes")
    if case == "a string as the iterator's position":
        return (forge.with_state(r, out, lambda st: st["extra_state"]["train_iterator"].__setitem__(
            "iterations_in_epoch", "x")), MalformedCheckpointError, "train_iterator is not fairseq's")
    if case == "weights that are a list":
        return (forge.with_state(r, out, lambda st: st.__setitem__("model", [1, 2])), MalformedCheckpointError,
                "its model is not a dict of named tensors")
    if case == "an unknown meter":
        def meter(st):
            st["extra_state"]["metrics"]["valid"][0] = (10, "loss", "OrderedDict", {})
        return forge.with_state(r, out, meter), MalformedCheckpointError, "its extra_state's metrics are not"
    if case == "no model entry":  # the size check counts the weights: a file without them has nothing to count
        def no_model(st):
            del st["model"]
            st["cfg"]["model"].max_source_positions = st["cfg"]["model"].max_target_positions = 5_000_000
        return forge.with_state(r, out, no_model), MalformedCheckpointError, "it holds no weights (no 'model' entry)"
    if case == "one storage under 300 names, a large model described":  # counted once, the size check refuses
        def many_names(st):
            shared = torch.zeros(1_000_000)
            st["model"].update((f"junk{i}", shared) for i in range(300))
            st["cfg"]["model"].max_source_positions = st["cfg"]["model"].max_target_positions = 5_000_000
        return (forge.with_state(r, out, many_names), UntrustedCheckpointError,
                "its settings describe a model of more than")
    if case == "overlapping views of one storage":
        base = torch.zeros(1000)
        return (forge.tensor_file({f"w{i}": base[i:i + 900] for i in range(300)}, out), UntrustedCheckpointError,
                "the distinct tensors built from one storage hold more elements together than")
    if case == "10**6 encoder layers":  # the meta build stops at the bound instead of building for an hour
        return (forge.with_settings(r, out, forge.set_model_option("encoder_layers", 10 ** 6)),
                UntrustedCheckpointError, "weights and buffers, far more than the")
    if case == "a literal of 10**10 values":
        return (forge.with_settings(r, out, forge.set_model_option("encoder_layers", "[[[0] * 100000] * 100000]")),
                UntrustedCheckpointError, "is not a Python literal (a literal of more than 100000 values")
    if case == "more zip members than a checkpoint needs":  # 150,000 empty tensors took 40 s
        top = forge.members(r)[0][0].split("/")[0]
        extra = [(f"{top}/data/x{i}", b"") for i in range(scan.MAX_RECORDS)]
        return forge.repack(r, out, add=extra), UntrustedCheckpointError, "members, more than the 10,000 storages"
    if case == "a FIFO":  # fairseq's own open() waited for a writer
        os.mkfifo(out)
        return out, MalformedCheckpointError, "it is a FIFO (named pipe), not a regular file"
    if case == "a directory":
        os.mkdir(out)
        return out, MalformedCheckpointError, "it is a directory, not a regular file"
    if case == "a character device":
        return "/dev/zero", MalformedCheckpointError, "it is a character device, not a regular file"
    if case == "an update count past 2**31":
        return (forge.with_state(r, out, lambda st: st["optimizer_history"][-1].__setitem__("num_updates", 2 ** 40)),
                MalformedCheckpointError, "num_updates = 1099511627776 is not an integer in 0 .. 2**31")
    if case == "an integer of 100 KB multiplied in a tensor's size":  # hours of math.prod before the fix
        big = b"\x8b" + struct.pack("<I", 100_000) + b"\x01" * 100_000 + b"q\x07"  # LONG4, BINPUT 7
        size = b"(" + b"h\x07" * 64 + b"K\x00t"  # (big, ..., big, 0): a size whose product has 64 factors
        ops = forge.pickle_ops(big, b"0", size)
        return forge.as_checkpoint(ops, out, r), UntrustedCheckpointError, "an integer of more than 64 bits"
    if case == "a best score of -inf":  # fairseq would never write checkpoint_best.pt again in the resumed run
        return (forge.with_state(r, out, lambda st: st.setdefault("extra_state", {}).__setitem__("best", -math.inf)),
                MalformedCheckpointError, "its extra_state's best is -inf, not a finite number")
    if case == "text encoded again and again":  # 600 bytes objects of 1 MB from a file of 1 MB, before the fix
        text = forge.binunicode("a" * 1_000_000) + forge.binunicode("latin1") + b"\x86q\x02"
        ops = forge.pickle_ops(b"]c_codecs\nencode\nq\x01", text, b"Ra(" + b"h\x01h\x02R" * 600 + b"e")
        return forge.as_checkpoint(ops, out, r), UntrustedCheckpointError, "encodes more bytes than it holds"
    if case == "code in adam_betas":
        code = forge.code_setting(m)
        return (forge.with_settings(r, out, lambda cfg: cfg["optimizer"].__setitem__("adam_betas", code)),
                UntrustedCheckpointError, "its setting cfg.optimizer.adam_betas = ")
    raise AssertionError(case)


CRAFTED = ["bytearray of 2 GiB", "STACK_GLOBAL of memoized strings", "INST", "OBJ", "unknown opcode",
           "protocol-4 plain pickle", "empty file", "random bytes", "cut short", "deflated pickle", "no data.pkl",
           "missing storage record", "storage larger than its record", "tensor repeated from one element",
           "numpy array of 10**10 elements", "object array", "structured array", "pickle of 17 MiB", "a cycle",
           "settings bomb (2**40 values)", "a class as a setting", "a namespace class as a value",
           "unregistered architecture", "unregistered task", "unregistered criterion", "interpolation",
           "code in adam_betas", "a second pickle named DATA.PKL", "a member outside the folder",
           "an escaped interpolation in legacy args", "namespaces fanned out", "a long list in legacy args",
           "bytes as a setting", "a string as the iterator's position", "weights that are a list",
           "an unknown meter", "no model entry", "overlapping views of one storage", "a literal of 10**10 values",
           "more zip members than a checkpoint needs", "a FIFO", "a directory", "a character device",
           "an update count past 2**31", "an integer of 100 KB multiplied in a tensor's size",
           "text encoded again and again", "a best score of -inf"]


@pytest.mark.parametrize("case", CRAFTED)
def test_a_crafted_checkpoint_is_refused_in_one_line(real, tmp_path, case):
    path, kind, fragment = _crafted(real, tmp_path, case)
    refused(path, kind, fragment)
    assert not (tmp_path / "marker").exists()


def test_a_zip_that_torch_and_python_read_differently_is_refused(tmp_path):
    """Two central directories back to back: Python's zipfile (the scan) would read a
    harmless checkpoint, torch's reader another, whose one weight is 10**6 copies of
    one value (a stride-0 view the scan refuses: here, 10**9 would take 4 GB)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # (the same file name: the same member names)
    harmless = forge.tensor_file({"model": collections.OrderedDict(w=torch.zeros(1))}, tmp_path / "a" / "w.pt")
    hidden = forge.tensor_file({"model": collections.OrderedDict(w=torch.zeros(1).expand(10 ** 6))},
                               tmp_path / "b" / "w.pt")
    path = forge.two_directories(harmless, hidden, tmp_path / "both.pt")
    assert zipfile.ZipFile(path).read("w/data.pkl") == forge.data_pkl(harmless)  # (what zipfile reads)
    assert torch.load(path, weights_only=True)["model"]["w"].shape == (10 ** 6,)  # (what torch reads)
    refused(path, UntrustedCheckpointError, "its zip directory is not where its end record says")


def test_torchs_reader_is_asked_where_each_member_lies(tmp_path):
    """The members Python's zipfile found, each against torch's reader: one that lies
    elsewhere for torch (here: zipfile's record moved by a byte) is refused."""
    path = forge.tensor_file({"w": torch.zeros(3)}, tmp_path / "w.pt")
    with open(path, "rb") as f:
        infos = zipfile.ZipFile(f).infolist()
        scan._same_members_for_torch(f, infos, path)
        infos[0].header_offset += 1
        with pytest.raises(UntrustedCheckpointError, match="torch's zip reader and Python's find its member"):
            scan._same_members_for_torch(f, infos, path)


def test_torchs_reader_must_read_the_pickle_checked(tmp_path):
    """The bytes torch's reader gives as the pickle are those checked (two zip64 end
    records, each reader following its own, let a stored pickle be checked and the
    same bytes inflated by torch into another pickle)."""
    path = forge.tensor_file({"w": torch.zeros(3)}, tmp_path / "w.pt")
    pickle = forge.data_pkl(path)
    with open(path, "rb") as f:
        reader = scan._same_members_for_torch(f, zipfile.ZipFile(f).infolist(), path)
        scan._same_pickle_for_torch(reader, pickle, path)
        with pytest.raises(UntrustedCheckpointError, match="torch's zip reader and Python's read different bytes as "
                                                           "its pickle"):
            scan._same_pickle_for_torch(reader, pickle[:-1] + b"!", path)


def test_a_member_name_torch_cannot_decode_is_one_line(tmp_path):
    """A member whose name is not UTF-8 (Python's zipfile reads it as cp437, torch's
    reader fails to decode it) is refused in one line, not with pybind's error."""
    path = forge.repack(forge.tensor_file({"w": torch.zeros(3)}, tmp_path / "w.pt"), tmp_path / "named.pt",
                        add=[("w/extraX", b"")])
    data = forge.file_bytes(path)
    assert data.count(b"w/extraX") == 2
    forge.write(path, data.replace(b"w/extraX", b"w/extra\xff"))
    refused(path, MalformedCheckpointError, "torch cannot read its zip directory")


def test_a_weight_tied_under_several_names_loads(real, tmp_path):
    """``state_dict()`` gives each name of a tied weight (``--share-all-embeddings``,
    ``--share-decoder-input-output-embed``) a tensor of its own over one storage: the
    same view under several names is one view, not overlapping ones."""
    def tie(state):
        weight = state["model"]["encoder.embed_tokens.weight"]
        for name in ("decoder.embed_tokens.weight", "decoder.output_projection.weight"):
            state["model"][name] = weight.detach()

    loaded = torch_load_checkpoint(forge.with_state(real["path"], tmp_path / "tied.pt", tie), map_location="cpu")
    model = loaded["model"]
    assert (model["decoder.output_projection.weight"].data_ptr() == model["decoder.embed_tokens.weight"].data_ptr()
            == model["encoder.embed_tokens.weight"].data_ptr())


def test_a_literal_is_bounded_by_what_it_builds():
    """Nested repetition builds what a walk or a copy reaches, not what it holds."""
    assert literal("[(512, 3)] * 20 + [(1024, 3)]") == [(512, 3)] * 20 + [(1024, 3)]
    assert len(literal("[[0] * 300] * 300")) == 300
    for text in ("[[[0] * 100000] * 100000]", "[[0] * 1000] * 1000", "('ab' * 1000,) * 1000",
                 "[" + ", ".join(["[0] * 9999"] * 11) + "]"):
        with pytest.raises(NotALiteral, match="a literal of more than 100000 values"):
            literal(text)


def test_the_bytes_scanned_are_the_bytes_loaded(real, tmp_path, monkeypatch):
    """A file rewritten between the scan and torch's load: the load reads the bytes
    the scan read, not the new ones."""
    from fairseq_localness.checkpoint import load

    path = forge.write(tmp_path / "model.pt", forge.file_bytes(real["path"]))
    other = forge.with_state(real["path"], tmp_path / "other.pt",
                             lambda st: st["extra_state"].__setitem__("rewritten", True))
    scanned = load.scanning.scan

    def scan_then_rewrite(container, name):
        scanned(container, name)
        forge.write(path, forge.file_bytes(other))  # in place, as another process could

    monkeypatch.setattr(load.scanning, "scan", scan_then_rewrite)
    state = torch_load_checkpoint(path)
    assert "rewritten" not in state["extra_state"]
    assert "rewritten" in torch_load_checkpoint(path)["extra_state"]  # (the file did change)


def test_fairseqs_own_opens_refuse_a_fifo_without_waiting(tmp_path):
    """fairseq opens checkpoints itself (load_checkpoint_to_cpu, the EMA's
    save_ema_as_checkpoint): a FIFO is refused, not waited on. (Were it waited on, a
    writer opened after 10 s ends the wait, and the test fails: it was waited on.)"""
    import threading

    from fairseq import checkpoint_utils

    fifo = str(tmp_path / "checkpoint.pt")
    os.mkfifo(fifo)

    waited = []

    def unblock():
        with contextlib.suppress(OSError):  # ENXIO: nothing waits on it
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            waited.append(True)

    for read in (checkpoint_utils.load_checkpoint_to_cpu,
                 lambda path: checkpoint_utils.save_ema_as_checkpoint(path, str(tmp_path / "ema.pt"))):
        timer = threading.Timer(10, unblock)
        timer.start()
        try:
            with pytest.raises(MalformedCheckpointError, match="it is a FIFO \\(named pipe\\), not a regular file"):
                read(fifo)
        finally:
            timer.cancel()
        assert not waited, read


def test_an_opcode_past_the_bound_is_refused(real, monkeypatch):
    """The scan's time is bounded by its count of opcodes (a one-layer checkpoint runs
    about 7,400)."""
    monkeypatch.setattr(scan, "MAX_OPCODES", 1000)
    refused(real["path"], UntrustedCheckpointError, "its pickle runs more than 1,000 opcodes")


MEMORY_SCRIPT = r"""
import json, resource, sys, time
import fairseq_localness
from fairseq_localness.checkpoint import CheckpointError, torch_load_checkpoint
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
results = {}
for path in sys.argv[1:]:
    start = time.monotonic()
    try:
        torch_load_checkpoint(path)
        results[path] = "loaded"
    except CheckpointError as e:
        results[path] = str(e)
    results[path + " seconds"] = time.monotonic() - start
results["grew_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(results))
"""


def _deflate_bomb(template, out, inflated=1 << 30):
    """``template`` with a data.pkl deflated from ``inflated`` zero bytes (about 1 MB on disk)."""
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in forge.members(template):
            if name.endswith("/data.pkl"):
                info = zipfile.ZipInfo(name)
                info.compress_type = zipfile.ZIP_DEFLATED
                with z.open(info, "w", force_zip64=True) as member:
                    chunk = bytes(1 << 20)
                    for _ in range(inflated >> 20):
                        member.write(chunk)
            else:
                z.writestr(zipfile.ZipInfo(name), data)
    return str(out)


def test_memory_bombs_are_refused_within_a_few_hundred_megabytes(real, tmp_path):
    """In a fresh process: each file would allocate gigabytes if it were read as it
    claims; the process grows by less than 300 MB over all of them."""
    files = [_crafted(real, tmp_path, case)[0] for case in (
        "bytearray of 2 GiB", "tensor repeated from one element", "numpy array of 10**10 elements",
        "settings bomb (2**40 values)", "storage larger than its record", "a second pickle named DATA.PKL")]
    files.append(_deflate_bomb(real["path"], tmp_path / "deflated_1GiB.pt"))
    proc = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, *files], capture_output=True, text=True,
                          env=tool_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.splitlines()[-1])
    for path in files:
        assert results[path].startswith(f"refusing to load checkpoint '{path}'"), results[path]
        assert results[path + " seconds"] < 10, results
    assert results["grew_mb"] < 300, results


CLI_CASES = ["INST", "cut short", "random bytes", "deflated pickle", "settings bomb (2**40 values)", "a cycle",
             "unregistered task", "interpolation", "a model larger than it stores", "no model entry",
             "one storage under 300 names, a large model described", "10**6 encoder layers", "a FIFO"]
MEMORY_LIMIT = 1536 << 20
"""The address space fairseq-generate is given to refuse a file (it translates the real
checkpoint within it)."""


@pytest.mark.parametrize("case", CLI_CASES)
def test_fairseq_generate_refuses_a_crafted_checkpoint_in_one_line(real, tmp_path, case):
    path, _, fragment = _crafted(real, tmp_path, case)
    data = real["data"]
    proc = run_command(["prlimit", f"--as={MEMORY_LIMIT}", "--", tool_path("fairseq-generate"), data.data_bin,
                        "--user-dir", USER_DIR, "--source-lang", "src", "--target-lang", "tgt", "--path", path,
                        "--gen-subset", "test", "--beam", "1", "--max-len-b", "3"], env=tool_env(), timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("fairseq-generate: error: ")]
    assert len(errors) == 1 and f"refusing to load checkpoint '{path}': " in errors[0] and fragment in errors[0]


def test_one_tensor_under_300_names_against_averaging(real, tmp_path):
    """Averaging sums each tensor once, however many names point at it: alone, the
    file averages within the memory limit into a file of its own size; newest among
    real checkpoints in average.sh --last 3, it is refused in one line."""
    def many_names(st):
        shared = torch.zeros(1_000_000)
        st["model"] = collections.OrderedDict((f"junk{i}", shared) for i in range(300))
    save_dir = tmp_path / "run"
    save_dir.mkdir()
    for epoch in (1, 2):
        forge.write(save_dir / f"checkpoint{epoch}.pt", forge.file_bytes(real["path"]))
    forged = forge.with_state(real["path"], save_dir / "checkpoint3.pt", many_names)
    limit = ["prlimit", f"--as={MEMORY_LIMIT}", "--"]
    alone = run_command(limit + [tool_path("fairseq-localness-average"), "--inputs", forged, "--output",
                                 tmp_path / "alone.pt"], env=tool_env(), timeout=120)
    assert alone.returncode == 0 and "Traceback" not in alone.stderr, alone.stderr[-3000:]
    assert os.path.getsize(tmp_path / "alone.pt") < 2 * os.path.getsize(forged)
    proc = run_command(limit + ["bash", os.path.join(SCRIPTS, "average.sh"), "--save-dir", save_dir, "--last", "3"],
                       env=tool_env(), timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "does not have the parameters of" in errors[0], proc.stderr[-3000:]


# --------------------------------------------------------------------------- mutations
def _mutants(path, count, seed=0):
    """``count`` mutants of the checkpoint ``path``, as bytes, with their kind: bits
    flipped anywhere in the file, bits flipped or opcodes swapped inside the pickle
    (repacked, so the zip's checksums hold and the pickle itself is tested), the file
    cut short."""
    import pickletools

    raw, pkl = forge.file_bytes(path), forge.data_pkl(path)
    positions = [pos for _, _, pos in pickletools.genops(pkl)]
    opcodes = sorted({pkl[p] for p in positions})
    rng = random.Random(seed)
    for i in range(count):
        kind = ("file bits", "pickle bits", "pickle opcode", "cut short")[i % 4]
        if kind == "file bits":
            data = bytearray(raw)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif kind == "cut short":
            data = raw[: rng.randrange(len(raw))]
        else:
            q = bytearray(pkl)
            if kind == "pickle bits":
                q[rng.randrange(len(q))] ^= 1 << rng.randrange(8)
            else:
                q[rng.choice(positions)] = rng.choice(opcodes)
            buf = io.BytesIO()
            forge.repack(path, buf, replace={"/data.pkl": bytes(q)})
            data = buf.getvalue()
        yield kind, bytes(data)


@pytest.mark.timeout(600)
def test_four_hundred_mutants_each_load_or_are_refused_in_one_line(real, tmp_path):
    outcomes = {}
    for i, (kind, data) in enumerate(_mutants(real["path"], 400)):
        start = time.monotonic()
        try:
            torch_load_checkpoint(data, map_location="cpu")
            outcome = "loaded"
        except CheckpointError as e:
            assert "\n" not in str(e) and str(e).startswith("refusing to load checkpoint '<checkpoint stream>': ")
            outcome = type(e).__name__
        assert time.monotonic() - start < 10, (i, kind)
        outcomes[(kind, outcome)] = outcomes.get((kind, outcome), 0) + 1
    # each kind of mutation was refused at least once, and some mutants are valid checkpoints still
    for kind in ("file bits", "pickle bits", "pickle opcode", "cut short"):
        assert any(k == kind and o != "loaded" for k, o in outcomes), outcomes
    assert sum(n for (k, o), n in outcomes.items() if o == "loaded") > 0, outcomes


@pytest.mark.timeout(600)
def test_mutants_through_fairseq_generate_translate_or_are_refused_in_one_line(real, tmp_path):
    """Mutants the loader accepts (a name or a number changed in the pickle) through
    fairseq-generate: each translates, or stops with one line (weights that no longer
    fit the model its settings describe), never a traceback."""
    data, chosen = real["data"], []
    for kind, mutant in _mutants(real["path"], 400, seed=1):
        if kind != "pickle bits":
            continue
        try:
            torch_load_checkpoint(mutant)
        except CheckpointError:
            continue
        chosen.append(forge.write(tmp_path / f"mutant{len(chosen)}.pt", mutant))
        if len(chosen) == 8:
            break
    outcomes = []
    for path in chosen:
        proc = run_fairseq("fairseq-generate", [data.data_bin, "--user-dir", USER_DIR, "--source-lang", "src",
                                                "--target-lang", "tgt", "--path", path, "--gen-subset", "test",
                                                "--beam", "1", "--max-len-b", "3"], check=False, timeout=120)
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if proc.returncode == 0:
            assert len(parse_hypotheses(proc.stdout)) == len(data.lines("test", "src"))
            outcomes.append("translated")
        else:
            errors = [line for line in proc.stderr.splitlines() if line.startswith("fairseq-generate: error: ")]
            assert len(errors) == 1 and f"refusing to load checkpoint '{path}'" in errors[0], proc.stderr[-2000:]
            outcomes.append("refused")
    assert len(outcomes) == 8


# --------------------------------------------------------------------------- literals
@pytest.mark.parametrize("text, value", [
    ("(0.9, 0.98)", (0.9, 0.98)), ("[(512, 3)] * 20 + [(1024, 3)]", [(512, 3)] * 20 + [(1024, 3)]),
    ("1e-8", 1e-8), ("-1", -1), ("10 ** -3", 10 ** -3), ("{'a': [1, 2]}", {"a": [1, 2]}), ("True", True),
    ("None", None), ("'10000,20000'", "10000,20000"), ("10000,20000", (10000, 20000)), ("1 - 1e-3", 1 - 1e-3),
])
def test_literal_parses_what_fairseq_settings_hold(text, value):
    assert literal(text) == value


@pytest.mark.parametrize("text, problem", [
    ("__import__('os').system('true')", "a call"), ("open('/etc/passwd')", "a call"), ("os.environ", "an attribute"),
    ("x", "a name"), ("[x for x in ()]", "a comprehension"), ("lambda: 0", "a lambda"), ("(1,) * 10 ** 9", "more than"),
    ("2 ** 10 ** 10", "power"), ("()" * 10_000 + "x", "longer than"), ("(" * 500 + ")" * 500, "Error"),
    ("f'{1}'", "f-string"), ("a[0]", "a subscript"), ("10 ** 999 * 10 ** 999", "bits"),
    ("[1] * 99999 + [1] * 99999", "more than"),
])
def test_literal_refuses_everything_else(text, problem):
    with pytest.raises(NotALiteral, match=re.escape(problem)):
        literal(text)


def test_the_build_bound_counts_the_threads_cpu_time_not_its_waits():
    """The last bound of a checkpoint's model build on ``meta`` is the building thread's
    CPU time: a build that waits (a loaded machine, an import) is not refused, one that
    computes past the bound is."""
    from fairseq_localness.checkpoint import model_size

    with model_size._bounded(10 ** 9, 10 ** 9, 0.2):
        time.sleep(0.5)
        torch.nn.Linear(2, 2, device="meta")  # registered 0.5 s later, little CPU time spent
    with pytest.raises(model_size._TooLarge, match=r"more than 0.2 s to build"):
        with model_size._bounded(10 ** 9, 10 ** 9, 0.2):
            end = time.thread_time() + 0.3
            while time.thread_time() < end:
                pass
            torch.nn.Linear(2, 2, device="meta")
    # the hooks are the process's: what another thread builds meanwhile is not counted
    import threading

    errors = []

    def other():
        try:
            torch.nn.Linear(1000, 1000, device="meta")
        except Exception as e:  # noqa: BLE001 - what the test looks for
            errors.append(e)

    with model_size._bounded(10, 2, 1.0):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert errors == []


def test_a_build_that_registers_nothing_is_stopped_by_the_timer():
    """Work a build does before it registers anything (fairseq's conversion of a
    Namespace of settings into hydra overrides within ``build_model``) is interrupted
    by a timer of CPU time in the main thread, through an ``except Exception`` of the
    code it interrupts; afterwards the timer and its handler are as they were."""
    import signal
    import threading

    from fairseq_localness.checkpoint import model_size

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the timer runs in the main thread only, and this test runs in another")
    handler = signal.getsignal(signal.SIGVTALRM)
    start = time.process_time()
    with pytest.raises(model_size._TooLarge, match=r"more than 0.2 s to build"):
        with model_size._bounded(10 ** 9, 10 ** 9, 0.2):
            while time.process_time() < start + 5:
                try:
                    sum(range(1000))
                except Exception:  # noqa: BLE001 - the build's own handlers do not stop it
                    pass
    assert time.process_time() - start < 2
    assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0) and signal.getsignal(signal.SIGVTALRM) == handler
    with model_size._bounded(10 ** 9, 10 ** 9, 0.2):  # a quick build: nothing fires later
        torch.nn.Linear(2, 2, device="meta")
    end = time.process_time() + 0.4
    while time.process_time() < end:
        pass
    assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0) and signal.getsignal(signal.SIGVTALRM) == handler
    # code that swallows one (a bare except) is interrupted again (every 0.2 s here)
    def spin():
        while time.process_time() < start + 5:
            sum(range(1000))

    swallowed = []
    with pytest.raises(model_size._TooLarge):
        with model_size._cpu_alarm(0.2, "past the bound"):
            start = time.process_time()
            try:
                spin()
            except BaseException:  # noqa: B036 - what the test looks for
                swallowed.append(time.process_time() - start)
            spin()
    assert len(swallowed) == 1 and 0.15 < swallowed[0] < time.process_time() - start < 2
    # a handler of someone else's: left alone, no timer (the registration hooks bound the build)
    monkey = signal.signal(signal.SIGVTALRM, lambda *a: None)
    try:
        with model_size._cpu_alarm(0.01, "past the bound"):
            assert signal.getitimer(signal.ITIMER_VIRTUAL) == (0.0, 0.0)
    finally:
        signal.signal(signal.SIGVTALRM, monkey)


def test_a_model_built_within_anothers_build_leaves_the_refusal_to_the_outermost(monkeypatch):
    """wav2vec 2.0's CTC model builds its pre-training model within its own build: a
    nested build past the bound lets the bound's exception through (an error there could
    be swallowed by the enclosing model's ``except Exception``), and the outermost build
    refuses the checkpoint in one line."""
    from fairseq_localness.checkpoint import TRUST_ENV, model_size
    from fairseq_localness.checkpoint.model_size import guarded_build_model, remember_weights

    def inner_build(cfg, task, from_checkpoint=False):
        return torch.nn.Linear(64, 64)  # (past the bound: the checkpoint stores 16 values)

    inner = guarded_build_model(inner_build)

    def outer_build(cfg, task, from_checkpoint=False):
        try:
            return inner(cfg, task, from_checkpoint=True)
        except Exception:  # noqa: BLE001 - the enclosing model's own handler, which must not stop it
            return torch.nn.Linear(1, 1)

    monkeypatch.setattr(model_size, "SLACK", 0)
    remember_weights({"model": {"w": torch.zeros(16)}}, "/runs/ckpt.pt")
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(UntrustedCheckpointError, match=r"^refusing to load checkpoint '/runs/ckpt.pt': its "
                                                       r"settings describe a model of more than 20 weight"):
        guarded_build_model(outer_build)({}, None, from_checkpoint=True)
    assert getattr(model_size._last, "building", 0) == 0

def test_fairseqs_eval_helpers_parse_literals_and_run_nothing(tmp_path):
    from fairseq import utils

    import fairseq_localness  # noqa: F401  (installs the literal eval)

    assert utils.eval_str_list("[1, 2]", type=int) == [1, 2]
    assert utils.eval_str_list("10000,20000", type=int) == [10000, 20000]
    assert utils.eval_bool("True") is True and utils.eval_str_dict("{'a': 1}") == {"a": 1}
    marker = tmp_path / "marker"
    with pytest.raises(NotALiteral, match="is not a Python literal"):
        utils.eval_str_list(forge.code_setting(marker), type=int)
    assert not marker.exists()
    # code outside fairseq keeps Python's eval, with its caller's namespaces
    local = 20
    assert eval("local + 1") == 21 and eval("x * 2", {"x": 4}) == 8
    assert eval.__module__ == "builtins" and eval.__name__ == "eval"


def test_a_setting_outside_the_list_is_refused_when_fairseq_evaluates_it(real, tmp_path, monkeypatch):
    """The load-time list of evaluated settings is the first line of defence; fairseq's
    eval is the second: with adaptive_softmax_cutoff left off the list, building the
    model refuses the checkpoint, naming the setting, and runs nothing."""
    from fairseq import checkpoint_utils

    marker = tmp_path / "marker"
    path = forge.with_settings(real["path"], tmp_path / "evil.pt",
                               forge.set_model_option("adaptive_softmax_cutoff", forge.code_setting(marker)))
    monkeypatch.setattr(settings, "EVALUATED_SETTINGS", settings.EVALUATED_SETTINGS - {"adaptive_softmax_cutoff"})
    with pytest.raises(UntrustedCheckpointError) as e:
        checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": real["data"].data_bin})
    assert str(e.value).startswith(f"refusing to load checkpoint '{path}': its setting "
                                   "cfg.model.adaptive_softmax_cutoff = ")
    assert "is not a Python literal (it holds a boolean operation)" in str(e.value)
    assert not marker.exists()


def _evaluated_in_fairseq_source():
    """Names of the settings fairseq's installed source passes to eval() or its eval
    helpers (``eval(cfg.adam_betas)``, ``utils.eval_str_list(args.x, ...)``)."""
    import fairseq

    root = os.path.dirname(fairseq.__file__)
    pattern = re.compile(r"\b(?:eval|eval_str_list|eval_str_dict|eval_bool)\(\s*(?:self\.)?"
                         r"(?:cfg|args|model_cfg|modality_cfg|override_args|common_eval)(?:\.\w+)*\.(\w+)\b")
    names = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "examples"]
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    names |= set(pattern.findall(f.read()))
    return names


def test_the_list_of_evaluated_settings_covers_fairseqs_source():
    found = _evaluated_in_fairseq_source()
    assert {"adam_betas", "adaptive_softmax_cutoff", "encoder_layers", "left_pad_source"} <= found
    assert found <= settings.EVALUATED_SETTINGS, found - settings.EVALUATED_SETTINGS


def test_a_user_dir_named_by_a_checkpoint_is_not_imported(real, tmp_path):
    """fairseq imports the --user-dir of the command line, never the one a checkpoint
    records: a checkpoint naming a directory of code translates, and the code does
    not run."""
    evil = tmp_path / "evil_plugin"
    evil.mkdir()
    marker = tmp_path / "marker"
    (evil / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    path = forge.with_settings(real["path"], tmp_path / "model.pt",
                               lambda cfg: cfg["common"].__setitem__("user_dir", str(evil)))
    data = real["data"]
    proc = run_fairseq("fairseq-generate", [data.data_bin, "--user-dir", USER_DIR, "--source-lang", "src",
                                            "--target-lang", "tgt", "--path", path, "--gen-subset", "test",
                                            "--beam", "1", "--max-len-b", "3"])
    assert len(parse_hypotheses(proc.stdout)) == len(data.lines("test", "src"))
    assert not marker.exists()


def test_the_allowlist_is_what_the_scan_and_torch_are_given():
    from fairseq_localness.checkpoint.load import allowed_globals

    given = set()
    for item in allowed_globals():
        obj, name = item if isinstance(item, tuple) else (item, f"{item.__module__}.{item.__qualname__}")
        given.add(name)
    assert {"argparse.Namespace", "numpy.ndarray", "numpy.dtype", "numpy._core.multiarray._reconstruct",
            "numpy.core.multiarray._reconstruct"} <= given
    assert {g for g in given if not g.startswith("numpy.dtypes.")} <= scan.GLOBALS
    assert literals.fairseq_eval is eval


def test_a_model_that_cannot_be_built_on_meta_is_refused_unless_trusted(monkeypatch):
    """A build that fails on ``meta`` part-way (wav2vec 2.0's initialisation does) leaves
    the model's size unknown: refused in one line naming the file, before the real
    build; built where the file is trusted."""
    from fairseq_localness.checkpoint import TRUST_ENV
    from fairseq_localness.checkpoint.model_size import guarded_build_model, remember_weights

    built = []

    def build_model(cfg, task, from_checkpoint=False):
        layer = torch.nn.Linear(4, 4)
        if layer.weight.is_meta:
            layer.weight.sum().item()  # (what an initialisation reading a value does on meta)
        built.append(layer)
        return layer

    remember_weights({"model": {"w": torch.zeros(16)}}, "/runs/ckpt.pt")
    guarded = guarded_build_model(build_model)
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(UntrustedCheckpointError) as e:
        guarded({}, None, from_checkpoint=True)
    message = str(e.value)
    assert message.startswith("refusing to load checkpoint '/runs/ckpt.pt': its model cannot be built on torch's "
                              "meta device") and "\n" not in message and built == []
    monkeypatch.setenv(TRUST_ENV, "1")
    assert isinstance(guarded({}, None, from_checkpoint=True), torch.nn.Linear) and len(built) == 1


def test_a_name_with_a_terminals_escape_sequences_is_shown_escaped():
    """A refusal quotes what the file chose (a member's name): control characters, a
    terminal's escape sequences among them, are shown as ``\\xNN``, never written."""
    error = CheckpointError("f.pt", "member 'a\x1b]52;c;aGk=\x07\x1b[2K\x9b' and a\ttab")
    assert "\x1b" not in str(error) and "\x07" not in str(error) and "\x9b" not in str(error)
    assert str(error) == "refusing to load checkpoint 'f.pt': member 'a\\x1b]52;c;aGk=\\x07\\x1b[2K\\x9b' and a tab"


def test_bart_builds_on_meta_for_the_size_check_and_then_for_real(monkeypatch):
    """fairseq's ``init_bert_params`` (BART, mBART, RoBERTa, wav2vec 2.0) reads values on
    the host, which a tensor on ``meta`` has none of: it is skipped in the build on
    ``meta``, so such a model is counted there (refused when too large) and built for
    real, untrusted, as before the refusal of models that fail on ``meta``."""
    from fairseq import options
    from fairseq.data import Dictionary
    from fairseq.models import build_model
    from fairseq.tasks.translation import TranslationTask

    from fairseq_localness.checkpoint import TRUST_ENV
    from fairseq_localness.checkpoint.model_size import _last, guarded_build_model

    monkeypatch.delenv(TRUST_ENV, raising=False)
    dictionary = Dictionary()
    for i in range(20):
        dictionary.add_symbol(f"w{i}")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        "/data", "--arch", "bart_base", "--task", "translation", "-s", "a", "-t", "b", "--encoder-layers", "1",
        "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"])
    task = TranslationTask(args, dictionary, dictionary)
    model = guarded_build_model(build_model)
    monkeypatch.setattr(_last, "file", "/runs/bart.pt", raising=False)
    monkeypatch.setattr(_last, "storages", 100, raising=False)
    monkeypatch.setattr(_last, "numel", 100_000, raising=False)
    built = model(args, task, from_checkpoint=True)
    assert not any(p.is_meta for p in built.parameters())
    from fairseq_localness.checkpoint import model_size

    monkeypatch.setattr(model_size, "SLACK", 0)  # (a model far larger than the file: refused)
    monkeypatch.setattr(_last, "numel", 10, raising=False)
    with pytest.raises(UntrustedCheckpointError, match="its settings describe a model of more than"):
        model(args, task, from_checkpoint=True)


def test_a_task_that_does_not_pass_from_checkpoint_on_still_has_its_model_checked(real, tmp_path):
    """fairseq passes ``from_checkpoint`` only to a task whose ``build_model`` names it:
    ``sentence_prediction_adapters`` builds its model without it. Within
    ``load_model_ensemble_and_task`` (here through the hub) the model is checked all the
    same: a RoBERTa of 1,500,000 learned positions (1.5 GB) from a file storing 4
    values is refused before it is allocated."""
    from fairseq.models.roberta import RobertaModel

    folder = tmp_path / "hub"
    (folder / "input0").mkdir(parents=True)
    (folder / "input0" / "dict.txt").write_text("a 1\nb 1\n")
    state = forge.load_real(real["path"])
    state["cfg"]["task"] = {"_name": "sentence_prediction_adapters", "data": str(folder), "num_classes": 1,
                            "regression_target": True, "classification_head_name": "x", "seed": 1,
                            "max_positions": 1_500_000}
    state["cfg"]["model"] = argparse.Namespace(_name="roberta", arch="roberta", encoder_layers=1,
                                               encoder_embed_dim=256, encoder_ffn_embed_dim=256,
                                               encoder_attention_heads=4)
    state["cfg"]["criterion"] = {"_name": "sentence_prediction", "classification_head_name": "x",
                                 "regression_target": True}
    for key in ("args", "last_optimizer_state", "criterion", "task_state"):
        state.pop(key, None)
    state["model"] = collections.OrderedDict(w=torch.zeros(4))
    torch.save(state, folder / "model.pt")
    start = time.monotonic()
    with pytest.raises(UntrustedCheckpointError, match="its settings describe a model of more than 16,777,221 weight"):
        RobertaModel.from_pretrained(str(folder), "model.pt")
    assert time.monotonic() - start < 20


def test_a_string_that_fairseq_reads_as_a_long_list_counts_its_values(real, tmp_path):
    """fairseq's upgrade of legacy ``args`` reads a string held by a field that is not a
    string with ``ast.literal_eval`` and writes the list into one hydra override, parsed
    in a time that grows with the square of its values (95,000 zeros in 190,000
    characters: ten minutes). Its values count toward the args' bound; a short one
    loads."""
    long = forge.with_legacy_args(real["path"], tmp_path / "long.pt",
                                  lambda a: setattr(a, "log_interval", "[" + ",".join(["0"] * 2000) + "]"))
    refused(long, UntrustedCheckpointError, "its args expand to more than 1000 values once fairseq reads their "
                                            "strings as literals")
    zeros = ",".join(["0"] * 2000)
    for name, change, where in (
            ("comment", lambda a: setattr(a, "log_interval", f"#x\n[{zeros}]"), "args expand"),
            ("continued", lambda a: setattr(a, "log_interval", f"\\\n[{zeros}]"), "args expand"),
            ("nested", lambda a: setattr(a, "inner", argparse.Namespace(log_interval=f"[{zeros}]")),
             "args.inner expands")):  # (the namespace that holds the list is named)
        path = forge.with_legacy_args(real["path"], tmp_path / f"{name}.pt", change)
        refused(path, UntrustedCheckpointError, f"its {where} to more than 1000 values")
    short = forge.with_legacy_args(real["path"], tmp_path / "short.pt",
                                   lambda a: setattr(a, "adam_betas", "(0.9, 0.98)"))
    assert torch_load_checkpoint(short, map_location="cpu")["args"].adam_betas == "(0.9, 0.98)"


def test_a_task_that_makes_its_data_from_its_settings_is_refused_wherever_named(real, tmp_path):
    """fairseq's benchmark tasks make their data when set up (``dummy_mt``: a dictionary
    of ``dict_size`` symbols in a Python loop; 8,000,000 took 14 s and 1.5 GB through the
    hub); the hub, the analyses and wav2vec 2.0's nested task set up the task a
    checkpoint names, so such a task is refused as the checkpoint's, as a nested
    model's and in legacy args; a nested task must be registered too; a nested
    translation task loads."""
    def nested(task):
        return lambda cfg: setattr(cfg["model"], "w2v_args", {"task": task, "model": {"_name": "wav2vec2"}})

    cases = [
        (forge.with_settings(real["path"], tmp_path / "own.pt",
                             lambda cfg: cfg["task"].update(_name="dummy_mt", dict_size=8_000_000)),
         "its setting cfg.task._name = 'dummy_mt' names one of fairseq's benchmark tasks"),
        (forge.with_settings(real["path"], tmp_path / "nested.pt", nested({"_name": "dummy_lm"})),
         "its setting cfg.model.w2v_args.task._name = 'dummy_lm' names one of fairseq's benchmark tasks"),
        (forge.with_legacy_args(real["path"], tmp_path / "args.pt", lambda a: setattr(a, "task", "dummy_masked_lm")),
         "its setting args.task = 'dummy_masked_lm' names one of fairseq's benchmark tasks"),
        (forge.with_settings(real["path"], tmp_path / "unknown.pt", nested({"_name": "no_such_task"})),
         "its setting cfg.model.w2v_args.task._name = 'no_such_task' names no registered task"),
        # fairseq's setup_task takes a section's "task" before its "_name", and a Namespace
        # within cfg becomes settings of its own, its "task" included
        (forge.with_settings(real["path"], tmp_path / "string.pt",
                             lambda cfg: cfg["task"].update(task="dummy_mt")),
         "its setting cfg.task.task = 'dummy_mt' names one of fairseq's benchmark tasks"),
        (forge.with_settings(real["path"], tmp_path / "namespace.pt",
                             lambda cfg: setattr(cfg["model"], "w2v_args", argparse.Namespace(task="dummy_mt"))),
         "its setting cfg.model.w2v_args.task = 'dummy_mt' names one of fairseq's benchmark tasks"),
        (forge.with_settings(real["path"], tmp_path / "unknown2.pt",
                             lambda cfg: setattr(cfg["model"], "w2v_args", argparse.Namespace(task="no_such"))),
         "its setting cfg.model.w2v_args.task = 'no_such' names no registered task"),
    ]
    for path, fragment in cases:
        refused(path, UntrustedCheckpointError, fragment)
    fine = forge.with_settings(real["path"], tmp_path / "fine.pt", nested({"_name": "translation"}))
    assert torch_load_checkpoint(fine, map_location="cpu")["cfg"]["model"].w2v_args["task"]["_name"] == "translation"


def test_the_meters_a_resumed_run_logs_with_are_fairseqs_and_bounded(real, tmp_path):
    """A resumed run logs with the meters its checkpoint holds: a rounding of -30,000,000
    made each log line compute 10**30000000 (35 s a line), a TimeMeter of 15,000-value
    tensors broadcast into 2.5 GB, and 40,000 meters in one aggregator took a minute to
    load. Each meter's state is fairseq's (its entries, numbers, a small rounding) and an
    aggregator holds at most MAX_METERS; the real checkpoint's meters load."""
    state = torch_load_checkpoint(real["path"], map_location="cpu")
    metrics = state["extra_state"]["metrics"]
    name, meters = next((n, m) for n, m in metrics.items() if any(x[2] == "AverageMeter" for x in m))
    index = next(i for i, x in enumerate(meters) if x[2] == "AverageMeter")
    key = meters[index][1]

    def meter(change):
        def mutate(st):
            priority, k, kind, values = st["extra_state"]["metrics"][name][index]
            st["extra_state"]["metrics"][name][index] = change(priority, k, kind, dict(values))
        return mutate

    cases = [
        (meter(lambda p, k, c, v: (p, k, c, dict(v, round=-30_000_000))),
         f"its extra_state's metrics {name}/{key} round is -30000000, not an integer from 0 to 20 or None"),
        (meter(lambda p, k, c, v: (p, k, "TimeMeter", {"init": torch.ones(100, 1), "n": torch.ones(100)})),
         f"its extra_state's metrics {name}/{key} holds arrays of the shapes [(100,), (100, 1)]"),
        (meter(lambda p, k, c, v: (p, k, c, dict(v, sum="0"))),
         f"its extra_state's metrics {name}/{key} sum is a str, not a number"),
        (meter(lambda p, k, c, v: (p, k, c, dict(v, extra=1))), f"not a AverageMeter's (count, round, sum, val)"),
        (meter(lambda p, k, c, v: (p, k, c, {"val": None})), "not a AverageMeter's"),
        (lambda st: st["extra_state"]["metrics"].update(zz=[(0, f"m{i}", "SumMeter", {"sum": 0, "round": None})
                                                            for i in range(settings.MAX_METERS + 1)]),
         "its extra_state's metrics 'zz' hold 1,001 meters, more than the 1,000 a resumed run logs"),
    ]
    for i, (change, fragment) in enumerate(cases):
        refused(forge.with_state(real["path"], tmp_path / f"m{i}.pt", change), MalformedCheckpointError, fragment)
    kinds = {x[2] for m in metrics.values() for x in m}
    arrays = [x for m in metrics.values() for x in m if isinstance(x[3].get("sum"), np.ndarray)]
    # (the real one's, of several kinds, --eval-bleu's arrays among them, loaded above)
    assert "AverageMeter" in kinds and len(kinds) > 1 and arrays

def test_a_namespace_within_cfg_is_bounded_as_args_are(real, tmp_path):
    """fairseq turns a Namespace anywhere in the settings into hydra overrides, not only
    the legacy ``args``: wav2vec 2.0's and HuBERT's fine-tuned models convert their
    ``cfg.model.w2v_args`` within ``build_model`` (a 62 KB checkpoint of
    ``wav2vec_ctc`` whose ``w2v_args.update_freq`` was 30,000 zeros held
    fairseq-generate past a minute). Each such Namespace is bounded as ``args`` are,
    its strings read as literals included, and named; the model's own Namespace too.
    A real checkpoint's model settings (about 230 values) load."""
    zeros = "[" + ",".join(["0"] * 2000) + "]"

    def nested(cfg):
        cfg["model"].w2v_args = argparse.Namespace(update_freq=zeros)

    path = forge.with_settings(real["path"], tmp_path / "nested.pt", nested)
    refused(path, UntrustedCheckpointError, "its cfg.model.w2v_args expands to more than 1000 values once fairseq "
                                            "reads their strings as literals")
    path = forge.with_settings(real["path"], tmp_path / "model.pt", forge.set_model_option("log_interval", zeros))
    refused(path, UntrustedCheckpointError, "its cfg.model expands to more than 1000 values once fairseq reads")
    wide = argparse.Namespace(**{f"x{i}": i for i in range(1200)})
    path = forge.with_settings(real["path"], tmp_path / "wide.pt", lambda cfg: cfg["task"].update(inner=[wide]))
    refused(path, UntrustedCheckpointError, "its cfg.task.inner[0] expands to more than 1000 values when copied")
    chars = forge.with_settings(real["path"], tmp_path / "chars.pt",
                                forge.set_model_option("comment", "x" * 250_000))
    refused(chars, UntrustedCheckpointError, "its cfg.model expands to more than 200000 characters when copied")
    small = forge.with_settings(real["path"], tmp_path / "small.pt",
                                lambda cfg: setattr(cfg["model"], "w2v_args", argparse.Namespace(update_freq="[1]")))
    assert torch_load_checkpoint(small, map_location="cpu")["cfg"]["model"].w2v_args.update_freq == "[1]"
