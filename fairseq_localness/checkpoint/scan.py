"""Reading a checkpoint's container and pickle without building anything from them.

Before torch's restricted unpickler builds a single object of a checkpoint,
:func:`scan` checks the file as data:

- **The container** (:func:`read_container`): torch's zip format as ``torch.save``
  writes it (one top folder, ``<top>/data.pkl``, ``<top>/data/<key>`` records),
  every member stored uncompressed (torch never compresses, so a deflated member,
  which could inflate to gigabytes, is refused before it is read), every member
  inside the file and no two overlapping, the pickle at most :data:`MAX_PICKLE_BYTES`.
- **The pickle** (:class:`_Machine`): its opcodes are run on a symbolic stack
  (strings, numbers and tuples as values, containers and tensors as markers), so
  that every global it names, every call it makes and the arguments of each call
  are known before anything is unpickled. Only what a fairseq checkpoint holds is
  allowed (:data:`CALLS`, :data:`STORAGE_TYPES`): tensors rebuilt from storages
  (``torch._utils._rebuild_tensor_v2``, each view inside its storage, and the views
  of one storage together no larger than it: a tensor under many names is one
  tensor, built once), ``collections.OrderedDict``, ``argparse.Namespace`` (the settings), and
  the numpy arrays of fairseq's BLEU statistics (``--eval-bleu``: numeric
  dtypes only, no object arrays, the bytes of each array exactly its size). Each
  storage must name a record of the container large enough for it.

Everything here reads bytes that are already in memory and at most as large as the
file; nothing is allocated from a size the file claims. Any failure is a
:class:`~fairseq_localness.checkpoint.errors.CheckpointError`: one line.
"""
import io
import math
import pickletools
import re
import struct
import zipfile
from typing import Dict, List

from fairseq_localness.checkpoint.errors import MalformedCheckpointError, UntrustedCheckpointError, short_error

MAX_PICKLE_BYTES = 16 * 1024 * 1024
"""The largest ``data.pkl`` read: a fairseq checkpoint's pickle holds the settings and
one small entry per tensor (about 31 KB for a one-layer transformer with its
optimizer state, a few hundred KB for a Transformer-big one); the weights are in the
``data/`` records, which have no such bound."""

MAX_RECORDS = 10_000
"""The most members (storages) a checkpoint's zip may hold, counted from its end record
before its directory is read: a Transformer-big checkpoint with Adam's moments and an
EMA copy holds about 1,000, a 48+48-layer one about 8,000; each costs the checks and
torch's unpickler about 0.3 ms (150,000 empty tensors took 40 s)."""
MAX_OPCODES = 400_000
"""The most opcodes the scan runs (torch's unpickler then runs as many): about 40 per
tensor with its name, 7,400 for a one-layer transformer with its optimizer state, about
40,000 for a Transformer-big one with an EMA copy; names pointing at one tensor cost a
file three opcodes each, and a pickle of 16 MiB of one-byte opcodes would be 16
million."""

MAX_TENSOR_DIMS = 64

STORAGE_TYPES = {
    "torch.FloatStorage": 4, "torch.DoubleStorage": 8, "torch.HalfStorage": 2, "torch.BFloat16Storage": 2,
    "torch.LongStorage": 8, "torch.IntStorage": 4, "torch.ShortStorage": 2, "torch.CharStorage": 1,
    "torch.ByteStorage": 1, "torch.BoolStorage": 1,
}
"""The storage types a checkpoint's tensors may have, with their element sizes."""

REBUILD_TENSOR = "torch._utils._rebuild_tensor_v2"
ORDERED_DICT = "collections.OrderedDict"
NAMESPACE = "argparse.Namespace"
CODECS_ENCODE = "_codecs.encode"
NUMPY_RECONSTRUCT = ("numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct")
NUMPY_NDARRAY = "numpy.ndarray"
NUMPY_DTYPE = "numpy.dtype"

