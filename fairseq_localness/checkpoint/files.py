"""The files a checkpoint's settings name: fairseq opens none of them.

fairseq reads some of its settings as paths: a model built from a checkpoint loads
pretrained embeddings from ``encoder_embed_path``, a second checkpoint from
``pretrained_checkpoint`` (``fconv_self_att``; naming the file itself recurses
without end) or ``load_pretrained_decoder_from`` (``xm_transformer``, with plain
``torch.load``), and the hub interface builds the BPE and tokenizer from
``sentencepiece_model``, ``bpe_codes`` or ``gpt2_encoder_json``. A checkpoint whose
settings name ``/dev/zero``, a FIFO or ``/etc/passwd`` there would make fairseq read
it while building the model (gigabytes, a hang, or a line of the file in an error).

:func:`drop_file_settings` runs on every checkpoint this package loads, trusted or
not, before fairseq reads its settings: each setting of :data:`FILE_SETTINGS` that
holds a value is unset (``None`` in a dict; removed from a ``Namespace``, so that
fairseq's own default applies), anywhere in ``cfg`` or the legacy ``args``. The
weights those files would give are stored in the checkpoint already. A checkpoint
whose model cannot be built without a second one (``fconv_self_att`` with
``pretrained``) is refused. Settings that name a file inside the data directory
(:data:`DATA_RELATIVE`, e.g. ``config_yaml``) are kept only as names inside it.

The files the hub does need (the sentencepiece model, BPE codes and dictionaries it
finds beside ``model.pt``, or the files given to ``from_pretrained`` as keyword
arguments) are checked by :func:`check_beside` and :func:`check_named_file`: inside
the checkpoint's folder (no symlink out of it) where fairseq found them there, and
regular files of at most :data:`MAX_FILE_BYTES` (no FIFO, device or directory).
"""
import argparse
import atexit
import functools
import logging
import os
import posixpath
import shutil
import stat
import tarfile
import tempfile
import threading
from typing import Optional

from fairseq_localness.checkpoint.errors import UntrustedCheckpointError, short_repr

logger = logging.getLogger("fairseq_localness.checkpoint")

FILE_SETTINGS = {
    # pretrained embeddings, read while the model is built (the trained ones are stored)
    "encoder_embed_path": None, "decoder_embed_path": None, "embed_path": None,
    # a second checkpoint or model loaded while this one is built
    "pretrained_checkpoint": None, "pretrained_mlm_checkpoint": None, "pretrained_xlm_checkpoint": None,
    "load_pretrained_encoder_from": None, "load_pretrained_decoder_from": None, "w2v_path": None,
    "seq2seq_path": None, "multires_hubert_path": None,
    # the BPE and tokenizer files the hub interface builds from
    "bpe_codes": None, "sentencepiece_model": None, "sentencepiece_model_path": None, "bpe_merges": None,
    "bpe_vocab": None, "bpe_vocab_file": None, "gpt2_encoder_json": None, "gpt2_vocab_bpe": None,
    # files a task reads when it is set up from the checkpoint's settings
    "lang_dict": None, "fixed_dictionary": None, "source_dict": None, "target_dict": None,
    "sampling_weights_from_file": None, "lang_to_offline_shard_ratio": "", "label_dir": None,
    "speaker_emb_path": None, "f0_stats": None,
    # a criterion's language model and lexicon; the hub's alignment dictionary for --replace-unk
    "wer_kenlm_model": None, "wer_lexicon": None, "replace_unk": None,
}
"""The settings fairseq 0.12 opens as a file (or loads as a checkpoint) when a model,
its task, BPE or tokenizer is built from a checkpoint's settings, each with the value
that turns it off (``tests/test_checkpoint_files.py`` checks this list against
fairseq's installed source)."""

DATA_RELATIVE = frozenset({"config_yaml", "multitask_config_yaml"})
"""Settings naming a file inside the task's data directory (``Path(data) /
config_yaml``): kept where they are a relative name that stays inside it."""

NAME_PARTS = frozenset({"source_lang", "target_lang", "lang_pairs", "extra_lang_pairs", "langs", "labels", "channels"})
"""Settings fairseq joins into a file name inside the data directory (``dict.{lang}.txt``,
``dict.{labels}.txt``): a language, label or channel name holds no path separator, so
the file stays the one the hub checks beside the checkpoint (``a/b`` would read
``dict.a/b.txt``, a FIFO in a folder of the checkpoint's, or one a link points to)."""

