"""Crafting hostile checkpoints for the tests of fairseq_localness.checkpoint.

Each function writes a file that a fairseq checkpoint could be replaced with by
whoever controls it (a model zoo, a shared run directory): a real checkpoint with a
payload in its pickle or its settings, a pickle rewritten opcode by opcode, a zip
repacked with a compressed or oversized member. Nothing here loads a file with full
unpickling except :func:`load_real`, which reads the test's own real checkpoints.
"""
import argparse
import os
import struct
import subprocess
import zipfile

import torch

MARKER_COMMAND = "touch '{marker}'"


def load_real(path):
    """A real checkpoint of the test's own, as a dict (numpy allowed for --eval-bleu)."""
    from fairseq_localness.checkpoint.load import allowed_globals

    with torch.serialization.safe_globals(allowed_globals()):
        return torch.load(path, map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------- pickle payloads
class OsSystem:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (MARKER_COMMAND.format(marker=self.marker),)


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


def with_payload(real_checkpoint, path, payload, marker):
    """``real_checkpoint`` with one more entry whose unpickling runs ``payload``."""
    state = load_real(real_checkpoint)
    state["extra_state"]["payload"] = PAYLOADS[payload][0](str(marker))
    torch.save(state, path)
    return str(path)


# --------------------------------------------------------------------------- settings payloads
def code_setting(marker) -> str:
    """A setting value that, evaluated, runs a shell command creating ``marker``."""
    return f"__import__('os').system({MARKER_COMMAND.format(marker=marker)!r}) and None"


def with_settings(real_checkpoint, path, change):
    """``real_checkpoint`` with ``change(cfg)`` applied to its settings (``cfg``: the
    dict fairseq saves, whose ``model`` is an ``argparse.Namespace``)."""
    state = load_real(real_checkpoint)
    change(state["cfg"])
    torch.save(state, path)
    return str(path)


def set_model_option(name, value):
    def change(cfg):
        setattr(cfg["model"], name, value)
    return change


def legacy_args(state):
    """``state`` as fairseq < 0.10 saved it: no ``cfg``, the model's settings as one
    ``argparse.Namespace`` in ``args`` (which fairseq upgrades through hydra)."""
    args = dict(vars(state["cfg"]["model"]))
    args.pop("_name", None)
    state["cfg"], state["args"] = None, argparse.Namespace(**args)
    return state


def with_legacy_args(real_checkpoint, path, change):
    """``real_checkpoint`` as a legacy ``args`` checkpoint, with ``change(args)`` applied."""
    state = legacy_args(load_real(real_checkpoint))
    change(state["args"])
    torch.save(state, path)
    return str(path)


def with_state(real_checkpoint, path, change):
    """``real_checkpoint`` with ``change(state)`` applied to the whole dict."""
    state = load_real(real_checkpoint)
    change(state)
    torch.save(state, path)
    return str(path)


def shared_reference_bomb(depth):
    """A value of ``depth`` levels, each a list holding the level below twice: a few
    bytes pickled, 2**depth values when copied."""
    value = ["x"]
    for _ in range(depth):
        value = [value, value]
    return value


# --------------------------------------------------------------------------- containers and pickles
def members(path):
    """The members of a torch.save zip: [(name, bytes)] in order."""
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def repack(path, out, replace=None, compress=None, drop=(), add=()):
    """Rewrite the zip ``path`` to ``out``: member bytes replaced by ``replace``
    ({suffix: bytes}), members whose name ends with a suffix in ``compress``
    deflated, members ending with a suffix in ``drop`` left out, members ``add``
    ([(name, bytes)]) appended."""
    replace, compress = replace or {}, compress or ()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in members(path):
            if any(name.endswith(s) for s in drop):
                continue
            for suffix, new in replace.items():
                if name.endswith(suffix):
                    data = new
            kind = zipfile.ZIP_DEFLATED if any(name.endswith(s) for s in compress) else zipfile.ZIP_STORED
            z.writestr(zipfile.ZipInfo(name), data, compress_type=kind)
        for name, data in add:
            z.writestr(zipfile.ZipInfo(name), data)
    return str(out)


def data_pkl(path) -> bytes:
    return next(data for name, data in members(path) if name.endswith("/data.pkl"))


def tensor_file(tensors, path):
    """A small torch.save file: {name: tensor}."""
    torch.save(dict(tensors), path)
    return str(path)


def pickle_ops(*ops) -> bytes:
    """A protocol-2 pickle from raw opcode bytes (``PROTO 2`` ... ``STOP``)."""
    return b"\x80\x02" + b"".join(ops) + b"."


def binunicode(text: str) -> bytes:
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data



def as_checkpoint(pickle_bytes, out, template):
    """``template`` (a torch.save file) with its pickle replaced by ``pickle_bytes``."""
    return repack(template, out, replace={"/data.pkl": pickle_bytes})


def file_bytes(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write(path, data: bytes):
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def _directory(infos, shift) -> bytes:
    """A zip central directory of ``infos`` (stored members), each local header moved
    by ``shift`` bytes."""
    out = b""
    for info in infos:
        name = info.filename.encode()
        out += struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 0, 20, 0, info.flag_bits & ~0x8, 0, 0, 0,
                           info.CRC, info.compress_size, info.file_size, len(name), 0, 0, 0, 0, 0,
                           info.header_offset + shift) + name
    return out


def two_directories(checked, loaded, out):
    """One file that is two torch.save zips (``checked``, ``loaded``: the paths of two
    files of the same member names and counts) with two central directories back to
    back: Python's zipfile, which takes the directory just before the end record and
    shifts every offset by the bytes before it, reads ``checked``'s members; a reader
    that takes the directory where the end record says reads ``loaded``'s."""
    data = {path: file_bytes(path) for path in (checked, loaded)}
    infos = {}
    for path in (checked, loaded):
        with zipfile.ZipFile(path) as z:
            infos[path] = (z.infolist(), z.start_dir)
    (shown, shown_dir), (hidden, hidden_dir) = infos[checked], infos[loaded]
    assert [i.filename.split("/", 1)[1] for i in shown] == [i.filename.split("/", 1)[1] for i in hidden]
    body = data[loaded][:hidden_dir]
    start = len(body)
    body += data[checked][:shown_dir]
    first = _directory(hidden, 0)
    second = _directory(shown, start - len(first))  # (zipfile's shift: the first directory's length)
    assert len(first) == len(second)
    where = len(body)
    body += first + second
    body += struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(hidden), len(hidden), len(second), where, 0)
    return write(out, body)
