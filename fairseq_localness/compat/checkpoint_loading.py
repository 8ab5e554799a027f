"""Checkpoint loading on torch >= 2.6, without running the checkpoint's code.

What fairseq does wrong: torch 2.6 changed the default of ``torch.load`` to
``weights_only=True``. fairseq 0.12 checkpoints pickle an ``argparse.Namespace``
(the model's options) next to the weights, so every fairseq entry point that reads a
checkpoint (``fairseq-generate``, ``fairseq-interactive``, resuming
``fairseq-train``, the hub interface ``from_pretrained``) fails with ``Unsupported
global: argparse.Namespace`` (fairseq issue #5610; fairseq's own fix, after 0.12,
passes ``weights_only=False``, i.e. runs whatever the file asks).

What the fix changes: all of those entry points read checkpoints through
``fairseq.checkpoint_utils``, and all of them import the ``--user-dir`` before the
first read. :func:`patch_checkpoint_loading` gives that one module a ``torch`` whose
``load`` is :func:`fairseq_localness.checkpoint.torch_load_checkpoint`:
``weights_only=True`` with ``argparse.Namespace`` allowed, which is everything a
fairseq 0.12 checkpoint holds; a checkpoint that needs anything else (a pickle that
would call ``os.system``, say) is refused in one line naming what it needs, before it
is unpickled, unless ``FAIRSEQ_LOCALNESS_TRUST_CHECKPOINTS=1`` says to trust it
(docs/security.md). Nothing else in the process changes: ``torch.load`` called
anywhere else keeps torch's own default.

Distributed training that resumes reads the checkpoint on rank 0 (through the load
above) and sends the state it built to the other ranks, which unpickle it with
``torch.load`` in ``fairseq.distributed.utils``. That message holds OmegaConf
objects and fairseq's own placeholders, which ``weights_only`` refuses; it is no
file but what rank 0 of the same job pickled from objects it built (from a
checkpoint that passed the safe load), so that module's ``torch.load`` keeps full
unpickling for it (:func:`process_group_torch_load`).

The test that fails without it: ``tests/test_checkpoint_loading.py``,
``test_fairseq_generate_loads_checkpoint`` (and every other test there that loads a
checkpoint through fairseq).
"""
import functools
import os
import types

import torch

from fairseq_localness.checkpoint.errors import short_error

_MARK = "_fairseq_localness_checkpoint_load"


def process_group_torch_load(f, *args, **kwargs):
    """``torch.load`` for what rank 0 of this job sends the other ranks
    (``fairseq.distributed.utils``): full unpickling unless told otherwise. No file is
    read through it."""
    kwargs.setdefault("weights_only", False)
    return torch.load(f, *args, **kwargs)


class _TorchWithLoad(types.ModuleType):
    """A stand-in for the ``torch`` module inside one fairseq module.

    Every attribute is torch's own, except ``load``.
    """

    def __init__(self, load):
        super().__init__("torch")
        setattr(self, _MARK, True)
        self.load = load

    def __getattr__(self, name):
        return getattr(torch, name)


def _building_for_checkpoint(function):
    """``load_model_ensemble_and_task`` within which every model built is built for the
    checkpoint, and so checked against its size
    (:func:`~fairseq_localness.checkpoint.model_size.loading_checkpoint`); unchanged
    where it is already patched."""
    from fairseq_localness.checkpoint.model_size import loading_checkpoint

    if getattr(function, _MARK, False):
        return function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with loading_checkpoint():
            return function(*args, **kwargs)

    return wrapper


def _one_line_failures(function, files_of, doing="build the model it describes"):
    """``function`` (which reads a checkpoint, builds its model or resumes from it:
    ``doing`` says which) with every failure that is not about the environment (a
    missing file is) raised as one :class:`~fairseq_localness.checkpoint.CheckpointError`
    naming the checkpoint."""
    from fairseq_localness.checkpoint import CheckpointError, MalformedCheckpointError

    if getattr(function, _MARK, False):
        return function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (CheckpointError, OSError):
            raise
        except Exception as e:
            cause = e.__context__ if str(e).startswith("Cannot load model parameters from checkpoint") else e
            raise MalformedCheckpointError(
                files_of(*args, **kwargs),
                f"fairseq cannot {doing} ({short_error(cause or e, 240, whole=True, kind=True)})"
            ) from e

    setattr(wrapper, _MARK, True)
    return wrapper


