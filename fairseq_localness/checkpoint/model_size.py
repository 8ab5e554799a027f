"""A model built from a checkpoint's settings is no larger than what it stores.

fairseq builds the model a checkpoint's settings describe, allocating and
initialising every weight, before it compares the stored weights with it: a
checkpoint of a few kilobytes whose settings claim ``max_source_positions =
5000000`` or ``encoder_ffn_embed_dim = 5000000`` makes fairseq allocate gigabytes
(the sinusoidal positions are not stored at all, so such a file would even load).

:func:`guarded_build_model` wraps ``fairseq.models.build_model``: when a model is
built for a checkpoint (``from_checkpoint=True``, or anywhere within
``load_model_ensemble_and_task``, :func:`loading_checkpoint`: generation, the hub and
the analyses), it is first built on torch's
``meta`` device, which allocates nothing, and its weights and buffers are counted
as they are registered: more elements than the checkpoint stores plus a quarter plus
:data:`SLACK` (buffers that are not stored, such as the positions' table), or more
tensors than :data:`TENSORS_PER_STORAGE` per tensor it stores plus :data:`SLACK_TENSORS`,
or a build longer than :data:`MAX_BUILD_SECONDS`, is refused in one line naming the
file, as soon as the build passes the bound (a model of ``encoder_layers = 10**6``
would take an hour to build even on ``meta``). A model that cannot be built on
``meta`` at all is refused too, unless the file is trusted: its size is unknown.
:func:`remember_weights` notes what the last checkpoint loaded stores: the elements
of its storages, each storage counted once however many names point at it (one
storage under 300 names is one storage), and the number of its storages.
"""
import contextlib
import copy
import functools
import signal
import sys
import threading
import time

import torch

from fairseq_localness.checkpoint.errors import CheckpointError, UntrustedCheckpointError

SLACK = 1 << 24
"""Elements a model may have beyond what its checkpoint stores: 64 MiB in float32."""
TENSORS_PER_STORAGE = 3
"""Weights a model may have per tensor (storage) its checkpoint stores: fairseq's upgrade
of older checkpoints splits an attention's ``in_proj_weight`` into three. Counted per
storage, not per name: names (and the same tensor under many of them) cost a file a few
bytes each, a storage is a member of its zip (at most
:data:`~fairseq_localness.checkpoint.scan.MAX_RECORDS`)."""
SLACK_TENSORS = 256
"""Weights and buffers beyond those: buffers that are not stored (a positions'
``_float_tensor``)."""
MAX_BUILD_SECONDS = 30.0
"""The longest the build on ``meta`` may take, in CPU time (a machine under load, or an
import the build waits for, does not count), a last bound behind the two in elements
and tensors: a Transformer-big builds in about 0.05 s, a hundred layers in about 0.5 s.
Checked at each registration (the building thread's time, ``time.thread_time``) and,
in the main thread, by a timer of the process's time in user mode that interrupts the
build wherever it is (:func:`_cpu_alarm`)."""


class _TooLarge(BaseException):
    """The model being built has passed the bound (``what``: which). A ``BaseException``,
    as ``KeyboardInterrupt`` is: raised from within the build (a registration, or the
    timer at any point of it), it passes the ``except Exception`` of the code it
    interrupts (hydra's, a model's) instead of becoming another error."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what

_last = threading.local()


@contextlib.contextmanager
def loading_checkpoint():
    """The block is fairseq's load of a checkpoint's model (``load_model_ensemble_and_task``):
    every model built in it is built for the checkpoint, whether or not its task passes
    ``from_checkpoint`` on (fairseq passes it only to a task whose ``build_model`` names
    it: ``sentence_prediction_adapters``, ``speech_dlm_task`` and ``nlu_finetuning`` do
    not, and their models would be built unchecked)."""
    depth = getattr(_last, "loading", 0)
    _last.loading = depth + 1
    try:
        yield
    finally:
        _last.loading = depth


def loading() -> bool:
    """Whether this thread is within :func:`loading_checkpoint`."""
    return bool(getattr(_last, "loading", 0))


def remember_weights(state, file: str):
    """Note the elements of the weights ``state["model"]`` stores (from ``file``)."""
    model = state.get("model") if isinstance(state, dict) else None
    if isinstance(model, dict):
        storages = {}
        for v in model.values():
            if isinstance(v, torch.Tensor):
                storage = v.untyped_storage()
                storages[(storage.data_ptr(), storage.device)] = storage.nbytes() // max(v.element_size(), 1)
        _last.file, _last.numel, _last.storages = file, sum(storages.values()), len(storages)


@contextlib.contextmanager
def _bounded(max_numel: int, max_tensors: int, seconds: float):
    """Raise :class:`_TooLarge` as soon as the weights and buffers registered inside
    pass ``max_numel`` elements or ``max_tensors`` tensors, or a module, weight or
    buffer is registered after ``seconds`` of this thread's CPU time."""
    from torch.nn.modules import module as nn_module

    counted = {"numel": 0, "tensors": 0}
    seen = set()
    deadline = time.thread_time() + seconds
    builder = threading.get_ident()  # (the hooks are the process's: other threads' modules are not counted)

    def in_time(module, name, child):
        if threading.get_ident() == builder and time.thread_time() > deadline:
            raise _TooLarge(f"that takes more than {seconds:g} s to build even without allocating it")

    def count(module, name, tensor):
        if threading.get_ident() != builder:
            return
        in_time(module, name, tensor)
        if tensor is not None and id(tensor) not in seen:
            seen.add(id(tensor))
            counted["numel"] += tensor.numel()
            counted["tensors"] += 1
            if counted["numel"] > max_numel:
                raise _TooLarge(f"of more than {max_numel:,} weight and buffer elements, far more than the "
                                f"{_last.numel:,} it stores")
            if counted["tensors"] > max_tensors:
                raise _TooLarge(f"of more than {max_tensors:,} weights and buffers, far more than the "
                                f"{_last.storages:,} tensors it stores")

    handles = [nn_module.register_module_parameter_registration_hook(count),
               nn_module.register_module_buffer_registration_hook(count),
               nn_module.register_module_module_registration_hook(in_time)]
    try:
        with _cpu_alarm(seconds, f"that takes more than {seconds:g} s to build even without allocating it"):
            yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _cpu_alarm(seconds: float, what: str):
    """Raise :class:`_TooLarge` (``what``) once the building thread has spent ``seconds``
    of CPU time within the block (``time.thread_time``, as the registration hooks count
    it), wherever the block then is: work a build does before it registers anything
    (fairseq converts a ``Namespace`` of settings into hydra overrides within
    ``build_model``, which a registration hook never sees). A timer of the process's CPU
    time in user mode (``ITIMER_VIRTUAL``) wakes the handler, which raises once the
    thread's own time is past the bound, and again at intervals (of ``seconds``, at most
    a second) after that: code that swallows the exception is interrupted again. Python
    runs the handler between two bytecodes, so a long call into C ends first. Only in the main thread (the only
    one where Python runs signal handlers) and where nothing else uses ``SIGVTALRM`` or
    its timer (an enclosing build's timer is the bound of a nested one); elsewhere the
    registration hooks of :func:`_bounded` are the bound."""
    if (threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer")
            or signal.getsignal(signal.SIGVTALRM) is not signal.SIG_DFL
            or signal.getitimer(signal.ITIMER_VIRTUAL)[0] > 0):
        yield
        return
    armed, deadline = [True], time.thread_time() + seconds

    def fire(signum, frame):
        if armed[0] and time.thread_time() > deadline:
            raise _TooLarge(what)

    previous = signal.signal(signal.SIGVTALRM, fire)
    try:
        try:
            signal.setitimer(signal.ITIMER_VIRTUAL, seconds, min(seconds, 1.0))
            yield
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_VIRTUAL, 0)
    finally:
        signal.signal(signal.SIGVTALRM, previous)