COMMAND_LINE_ONLY = frozenset({
    "data", "save_dir", "restore_file", "finetune_from_model", "ema_seed_model", "lm_path", "tensorboard_logdir",
    "log_file", "plasma_path", "user_dir", "results_path", "path", "quantization_config_path", "checkpoint",
})
"""Settings naming files that fairseq takes from its own command line only, never from
a checkpoint's settings (``data`` is replaced by the command line's, the hub's folder,
or checked by the analysis tools; ``user_dir`` is not imported), left as they are."""

DATA_HOLDERS = frozenset({"cfg.task", "args"})
"""Where fairseq takes the data directory from when it loads a checkpoint (and replaces
it by the command line's or the hub's folder): ``data`` anywhere else is unset."""

SECOND_CHECKPOINT = {"pretrained_checkpoint": "pretrained"}
"""A setting naming a checkpoint without which the model cannot be built, with the
setting that asks for it."""

MAX_FILE_BYTES = 64 << 20
"""The largest file the hub reads beside a checkpoint: a sentencepiece model, BPE codes
or a dictionary of a translation model is a few megabytes."""

MAX_DICTIONARY_SYMBOLS = 1_000_000
"""The most lines a dictionary the hub or a task reads may hold: a joined BPE vocabulary is
tens of thousands of symbols, mBART's 250,000; fairseq's ``Dictionary`` keeps about 230
bytes per symbol (an 8 MiB file of a million one-letter symbols took 240 MB, so 64 MiB of
them would take about 1.9 GB per dictionary)."""

MAX_HUB_DICTIONARIES = 1_000
"""The most dictionaries a checkpoint's folder may hold for the hub and its task to read
(a multilingual model has one per language: tens; links to one file cost nothing, and
``multilingual_translation`` with ``encoder_langtok`` adds every language's token to
every dictionary: N dictionaries, N * N symbols)."""

MAX_HUB_SYMBOLS = 16_000_000
"""The most lines all those dictionaries may hold together, unless the checkpoint is
trusted (about 3.7 GB of fairseq's dictionaries: mBART-50's 52 languages of 250,001
symbols each are 13 million)."""

MAX_HUB_DICTIONARY_BYTES = 1 << 30
"""The most bytes all those dictionaries may hold together, unless the checkpoint is
trusted (fairseq keeps each line's symbol: 50 links to one 63 MiB dictionary of 63
lines took 3 GB)."""

MAX_ARCHIVE_BYTES = 16 << 30
"""The most a model archive given to ``from_pretrained`` may hold, its files' sizes summed
(fairseq's largest published translation models are a few gigabytes)."""

MAX_ARCHIVE_MEMBERS = 10_000
"""The most files and folders such an archive may hold (a model, its dictionaries and
BPE files are a handful)."""

MAX_CHAINED_HEADERS = 4
"""The most extended headers (GNU long name or link, pax) before one member of such an
archive."""

MAX_ARCHIVE_HEADER_BYTES = 1 << 20
"""The most bytes of one member's extended header in such an archive (a GNU long name or
link, a pax header: a path of a few hundred bytes), which tarfile reads whole into
memory, when the archive is opened for its first member."""


class _BoundedTarInfo(tarfile.TarInfo):
    """A member whose extended header (GNU long name or link, pax) is refused past
    :data:`MAX_ARCHIVE_HEADER_BYTES`, before tarfile reads it; a global pax header
    (which tarfile copies into every later member: 88,000 keys under 1 MiB took 1.8 GB
    over 400 members) and a sparse member (its map, which tarfile reads for as many
    entries as it claims: a 204 KB archive took 60 s) are refused as they are met.
    Model archives hold none of them."""

    def _proc_member(self, tarfile_):
        if self.type == tarfile.XGLTYPE:
            raise _RefusedHeader("a global pax header, which tarfile applies to every member after it")
        if self.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                         tarfile.SOLARIS_XHDTYPE):
            if self.size > MAX_ARCHIVE_HEADER_BYTES:
                raise _RefusedHeader(f"a member's extended header of {self.size:,} bytes, more than the "
                                  f"{MAX_ARCHIVE_HEADER_BYTES:,} a long name needs")
            # tarfile reads the next header within this one's, keeping each: a chain of them
            # (GNU tar writes at most a long link and a long name before a member) is refused
            chained = getattr(tarfile_, "_fairseq_localness_headers", 0) + 1
            if chained > MAX_CHAINED_HEADERS:
                raise _RefusedHeader(f"more than {MAX_CHAINED_HEADERS} extended headers before one member, which "
                                  "tarfile keeps all in memory")
            tarfile_._fairseq_localness_headers = chained
        else:
            tarfile_._fairseq_localness_headers = 0
        return super()._proc_member(tarfile_)

    def _sparse(self, *args, **kwargs):
        raise _RefusedHeader("a sparse member (GNU), whose map tarfile reads for as many entries as it claims")

    _proc_sparse = _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _sparse