def _checked_folder(load_archive_file):
    """fairseq's ``file_utils.load_archive_file`` (through which ``from_pretrained``
    finds its folder), an archive extracted by
    :func:`~fairseq_localness.checkpoint.files.extract_archive` instead of fairseq's
    own extraction, and the BPE, tokenizer and dictionary files the hub will read from
    that folder checked (:func:`~fairseq_localness.checkpoint.files.check_beside`)."""
    from fairseq_localness.checkpoint.files import check_beside

    if getattr(load_archive_file, _MARK, False):
        return load_archive_file

    @functools.wraps(load_archive_file)
    def wrapper(archive_file, *args, **kwargs):
        from fairseq.file_utils import cached_path

        from fairseq_localness.checkpoint.files import extract_archive

        try:  # (a name of fairseq's archive map, a URL, a path: resolved once, as fairseq's own does)
            resolved = cached_path(archive_file, cache_dir=None)
        except EnvironmentError:
            resolved = None
        if not isinstance(resolved, str):  # (not found: fairseq's own says so)
            folder = load_archive_file(archive_file, *args, **kwargs)
        elif os.path.isdir(resolved):
            folder = resolved
        else:
            # an archive: extracted safely and left in place (fairseq's own would extract
            # every member as named, then delete the archive: extract_archive)
            folder = extract_archive(resolved)
        if isinstance(folder, str):
            check_beside(folder)
        return folder

    setattr(wrapper, _MARK, True)
    return wrapper


def _named_dictionaries(from_pretrained):
    """fairseq's ``hub_utils.from_pretrained`` with a missing dictionary (``dict.*.txt``,
    which the task reads from ``data_name_or_path``, never from the checkpoint) raised
    as the same ``FileNotFoundError`` whose message says where it was looked for and
    what to pass instead; fairseq's own message names the file alone."""
    if getattr(from_pretrained, _MARK, False):
        return from_pretrained

    @functools.wraps(from_pretrained)
    def wrapper(model_name_or_path, checkpoint_file="model.pt", data_name_or_path=".", *args, **kwargs):
        try:
            return from_pretrained(model_name_or_path, checkpoint_file, data_name_or_path, *args, **kwargs)
        except FileNotFoundError as e:
            name, folder = os.path.basename(str(e.filename or "")), os.path.dirname(str(e.filename or ""))
            # the data folder as fairseq resolves it from local folders: a value starting
            # with '.' is relative to the model's folder (model names of an archive map,
            # URLs and archives are left to fairseq's own message)
            if data_name_or_path.startswith("."):  # (fairseq's own test)
                data = os.path.join(str(model_name_or_path), data_name_or_path)
                where = ", relative to the model's folder"
            else:
                data, where = str(data_name_or_path), ""
            if not (name.startswith("dict.") and name.endswith(".txt") and os.path.isdir(data)
                    and os.path.abspath(folder) == os.path.abspath(data)):
                raise
            raise FileNotFoundError(
                e.errno, f"no dictionary {name} in {folder!r}, where data_name_or_path={data_name_or_path!r} "
                f"points{where}: the task reads its dictionaries from there, not from the checkpoint; expected "
                f"data_name_or_path= the data-bin the model was trained on (or a folder with its dict.*.txt)",
                e.filename) from e

    setattr(wrapper, _MARK, True)
    return wrapper


def _one_line_hub(init):
    """``GeneratorHubInterface.__init__`` (the hub builds the tokenizer, the BPE and
    the alignment dictionary from the loaded checkpoint's settings) with the files it
    reads checked first and every failure raised as one line naming the checkpoint."""
    from fairseq_localness.checkpoint import CheckpointError, MalformedCheckpointError
    from fairseq_localness.checkpoint.files import HUB_FILES, check_hub_settings, last_file

    if getattr(init, _MARK, False):
        return init

    @functools.wraps(init)
    def wrapper(self, cfg, task, models, *args, **kwargs):
        file = last_file() or "<from_pretrained>"
        check_hub_settings(cfg, file)
        try:
            return init(self, cfg, task, models, *args, **kwargs)
        except CheckpointError:
            raise
        except Exception as e:
            named = [f"{group} {getattr(cfg.get(group), '_name', None)!r}" for group in ("bpe", "tokenizer")
                     if cfg.get(group) is not None]
            raise MalformedCheckpointError(
                file, f"the hub cannot build the {' and '.join(named) or 'BPE and tokenizer'} its settings name "
                f"({short_error(e, 160, whole=True, kind=True)}); the files they need are read from beside the "
                f"checkpoint ({', '.join(HUB_FILES)}) or from from_pretrained's keyword arguments (e.g. "
                "sentencepiece_model=...), never from the checkpoint's own settings") from e

    setattr(wrapper, _MARK, True)
    return wrapper