CALLS = frozenset({REBUILD_TENSOR, ORDERED_DICT, CODECS_ENCODE, NUMPY_DTYPE, *NUMPY_RECONSTRUCT})
"""The globals a checkpoint's pickle may call (REDUCE); ``argparse.Namespace`` is
built by NEWOBJ, ``numpy.ndarray`` is only an argument of ``_reconstruct``, and the
storage types only name a storage's type."""

GLOBALS = frozenset(CALLS | {NAMESPACE, NUMPY_NDARRAY} | set(STORAGE_TYPES))
"""Every global a fairseq checkpoint names: what :func:`scan` allows, and what torch's
restricted unpickler is then given (see ``docs/security.md`` for how it was found)."""

NUMERIC_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex: never object ('O') or structured ('V')
LOCATION = re.compile(r"cpu|cuda(:\d{1,4})?|mps")


def python3_name(module: str, name: str) -> str:
    """A global as Python 3 calls it: protocol 2 writes some names as Python 2 had
    them (``__builtin__.eval``, ``commands.call``)."""
    import _compat_pickle

    if (module, name) in _compat_pickle.NAME_MAPPING:
        return ".".join(_compat_pickle.NAME_MAPPING[(module, name)])
    return f"{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}"


# --------------------------------------------------------------------------- the container
class Container:
    """What :func:`read_container` found: the top folder, the pickle's bytes and the
    sizes of the ``data/<key>`` records."""

    def __init__(self, top: str, pickle: bytes, records: Dict[str, int]):
        self.top, self.pickle, self.records = top, pickle, records


def read_container(f, name: str, size: int) -> Container:
    """Check the zip container of a ``torch.save`` file (see the module docstring) and
    read its pickle. ``f`` is a seekable binary file of ``size`` bytes."""
    try:
        end = zipfile._EndRecData(f)  # (the end record only: its count, before the directory is parsed)
        if end is not None and end[zipfile._ECD_ENTRIES_TOTAL] > MAX_RECORDS:
            raise UntrustedCheckpointError(
                name, f"its zip holds {end[zipfile._ECD_ENTRIES_TOTAL]:,} members, more than the {MAX_RECORDS:,} "
                "storages a fairseq checkpoint needs")
        z = zipfile.ZipFile(f)
        infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, IndexError, KeyError,
            UnicodeDecodeError, NotImplementedError) as e:
        raise MalformedCheckpointError(name, f"its zip directory cannot be read ({short_error(e)}): the file is cut "
                                       "short or is not a checkpoint") from None
    # zipfile looks for the directory just before the end record (data put before an
    # archive shifts every offset), torch's reader where the end record says: where the
    # two differ, each would read other members (a second directory), so they must agree
    if z.start_dir != end[zipfile._ECD_OFFSET]:
        raise UntrustedCheckpointError(
            name, f"its zip directory is not where its end record says (at byte {z.start_dir}, not "
            f"{end[zipfile._ECD_OFFSET]}), which torch.save never writes and which would let torch read other members "
            "than the ones checked")
    # torch's reader takes the folder of the first member as the archive's, and finds
    # members by name ignoring case, the later of two equal names winning: names must
    # be one folder's and unique ignoring case, or the pickle read is not the one scanned
    if not infos or "/" not in infos[0].filename:
        raise MalformedCheckpointError(name, "it is a zip file whose first member is in no folder: not a torch.save "
                                       "checkpoint")
    top = infos[0].filename.split("/", 1)[0]
    seen = {}
    for info in infos:
        if info.filename.split("/", 1)[0] != top:
            raise UntrustedCheckpointError(name, f"its member '{info.filename[:80]}' is outside the folder "
                                           f"'{top[:40]}' of its first member, which torch.save never writes")
        folded = info.filename.casefold()
        if folded in seen:
            raise UntrustedCheckpointError(
                name, f"its members '{seen[folded][:80]}' and '{info.filename[:80]}' have the same name (ignoring "
                "case), which torch.save never writes and which would let torch read another pickle than the one "
                "checked")
        seen[folded] = info.filename
    reader = _same_members_for_torch(f, infos, name)
    pickles = [i for i in infos if i.filename == f"{top}/data.pkl"]
    if len(pickles) != 1:
        raise MalformedCheckpointError(name, "it is a zip file without torch's data.pkl: not a torch.save checkpoint")
    spans = []
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise UntrustedCheckpointError(
                name, f"its member '{info.filename}' is compressed, which torch.save never does (a compressed "
                "member can inflate to far more than the file holds)")
        if info.flag_bits & 0x1:
            raise MalformedCheckpointError(name, f"its member '{info.filename}' is encrypted")
        if info.file_size != info.compress_size or info.header_offset + info.compress_size > size:
            raise MalformedCheckpointError(name, f"its member '{info.filename}' does not fit in the file "
                                           f"({size} bytes): the file is cut short or damaged")
        spans.append((info.header_offset, info.header_offset + 30 + len(info.orig_filename) + info.compress_size,
                      info.filename))
    if sum(info.file_size for info in infos) > size:
        raise UntrustedCheckpointError(name, f"its members hold more bytes than the file ({size} bytes): members "
                                       "share their bytes, which torch.save never writes")
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise UntrustedCheckpointError(name, f"its members '{first}' and '{second}' overlap, which torch.save "
                                           "never writes")
    if pickles[0].file_size > MAX_PICKLE_BYTES:
        raise UntrustedCheckpointError(
            name, f"its pickle is {pickles[0].file_size} bytes, more than the {MAX_PICKLE_BYTES} a fairseq "
            "checkpoint needs (its weights are stored beside it)")
    try:
        with z.open(pickles[0]) as member:
            data = member.read(MAX_PICKLE_BYTES + 1)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, KeyError, NotImplementedError) as e:
        raise MalformedCheckpointError(name, f"its pickle cannot be read ({short_error(e)}): the file is cut short or "
                                       "damaged") from None
    _same_pickle_for_torch(reader, data, name)
    prefix = top + "/data/"
    records = {i.filename[len(prefix):]: i.file_size for i in infos if i.filename.startswith(prefix)}
    return Container(top, data, records)