class _RefusedHeader(tarfile.TarError):
    pass

HUB_FILES = ("code", "bpecodes", "sentencepiece.bpe.model", "merges.txt", "vocab.json")
"""The files fairseq's ``from_pretrained`` takes from beside the checkpoint
(``fairseq.hub_utils``), besides the dictionaries ``dict.*.txt``."""

_last = threading.local()


def last_file() -> Optional[str]:
    """The checkpoint whose settings were checked last in this thread."""
    return getattr(_last, "file", None)


def _truthy_literal(value) -> bool:
    from fairseq_localness.checkpoint.literals import NotALiteral, literal

    if isinstance(value, str):
        try:
            return bool(literal(value))
        except NotALiteral:
            return True
    return bool(value)


def _containers(settings):
    """Every dict and Namespace in the settings, with its dotted path (each once)."""
    seen, stack = set(), [(value, key) for key, value in settings.items() if value is not None]
    while stack:
        value, path = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, argparse.Namespace):
            yield path, value, vars(value)
            items = vars(value).items()
        elif isinstance(value, dict):
            yield path, value, value
            items = value.items()
        elif isinstance(value, (list, tuple)):
            items = enumerate(value)
        else:
            continue
        stack.extend((child, f"{path}.{key}") for key, child in items
                     if isinstance(child, (dict, list, tuple, argparse.Namespace)))


def _data_from_the_task(items, path: str) -> bool:
    """Whether ``items`` (at ``path``) are the settings of a model whose configuration
    takes its ``data`` from the task's (``II("task.data")``: wav2vec 2.0's, HuBERT's and
    data2vec's fine-tuned models, which set up a nested task there) where it has none;
    the model named as ``fairseq.models.build_model`` names it (``_name``, else
    ``arch``, else the one key of a section named after the model, as
    ``{"wav2vec_ctc": {...}}``: ``path`` ends in its name)."""
    from fairseq.models import MODEL_DATACLASS_REGISTRY

    name = items.get("_name") or items.get("arch") or path.rsplit(".", 1)[-1]
    dataclass = MODEL_DATACLASS_REGISTRY.get(name) if isinstance(name, str) else None
    field = getattr(dataclass, "__dataclass_fields__", {}).get("data")
    return field is not None and "task.data" in str(field.default)