def checkpoint_open(file, mode="r", *args, **kwargs):
    """``open`` as ``fairseq.checkpoint_utils`` and ``fairseq.file_io`` see it: a
    checkpoint they read (``"rb"``) is opened without waiting for a writer and
    refused in one line unless it is a regular file (a FIFO would hang ``open``
    itself); everything else is Python's ``open``."""
    from fairseq_localness.checkpoint.load import open_regular

    defaults = {"buffering": -1, "encoding": None, "errors": None, "newline": None}  # (PathManager.open passes them)
    if (mode == "rb" and not args and all(defaults.get(k, object()) == v for k, v in kwargs.items())
            and isinstance(file, (str, os.PathLike))):
        return open_regular(file)
    return open(file, mode, *args, **kwargs)


def patch_checkpoint_loading():
    """Make ``fairseq.checkpoint_utils`` load fairseq checkpoints on torch >= 2.6
    through :func:`~fairseq_localness.checkpoint.torch_load_checkpoint`, and
    ``fairseq.distributed.utils`` receive the state rank 0 sends; make fairseq's
    ``eval()`` of its settings parse literals only
    (:mod:`fairseq_localness.checkpoint.literals`); refuse a checkpoint whose
    settings describe a model larger than it stores before fairseq allocates it
    (:mod:`fairseq_localness.checkpoint.model_size`); turn a failure to build a model
    from a loaded checkpoint (weights that do not fit the model its settings
    describe, a damaged setting) into one line naming the file, in
    ``load_checkpoint_to_cpu`` (fairseq's upgrade of older settings),
    ``load_model_ensemble_and_task`` (generation, the hub, the analyses) and
    ``Trainer.load_checkpoint`` (resuming, ``--restore-file``,
    ``--finetune-from-model``); open the checkpoints fairseq reads as regular files
    only (:func:`checkpoint_open`); check what a resume takes from its checkpoint
    against the run (:func:`~fairseq_localness.checkpoint.resume.guard_trainer`);
    check the files the hub reads beside a checkpoint and turn a failure to build its
    BPE or tokenizer into one line (:mod:`fairseq_localness.checkpoint.files`); say
    where the hub looked for a missing dictionary (:func:`_named_dictionaries`).
    Installs the hook that prints a refused checkpoint as one line. Idempotent.
    """
    from fairseq import checkpoint_utils, file_io, file_utils, hub_utils, models, trainer
    from fairseq.data import iterators
    from fairseq.distributed import utils as distributed_utils

    from fairseq_localness.checkpoint import install_excepthook, literals, torch_load_checkpoint
    from fairseq_localness.checkpoint.model_size import guarded_build_model
    from fairseq_localness.checkpoint.resume import guard_trainer

    literals.install()
    models.build_model = guarded_build_model(models.build_model)
    for module, load in ((checkpoint_utils, torch_load_checkpoint), (distributed_utils, process_group_torch_load)):
        if not getattr(module.torch, _MARK, False):
            module.torch = _TorchWithLoad(load)
    checkpoint_utils.open = checkpoint_open
    file_io.open = checkpoint_open  # (PathManager.open: only checkpoints are read through it in binary, the EMA's)
    guard_trainer(trainer.Trainer, iterators.EpochBatchIterator)
    checkpoint_utils.load_checkpoint_to_cpu = _one_line_failures(
        checkpoint_utils.load_checkpoint_to_cpu, lambda path, *a, **k: str(path), "read it")
    checkpoint_utils.load_model_ensemble_and_task = _one_line_failures(
        _building_for_checkpoint(checkpoint_utils.load_model_ensemble_and_task),
        lambda filenames, *a, **k: ", ".join(map(str, filenames)))
    trainer.Trainer.load_checkpoint = _one_line_failures(  # (a scheduler's state of another kind: KeyError 'best')
        trainer.Trainer.load_checkpoint, lambda self, filename, *a, **k: str(filename), "resume training from it")
    file_utils.load_archive_file = _checked_folder(file_utils.load_archive_file)
    from fairseq.data.audio import data_cfg

    from fairseq_localness.checkpoint.files import checked_configuration

    data_cfg.get_config_from_yaml = checked_configuration(data_cfg.get_config_from_yaml)
    hub_utils.GeneratorHubInterface.__init__ = _one_line_hub(hub_utils.GeneratorHubInterface.__init__)
    hub_utils.from_pretrained = _named_dictionaries(hub_utils.from_pretrained)
    install_excepthook()