INITIALISERS = ("init_bert_params",)
"""fairseq's initialisers that read a weight's values on the host (``init_bert_params``:
``data.cpu().normal_()``, used by BART, mBART, RoBERTa, wav2vec 2.0 and the
non-autoregressive transformers), which a tensor on ``meta`` has none of: skipped in
the build on ``meta``, which allocates and initialises nothing anyway."""


@contextlib.contextmanager
def _initialisers_skipped():
    """:data:`INITIALISERS` replaced by a function that does nothing, in every module
    that holds them (the models import them by name), for the block."""
    try:
        from fairseq.modules import transformer_sentence_encoder
    except ImportError:  # pragma: no cover
        yield
        return
    originals = {name: getattr(transformer_sentence_encoder, name) for name in INITIALISERS
                 if hasattr(transformer_sentence_encoder, name)}
    replaced = [(module, name) for module in list(sys.modules.values()) for name, original in originals.items()
                if module is not None and getattr(module, name, None) is original]
    for module, name in replaced:
        setattr(module, name, _no_initialisation)
    try:
        yield
    finally:
        for module, name in replaced:
            setattr(module, name, originals[name])


def _no_initialisation(module):
    return None


def guarded_build_model(build_model):
    """``fairseq.models.build_model`` that refuses a checkpoint's model larger than
    the checkpoint (see the module docstring)."""
    if getattr(build_model, "_fairseq_localness_guarded", False):
        return build_model

    @functools.wraps(build_model)
    def guarded(cfg, task, from_checkpoint=False):
        stored = getattr(_last, "numel", None)
        if (from_checkpoint or loading()) and stored is not None:
            max_numel, max_tensors = stored + stored // 4 + SLACK, _last.storages * TENSORS_PER_STORAGE + SLACK_TENSORS
            depth = getattr(_last, "building", 0)
            _last.building = depth + 1
            try:  # (on a copy: building may change the settings, e.g. --encoder-layers-to-keep)
                with torch.device("meta"), _bounded(max_numel, max_tensors, MAX_BUILD_SECONDS), \
                        _initialisers_skipped():
                    build_model(copy.deepcopy(cfg), task, from_checkpoint)
            except _TooLarge as e:
                if depth:  # a model built within another's build: the outermost build refuses (an
                    raise  # error here could be caught by the enclosing model's code)
                raise UntrustedCheckpointError(
                    _last.file, f"its settings describe a model {e.what}; fairseq would build and allocate it all "
                    "before comparing", trust_helps=False) from None
            except CheckpointError:  # (a refusal of the build's own, e.g. of a setting fairseq evaluates)
                raise
            except Exception as e:
                # a model that cannot be built without memory (an initialiser of a model outside this
                # package that reads values, beyond INITIALISERS): its size is unknown, and fairseq
                # would allocate it whole; built only where the user trusts the file
                from fairseq_localness.checkpoint.load import trusted

                if not trusted():
                    raise UntrustedCheckpointError(
                        _last.file, f"its model cannot be built on torch's meta device to check its size against "
                        f"the weights it stores ({type(e).__name__}: {' '.join(str(e).split())[:80]}); fairseq "
                        "would build and allocate it all") from None
            finally:
                _last.building = depth
        return build_model(cfg, task, from_checkpoint)

    guarded._fairseq_localness_guarded = True
    return guarded