def drop_file_settings(settings, file: str):
    """Unset every setting of :data:`FILE_SETTINGS` in ``settings`` (``{"cfg": ...,
    "args": ...}``, already bounded and walked by
    :func:`~fairseq_localness.checkpoint.settings.check_settings`); refuse a
    checkpoint that needs a second one to be built, or names a data file outside its
    data directory. Returns the dotted paths of the settings unset."""
    _last.file = file
    dropped = []
    for path, container, items in _containers(settings):
        for key, flag in SECOND_CHECKPOINT.items():
            if items.get(key) and _truthy_literal(items.get(flag)):
                raise UntrustedCheckpointError(
                    file, f"its setting {path}.{flag} = {short_repr(items[flag], 40)} makes fairseq load a second "
                    f"checkpoint while building this one ({path}.{key} = {short_repr(items[key], 80)}); a "
                    "checkpoint names no file that is read (docs/security.md)", trust_helps=False)
        for key in DATA_RELATIVE & set(items):
            value = items[key]
            if value is not None and not (isinstance(value, str) and value and not os.path.isabs(value)
                                          and ".." not in value.replace("\\", "/").split("/")):
                raise UntrustedCheckpointError(
                    file, f"its setting {path}.{key} = {short_repr(value, 80)} names a file outside the data "
                    "directory; it may only name one inside it (a relative name without '..')", trust_helps=False)
        for key in NAME_PARTS & set(items):
            value = items[key]
            parts = value if isinstance(value, (list, tuple)) else [value]
            if any(isinstance(part, str) and any(c in part for c in "/\\\0") for part in parts):
                raise UntrustedCheckpointError(
                    file, f"its setting {path}.{key} = {short_repr(value, 80)} holds a path separator, and fairseq "
                    f"reads it as part of a file name (dict.{{name}}.txt); a name there is a plain word",
                    trust_helps=False)
        if path not in DATA_HOLDERS and (items.get("data") not in (None, "")
                                         or "data" not in items and _data_from_the_task(items, path)):
            # a data directory anywhere else is one a nested task reads (wav2vec 2.0's CTC
            # model sets up its pretraining task from cfg.model.data, and reads its
            # dictionaries there): not the command line's, so not read (not logged: every
            # checkpoint of fairseq-train holds its training data's path in cfg.model); a
            # model's settings without one take their default, II("task.data"): the
            # checkpoint's own task's, which the nested task would read as well
            if isinstance(container, dict):
                container["data"] = None
            else:
                setattr(container, "data", None)
        for key in [k for k in items if k in FILE_SETTINGS]:
            value, off = items[key], FILE_SETTINGS[key]
            if value is None or value is False or value is True or value == off:
                continue
            if isinstance(container, dict):
                container[key] = off
            else:
                delattr(container, key)
            dropped.append(f"{path}.{key}")
    if dropped:
        logger.info("%s: not reading the files its settings name (%s): a checkpoint names no file that is read; "
                    "its weights are stored in it", file, ", ".join(sorted(dropped)))
    return dropped


def command_line_generation(settings, file: str):
    """Replace the generation settings a checkpoint holds (``cfg.generation``, and the
    same names in legacy ``args``) by fairseq's defaults: how to translate is the
    command line's (``fairseq-generate`` reads its own; the hub applies
    ``from_pretrained``'s keyword arguments over these), and a checkpoint's
    ``temperature = 0``, ``min_len = 1000``, ``sampling_topk = 10**6``,
    ``constraints`` or ``diverse_beam_groups`` would stop the hub's first
    ``translate`` in fairseq's generator with a traceback. A checkpoint written by
    ``fairseq-train`` holds the defaults. Returns whether anything was replaced."""
    import dataclasses

    from fairseq.dataclass.configs import GenerationConfig
    from omegaconf import OmegaConf

    defaults = OmegaConf.to_container(OmegaConf.structured(GenerationConfig()))
    changed = False
    cfg, args = settings.get("cfg"), settings.get("args")
    if isinstance(cfg, dict) and isinstance(cfg.get("generation"), (dict, argparse.Namespace)):
        held = cfg["generation"]
        changed = (vars(held) if isinstance(held, argparse.Namespace) else held) != defaults
        cfg["generation"] = defaults
    if isinstance(args, argparse.Namespace):
        names = {field.name for field in dataclasses.fields(GenerationConfig)}
        for name in names & set(vars(args)):
            changed |= getattr(args, name) != defaults[name]
            delattr(args, name)
    if changed:
        logger.info("%s: its generation settings are replaced by fairseq's defaults: how to translate is the "
                    "command line's (or from_pretrained's keyword arguments)", file)
    return changed


def _refuse(file, what, reason):
    raise UntrustedCheckpointError(file, f"{what} {reason}", trust_helps=False)


def _regular_file(path: str, file: str, what: str, expected: str) -> os.stat_result:
    """``os.stat(path)`` of a regular file; else the refusal of ``file`` (``what`` names
    the path in it, ``expected`` says what is read)."""
    try:
        info = os.stat(path)
    except OSError as e:
        _refuse(file, what, f"cannot be read ({e.strerror or e})")
    if not stat.S_ISREG(info.st_mode):
        _refuse(file, what, f"is not a regular file (a FIFO, device or directory would never end or never answer); "
                f"{expected}")
    return info


def regular_file(path: str, file: str, what: str) -> os.stat_result:
    """``os.stat(path)`` of a regular file, of any size (a dataset's split, which fairseq
    maps into memory); else the refusal of ``file`` in one line (``what`` names the path)."""
    return _regular_file(path, file, what, "only regular files are read")