def _same_members_for_torch(f, infos, name: str):
    """That torch's own zip reader (the one ``torch.load`` reads with) finds the members
    zipfile found, each at the same place and of the same size, so that the pickle and
    the storages checked are the ones torch reads; torch's reader."""
    import torch

    position = f.tell()
    try:
        f.seek(0)
        reader = torch._C.PyTorchFileReader(f)
        records = set(reader.get_all_records())
        ours = {info.filename.split("/", 1)[1]: info for info in infos}
        differ = sorted(records ^ set(ours)) or sorted(
            record for record, info in ours.items()
            if (reader.get_record_header_offset(record), reader.get_record_size(record))
            != (info.header_offset, info.file_size))
    except (RuntimeError, ValueError) as e:  # (a name that is not UTF-8: pybind's UnicodeDecodeError)
        raise MalformedCheckpointError(name, f"torch cannot read its zip directory ({short_error(e)})") from None
    finally:
        f.seek(position)
    if differ:
        raise UntrustedCheckpointError(
            name, f"torch's zip reader and Python's find its member '{differ[0][:80]}' differently, which torch.save "
            "never writes and which would let torch read another member than the one checked")
    return reader


def _same_pickle_for_torch(reader, data: bytes, name: str) -> None:
    """That torch's reader reads the pickle that was read to be checked, byte for byte
    (its directory may say otherwise than Python's of how the bytes are stored: two
    zip64 end records, each reader following its own, let a stored pickle be checked
    and the same bytes inflated into another run; the size is the same, bounded)."""
    try:
        same = bytes(reader.get_record("data.pkl")) == data
    except (RuntimeError, ValueError) as e:
        raise MalformedCheckpointError(name, f"torch cannot read its pickle ({short_error(e)})") from None
    if not same:
        raise UntrustedCheckpointError(
            name, "torch's zip reader and Python's read different bytes as its pickle, which torch.save never "
            "writes and which would let torch unpickle another pickle than the one checked")


# --------------------------------------------------------------------------- the pickle
class _Mark:
    pass