def check_named_file(path: str, file: str, what: str, folder: Optional[str] = None) -> int:
    """The file at ``path`` (``what`` names it in the refusal of ``file``) is a regular
    file of at most :data:`MAX_FILE_BYTES`, and, with ``folder``, inside it once every
    symlink is resolved. Returns the lines of a dictionary (:func:`is_dictionary`), else 0."""
    if folder is not None:
        real, inside = os.path.realpath(path), os.path.realpath(folder)
        if os.path.commonpath([real, inside]) != inside:
            _refuse(file, what, f"is a link to {real!r}, outside the checkpoint's folder {folder!r}; only files "
                    "inside it are read")
    info = _regular_file(path, file, what, "only regular files are read")
    if info.st_size > MAX_FILE_BYTES:
        _refuse(file, what, f"is {info.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} such a file takes; "
                "only files of at most that size are read")
    if is_dictionary(os.path.basename(path)):
        with open(path, "rb") as f:  # (a regular file of bounded size: read whole at once)
            symbols = f.read().count(b"\n")
        if symbols > MAX_DICTIONARY_SYMBOLS:
            from fairseq_localness.checkpoint.load import trusted

            if not trusted():  # (a word-level vocabulary may be larger: the switch reads it)
                raise UntrustedCheckpointError(file, f"{what} holds {symbols:,} lines, more than the "
                                               f"{MAX_DICTIONARY_SYMBOLS:,} symbols a dictionary takes (fairseq "
                                               "keeps about 230 bytes per symbol)")
        return symbols
    return 0


def is_dictionary(name: str) -> bool:
    """Whether a file name is one of fairseq's dictionaries (``dict.*.txt``, ``dict.txt``)."""
    return name.startswith("dict.") and name.endswith(".txt")


def _read_by_a_task(name: str) -> bool:
    """A file a task set up from the hub's folder may read: a dictionary (``dict.*.txt``;
    ``input0/dict.txt`` and ``label/dict.txt`` of the sentence-classification tasks) or a
    YAML configuration (the speech tasks' ``config_yaml``)."""
    return is_dictionary(name) or name.endswith((".yaml", ".yml"))


MAX_CONFIG_VALUES = 100_000
"""The most values a task's YAML configuration may hold, counted as a copy counts them
(each alias again: fairseq rebuilds some sections' dicts), trusted or not (a speech
task's ``config.yaml`` holds a few dozen)."""

MAX_CONFIG_BYTES = 1 << 20
"""The largest YAML configuration a task reads, unless the checkpoint is trusted (a few
kilobytes; fairseq's PyYAML loader parses about 0.2 MB a second)."""


def check_configuration(path: str):
    """The YAML configuration a task is about to read (``path``: fairseq's
    ``data_cfg.get_config_from_yaml``, for the speech tasks' ``config_yaml`` and
    ``multitask_config_yaml``), and the files it names, which the task opens as it is
    set up (``speaker_set_filename``, ``vocab_filename``, a multitask dictionary, the
    vocoder's checkpoint). The configuration is a regular file of at most
    :data:`MAX_CONFIG_BYTES` and :data:`MAX_CONFIG_VALUES` values; each of its strings
    that names an existing path that is not a folder, absolute or relative to any base
    fairseq resolves such names against (the working directory, the configuration's
    folder and the folders above it, among them the data directory), is a regular file
    (not ``/dev/zero``, a FIFO or a device, which would never end or never answer) of at
    most :data:`MAX_FILE_BYTES`. The sizes only unless the checkpoint is trusted (a
    vocoder may be larger). Refusals name the checkpoint loaded last."""
    import yaml

    from fairseq_localness.checkpoint.load import trusted

    file, what = last_file() or path, f"the task's configuration {os.fspath(path)!r}"
    info = _regular_file(path, file, what, "only regular files are read")
    if info.st_size > MAX_CONFIG_BYTES and not trusted():
        _refuse(file, what, f"is {info.st_size:,} bytes, more than the {MAX_CONFIG_BYTES:,} a task's configuration "
                "takes")
    try:
        with open(path, "rb") as f:
            config = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, yaml.YAMLError, RecursionError) as e:
        _refuse(file, what, f"cannot be read as YAML ({short_repr(' '.join(str(e).split()))})")
    from fairseq_localness.checkpoint.settings import measure, strings_within

    # (counted as a copy counts them: fairseq rebuilds the dicts of some sections, each alias again)
    measure(config, file, what, MAX_CONFIG_VALUES, trust_helps=False, any_leaf=True)
    folder = os.path.dirname(os.path.abspath(path))
    bases = [os.getcwd(), folder]
    while os.path.dirname(bases[-1]) != bases[-1]:
        bases.append(os.path.dirname(bases[-1]))
    texts = dict.fromkeys(t for t in strings_within(config) if t and "\0" not in t)  # (an alias's once)
    for named in dict.fromkeys(os.path.join(base, text) for text in texts for base in bases):
        if not os.path.lexists(named) or os.path.isdir(named):
            continue
        found = _regular_file(named, file, f"the file {named!r} named by {what}", "only regular files are read")
        if found.st_size > MAX_FILE_BYTES and not trusted():
            _refuse(file, f"the file {named!r} named by {what}", f"is {found.st_size:,} bytes, more than the "
                    f"{MAX_FILE_BYTES:,} such a file takes; only files of at most that size are read unless the "
                    "checkpoint is trusted")


def checked_configuration(get_config_from_yaml):
    """fairseq's ``data_cfg.get_config_from_yaml`` after :func:`check_configuration`
    where a checkpoint's task is set up (within ``load_model_ensemble_and_task``: the
    hub, whose folder is the checkpoint's; the analyses); a task set up from the
    command line reads the user's own data as it is."""
    from fairseq_localness.checkpoint.model_size import loading

    if getattr(get_config_from_yaml, "_fairseq_localness_checked", False):
        return get_config_from_yaml

    @functools.wraps(get_config_from_yaml)
    def checked(yaml_path):
        if loading() and os.path.lexists(yaml_path):  # (a missing one: fairseq says so)
            check_configuration(yaml_path)
        return get_config_from_yaml(yaml_path)

    checked._fairseq_localness_checked = True
    return checked


def check_beside(folder: str):
    """The files fairseq's ``from_pretrained`` reads from ``folder`` (its BPE and
    tokenizer files, :data:`HUB_FILES`, its dictionaries and what a task reads there,
    one folder down too): each one present is a regular file of bounded size inside
    the folder; at most :data:`MAX_HUB_DICTIONARIES` dictionaries, of at most
    :data:`MAX_HUB_SYMBOLS` lines and :data:`MAX_HUB_DICTIONARY_BYTES` bytes in all
    unless the checkpoint is trusted."""
    from fairseq_localness.checkpoint.load import trusted

    try:
        names = os.listdir(folder)
    except OSError:
        return  # not a folder: fairseq says so
    read = []  # (path, its words in a refusal)
    for name in sorted(names):
        path = os.path.join(folder, name)
        if name in HUB_FILES or _read_by_a_task(name):
            read.append((path, f"its file {name!r}, which the hub reads,"))
        elif os.path.isdir(path):  # (a link to a folder too: a file read through it must stay inside)
            try:
                inner = os.listdir(path)
            except OSError:
                continue
            read.extend((os.path.join(path, sub), f"its file {name + '/' + sub!r}, which a task may read,")
                        for sub in sorted(inner) if _read_by_a_task(sub))
    dictionaries = sum(is_dictionary(os.path.basename(path)) for path, _ in read)
    if dictionaries > MAX_HUB_DICTIONARIES:
        _refuse(folder, "its folder", f"holds {dictionaries:,} dictionaries, more than the {MAX_HUB_DICTIONARIES:,} "
                "a model reads (one per language)")
    symbols = size = 0
    for path, what in read:  # (a YAML configuration's own files: where a task reads it, checked_configuration)
        symbols += check_named_file(path, folder, what, folder)
        size += os.stat(path).st_size if is_dictionary(os.path.basename(path)) else 0
        if (symbols > MAX_HUB_SYMBOLS or size > MAX_HUB_DICTIONARY_BYTES) and not trusted():
            raise UntrustedCheckpointError(folder, f"its dictionaries hold more than {MAX_HUB_SYMBOLS:,} lines or "
                                           f"{MAX_HUB_DICTIONARY_BYTES:,} bytes together, more than a model reads "
                                           "(fairseq keeps each symbol, and about 230 bytes more per symbol)")



def check_hub_settings(cfg, file: str):
    """The BPE and tokenizer files the hub is about to read (named by
    ``from_pretrained``'s keyword arguments or found beside the checkpoint: the
    checkpoint's own were unset when it was loaded) are regular files of bounded size."""
    for group in ("bpe", "tokenizer"):
        section = cfg.get(group) if hasattr(cfg, "get") else getattr(cfg, group, None)
        if section is None:
            continue
        for key in FILE_SETTINGS:
            value = section.get(key, None) if hasattr(section, "get") else getattr(section, key, None)
            if isinstance(value, str) and value and "://" not in value and value != "???":
                check_named_file(value, file, f"the file {value!r} of its setting {group}.{key}")