_MARK = _Mark()


class _Global:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


class _Object:
    """A value the pickle builds that the scan does not compute (a container, a tensor,
    an array): ``kind`` says which; ``filled`` whether items were added to it."""
    __slots__ = ("kind", "filled", "info")

    def __init__(self, kind, info=None):
        self.kind, self.filled, self.info = kind, False, info


ALLOWED_OPCODES = frozenset({
    "PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP",
    "NONE", "NEWTRUE", "NEWFALSE", "INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4",
    "FLOAT", "BINFLOAT", "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8",
    "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
    "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "EMPTY_LIST", "LIST", "APPEND", "APPENDS",
    "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "EMPTY_SET", "ADDITEMS", "FROZENSET",
    "PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET",
    "GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "NEWOBJ", "BINPERSID",
})
"""The opcodes a checkpoint's pickle may hold: literals, containers, the memo, and the
calls checked below. Refused: INST and OBJ (calls the scan could not check), PERSID,
the extension registry (EXT1/2/4), NEWOBJ_EX, out-of-band buffers and BYTEARRAY8."""


class _Machine:
    """Runs a pickle's opcodes on a symbolic stack (see the module docstring).

    Longer than the project's 250 lines a class, on purpose: it is one interpreter,
    whose opcode handlers share the stack, the memo and the refusal rules; split
    into classes, each handler would reach into another's state, and the checks a
    reviewer must see together (what may be called, with which arguments, building
    what) would sit in different places.
    """

    def __init__(self, name: str, records: Dict[str, int]):
        self.name, self.records = name, records
        self.stack: List = []
        self.memo: Dict[int, object] = {}
        self.hooks: List[_Object] = []  # backward-hook dicts of tensors: must stay empty
        self.globals: List[str] = []  # refused globals, in order
        # the distinct views (offset, size, stride) built from each storage, and their elements together: a
        # view under several names (tied embeddings: state_dict() gives each name a tensor of its own over
        # one storage) is counted once
        self.views: Dict[str, set] = {}
        self.viewed: Dict[str, int] = {}

    # ---- helpers
    def refuse(self, reason):
        raise UntrustedCheckpointError(self.name, reason)

    def malformed(self, reason):
        self.refuse_globals()  # a pickle that names refused globals is refused for them first
        raise MalformedCheckpointError(self.name, f"its pickle is malformed ({reason})")

    def refuse_globals(self):
        if self.globals:
            self.refuse(f"it needs {', '.join(sorted(set(self.globals)))}, which a fairseq checkpoint does not hold "
                        "and which unpickling could use to run code")

    def pop(self):
        if not self.stack or self.stack[-1] is _MARK:
            self.malformed("an opcode takes more values than the stack holds")
        return self.stack.pop()

    def pop_mark(self):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i] is _MARK:
                items = self.stack[i + 1:]
                del self.stack[i:]
                return items
        self.malformed("no MARK for an opcode that needs one")

    def top(self):
        if not self.stack or self.stack[-1] is _MARK:
            self.malformed("an opcode needs a value on an empty stack")
        return self.stack[-1]

    def container(self, kinds):
        target = self.top()
        if not isinstance(target, _Object) or target.kind not in kinds:
            self.malformed("items added to something that is not a " + "/".join(kinds))
        return target

    # ---- the run
    def run(self, data: bytes):
        self.encodable = len(data)  # (the bytes _codecs.encode may give in all: see call)
        try:
            for count, (op, arg, _) in enumerate(pickletools.genops(io.BytesIO(data))):
                if count == MAX_OPCODES:
                    self.refuse(f"its pickle runs more than {MAX_OPCODES:,} opcodes, far more than a fairseq "
                                "checkpoint's")
                self.step(op.name, arg)
                if op.name == "STOP":
                    break
            else:
                self.malformed("it ends without STOP")
        except (ValueError, KeyError, IndexError, TypeError, struct.error, UnicodeDecodeError, EOFError,
                OverflowError, MemoryError, RecursionError) as e:
            self.malformed(short_error(e))
        self.refuse_globals()
        if any(h.filled for h in self.hooks):
            self.refuse("a tensor carries backward hooks, which a fairseq checkpoint never holds")
        if len(self.stack) != 1:
            self.malformed("values are left on the stack at STOP")

    def step(self, op, arg):  # noqa: C901  (one branch per opcode, as pickle's own loop)
        if op not in ALLOWED_OPCODES:
            self.refuse_globals()
            self.refuse(f"its pickle uses the opcode {op}, which torch.save never writes and which could call "
                        "what the scan cannot check")
        s = self.stack
        if op in ("PROTO", "FRAME", "STOP"):
            if op == "PROTO" and not 0 <= arg <= 5:
                self.malformed(f"protocol {arg}")
        elif op == "MARK":
            s.append(_MARK)
        elif op == "POP":
            self.pop()
        elif op == "POP_MARK":
            self.pop_mark()
        elif op == "DUP":
            s.append(self.top())
        elif op in ("NONE", "NEWTRUE", "NEWFALSE"):
            s.append({"NONE": None, "NEWTRUE": True, "NEWFALSE": False}[op])
        elif op in ("INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "FLOAT", "BINFLOAT",
                    "UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES",
                    "BINBYTES8"):
            if type(arg) is int and arg.bit_length() > 64:
                # (torch.save writes no such number; products of a few, a tensor's size say, would
                # cost the scan hours: an integer of 100 KB repeated through the memo)
                self.refuse("its pickle holds an integer of more than 64 bits, which a fairseq checkpoint never "
                            "holds")
            s.append(arg)
        elif op == "EMPTY_TUPLE":
            s.append(())
        elif op == "TUPLE":
            s.append(tuple(self.pop_mark()))
        elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
            n = int(op[-1])
            items = [self.pop() for _ in range(n)][::-1]
            s.append(tuple(items))
        elif op == "EMPTY_LIST":
            s.append(_Object("list"))
        elif op == "LIST":
            obj = _Object("list")
            obj.filled = bool(self.pop_mark())
            s.append(obj)
        elif op == "EMPTY_DICT":
            s.append(_Object("dict"))
        elif op == "DICT":
            items = self.pop_mark()
            if len(items) % 2:
                self.malformed("DICT with an odd number of items")
            obj = _Object("dict")
            obj.filled = bool(items)
            s.append(obj)
        elif op == "EMPTY_SET":
            s.append(_Object("set"))
        elif op == "FROZENSET":
            self.pop_mark()
            s.append(_Object("set"))
        elif op in ("APPEND", "SETITEM"):
            n = 1 if op == "APPEND" else 2
            for _ in range(n):
                self.pop()
            self.container(("list",) if op == "APPEND" else ("dict",)).filled = True
        elif op in ("APPENDS", "SETITEMS", "ADDITEMS"):
            items = self.pop_mark()
            if op == "SETITEMS" and len(items) % 2:
                self.malformed("SETITEMS with an odd number of items")
            kind = {"APPENDS": "list", "SETITEMS": "dict", "ADDITEMS": "set"}[op]
            target = self.container((kind,))
            target.filled = target.filled or bool(items)
        elif op in ("PUT", "BINPUT", "LONG_BINPUT"):
            self.memo[int(arg)] = self.top()
        elif op == "MEMOIZE":
            self.memo[len(self.memo)] = self.top()
        elif op in ("GET", "BINGET", "LONG_BINGET"):
            if int(arg) not in self.memo:
                self.malformed(f"memo entry {arg} read before it is written")
            s.append(self.memo[int(arg)])
        elif op == "GLOBAL":
            module, _, attr = arg.partition(" ")
            s.append(self.global_(module, attr))
        elif op == "STACK_GLOBAL":
            attr, module = self.pop(), self.pop()
            if not isinstance(module, str) or not isinstance(attr, str):
                self.malformed("STACK_GLOBAL on values that are not strings")
            s.append(self.global_(module, attr))
        elif op == "REDUCE":
            args, func = self.pop(), self.pop()
            s.append(self.call(func, args))
        elif op == "NEWOBJ":
            args, cls = self.pop(), self.pop()
            if not isinstance(cls, _Global) or cls.name != NAMESPACE or args != ():
                self.malformed("NEWOBJ of anything but argparse.Namespace()")
            s.append(_Object("namespace"))
        elif op == "BUILD":
            state = self.pop()
            self.build(self.top(), state)
        elif op == "BINPERSID":
            s.append(self.storage(self.pop()))
        else:  # pragma: no cover  (ALLOWED_OPCODES and the branches above name the same opcodes)
            self.malformed(f"opcode {op}")

    def global_(self, module, attr):
        name = python3_name(module, attr)
        if name not in GLOBALS:
            self.globals.append(name)
        return _Global(name)

    def storage(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            self.malformed("a persistent id that is not torch's ('storage', type, key, location, size)")
        _, kind, key, location, numel = pid
        if not isinstance(kind, _Global) or kind.name not in STORAGE_TYPES:
            self.malformed("a storage of an unknown type")
        if not isinstance(key, str) or not isinstance(numel, int) or numel < 0:
            self.malformed("a storage without a key or a size")
        if not isinstance(location, str) or not LOCATION.fullmatch(location):
            self.malformed(f"a storage on the device {str(location)[:40]!r}")
        nbytes = numel * STORAGE_TYPES[kind.name]
        if key not in self.records:
            self.malformed(f"storage {key[:40]!r} has no record in the file")
        if self.records[key] != nbytes:
            self.malformed(f"storage {key[:40]!r} claims {nbytes} bytes, its record holds {self.records[key]}")
        return _Object("storage", (numel, key))

    def call(self, func, args):
        if not isinstance(func, _Global):
            self.malformed("REDUCE on something that is not a global")
        if func.name not in CALLS:
            if func.name in GLOBALS:
                self.malformed(f"a call of {func.name}, which a checkpoint only names")
            return _Object("refused")  # already listed in self.globals
        if not isinstance(args, tuple):
            self.malformed(f"{func.name} called with arguments that are not a tuple")
        if func.name == ORDERED_DICT:
            if args != ():
                self.malformed("collections.OrderedDict called with arguments")
            return _Object("dict", "ordered")
        if func.name == CODECS_ENCODE:
            if len(args) != 2 or not isinstance(args[0], str) or args[1] != "latin1":
                self.malformed("_codecs.encode called with anything but (text, 'latin1')")
            try:
                encoded = args[0].encode("latin1")
            except UnicodeEncodeError:
                self.malformed("_codecs.encode of text that is not latin-1")
            # each call makes new bytes (torch's unpickler too): text stored once and encoded
            # again through the memo would multiply the pickle's size; torch.save encodes each
            # array's bytes once, never more than the pickle holds
            self.encodable -= len(encoded)
            if self.encodable < 0:
                self.refuse("its pickle encodes more bytes than it holds (the same text encoded again and "
                            "again), which torch.save never writes")
            return encoded
        if func.name == REBUILD_TENSOR:
            return self.tensor(args)
        if func.name in NUMPY_RECONSTRUCT:
            if (len(args) != 3 or not isinstance(args[0], _Global) or args[0].name != NUMPY_NDARRAY
                    or args[1] != (0,) or args[2] != b"b"):
                self.malformed("numpy's _reconstruct called with anything but (ndarray, (0,), b'b')")
            return _Object("array")
        if func.name == NUMPY_DTYPE:
            return self.dtype(args)
        raise AssertionError(func.name)  # pragma: no cover

    def dtype(self, args):
        import numpy as np

        if len(args) != 3 or not isinstance(args[0], str) or not all(isinstance(a, bool) for a in args[1:]):
            self.malformed("numpy.dtype called with anything but (spec, align, copy)")
        if not re.fullmatch(r"[<>|=]?[biufc]\d{1,2}", args[0]):
            self.refuse(f"it holds a numpy array of dtype {args[0][:20]!r}; only numeric arrays are allowed "
                        "(fairseq stores its BLEU statistics as integer arrays)")
        try:
            dtype = np.dtype(args[0])
        except TypeError as e:
            self.malformed(f"numpy dtype {args[0]!r}: {short_error(e)}")
        if dtype.kind not in NUMERIC_KINDS:  # pragma: no cover  (the pattern above admits numeric specs only)
            self.refuse(f"it holds a numpy array of dtype {dtype}")
        return _Object("dtype", dtype.itemsize)

    def build(self, target, state):
        ordered = isinstance(target, _Object) and target.kind == "dict" and target.info == "ordered"
        if not (ordered or isinstance(target, _Object) and target.kind in ("namespace", "array", "dtype")):
            self.malformed("BUILD on something that is not a Namespace, an OrderedDict, a numpy array or a dtype")
        if target.kind in ("namespace", "dict"):  # attributes (a state dict's _metadata)
            if not isinstance(state, _Object) or state.kind != "dict":
                self.malformed("a Namespace or OrderedDict whose state is not a dict")
        elif target.kind == "dtype":
            # (version, byte order, subarray, names, fields, element size, alignment, flags): a plain dtype
            if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and state[1] in "<>|="
                    and state[2:5] == (None, None, None) and all(isinstance(v, int) for v in state[5:])):
                self.refuse("it holds a numpy dtype with fields or subarrays; only plain numeric arrays are allowed")
        else:  # (version, shape, dtype, Fortran order, the bytes): numeric data, as many bytes as the shape needs
            if not (isinstance(state, tuple) and len(state) == 5 and isinstance(state[1], tuple)
                    and all(isinstance(d, int) and d >= 0 for d in state[1]) and isinstance(state[2], _Object)
                    and state[2].kind == "dtype" and isinstance(state[3], bool)):
                self.malformed("a numpy array whose state is not (version, shape, dtype, order, bytes)")
            if not isinstance(state[4], bytes):
                self.refuse("it holds a numpy array of Python objects; only numeric arrays are allowed")
            if len(state[4]) != math.prod(state[1]) * state[2].info:
                self.malformed("a numpy array whose bytes do not match its shape")

    def tensor(self, args):
        if len(args) == 7 and args[6] is None:
            args = args[:6]
        if len(args) != 6:
            self.malformed("_rebuild_tensor_v2 called with other arguments than torch.save writes")
        storage, offset, size, stride, requires_grad, hooks = args
        if not isinstance(storage, _Object) or storage.kind != "storage":
            self.malformed("a tensor without a storage")
        if not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)
                and isinstance(requires_grad, bool) and isinstance(hooks, _Object) and hooks.kind == "dict"):
            self.malformed("a tensor whose offset, size or stride are not numbers")
        if (len(size) != len(stride) or len(size) > MAX_TENSOR_DIMS
                or not all(isinstance(v, int) and v >= 0 for v in size + stride) or offset < 0):
            self.malformed("a tensor with a negative or mismatched size or stride")
        numel = math.prod(size)
        capacity, key = storage.info
        if numel:
            end = offset + sum((n - 1) * st for n, st in zip(size, stride)) + 1
            if end > capacity:
                self.malformed("a tensor reaching beyond its storage")
            if numel > capacity:
                self.refuse("a tensor has more elements than its storage (a few bytes repeated into a large "
                            "tensor), which torch.save never writes")
            views = self.views.setdefault(key, set())
            if (offset, size, stride) not in views:
                views.add((offset, size, stride))
                self.viewed[key] = self.viewed.get(key, 0) + numel
            if self.viewed[key] > capacity:
                self.refuse("the distinct tensors built from one storage hold more elements together than "
                            "the storage (overlapping views: its bytes counted many times), which torch.save "
                            "never writes")
        self.hooks.append(hooks)
        return _Object("tensor")


def scan(container: Container, name: str) -> None:
    """Check a checkpoint's pickle (see the module docstring); raises
    :class:`~fairseq_localness.checkpoint.errors.CheckpointError`."""
    _Machine(name, container.records).run(container.pickle)