def extract_archive(path: str) -> str:
    """A model archive (``.tar.gz``, ``.tar.bz2``: what ``from_pretrained`` takes in place
    of a folder) extracted into a folder of its own, removed when the process ends; the
    folder of its files, as fairseq's ``file_utils.load_archive_file`` returns it (the
    members' common folder). Unlike fairseq's, which extracts every member as it is
    named and then deletes the archive and puts the folder in its place, the archive is
    left as it is, and it is refused, before anything is written, unless it is a regular
    file whose members are regular files, folders and links to them (no device or FIFO),
    each named inside the folder and linking inside it (no absolute name, no ``..``), at
    most :data:`MAX_ARCHIVE_MEMBERS` of them and :data:`MAX_ARCHIVE_BYTES` in all; the
    extraction itself runs with tarfile's ``data`` filter as a second guard where this
    Python has it."""
    what = "the model archive"
    _regular_file(path, path, what, "expected a .tar.gz or .tar.bz2 file or a folder")
    try:
        archive = tarfile.open(path, "r:*", tarinfo=_BoundedTarInfo)
    except _RefusedHeader as e:
        _refuse(path, what, f"holds {e}")
    except (tarfile.TarError, OSError, RecursionError) as e:
        _refuse(path, what, f"is not a tar archive ({e}); expected a .tar.gz or .tar.bz2 file or a folder")
    with archive:
        members, total = [], 0
        try:
            for member in archive:
                members.append(member)
                if len(members) > MAX_ARCHIVE_MEMBERS:
                    _refuse(path, what, f"holds more than {MAX_ARCHIVE_MEMBERS:,} files; a model's archive holds "
                            "a handful")
                name = member.name
                if posixpath.isabs(name) or ".." in name.split("/") or "\\" in name:
                    _refuse(path, what, f"names a file outside its folder ({short_repr(name)}); only names inside "
                            "it are extracted")
                if member.issym() or member.islnk():  # (GNU tar links files it meets twice)
                    start = posixpath.dirname(name) if member.issym() else ""
                    target = posixpath.normpath(posixpath.join(start, member.linkname))
                    if posixpath.isabs(member.linkname) or target == ".." or target.startswith("../"):
                        _refuse(path, what, f"holds {short_repr(name)}, a link to {short_repr(member.linkname)} "
                                "outside its folder; only links inside it are extracted")
                elif not (member.isreg() or member.isdir()):
                    _refuse(path, what, f"holds {short_repr(name)}, a device or FIFO; only regular files, folders "
                            "and links inside the folder are extracted")
                total += member.size
                if total > MAX_ARCHIVE_BYTES:
                    _refuse(path, what, f"holds more than {MAX_ARCHIVE_BYTES:,} bytes; only archives of at most "
                            "that size are extracted")
        except _RefusedHeader as e:
            _refuse(path, what, f"holds {e}")
        except (tarfile.TarError, RecursionError) as e:
            _refuse(path, what, f"cannot be read as a tar archive ({e})")
        if not members:
            _refuse(path, what, "holds no files; expected a model's folder of checkpoint and dictionaries")
        folder = tempfile.mkdtemp(prefix="fairseq-localness-archive-")
        atexit.register(shutil.rmtree, folder, True)
        # (tarfile's extraction filters: Python 3.8.17, 3.9.17, 3.10.12, 3.11.4 and later)
        try:
            archive.extractall(folder, members=members,
                               **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        except getattr(tarfile, "FilterError", ()) as e:  # (a chain of links, each inside, that leads out)
            shutil.rmtree(folder, True)
            _refuse(path, what, f"holds a member that tarfile's data filter refuses ({e}); only regular files, "
                    "folders and links inside the folder are extracted")
    # the members' common folder, name by name (fairseq's common prefix of characters makes
    # 'model' of 'model1.pt' and 'model2.pt'), or the folder itself where they share none
    top = os.path.normpath(os.path.join(folder, posixpath.commonpath([posixpath.normpath(m.name) for m in members])))
    return top if os.path.isdir(top) else os.path.dirname(top)
