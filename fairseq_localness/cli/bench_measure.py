"""What the benchmark counts and observes (not timed): the multiply-adds behind the
bounds (``FlopCounterMode``, CPU attention kernels included), the activations a training
forward pass saves for backward, the largest tensors, the CPU allocator's peak, the
multiply-adds of a beam search; and the timer and profiler of a pass."""
import collections
import contextlib
import gc
import os
import time
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fairseq_localness.cli.bench_model import _decode, _loss, _sync


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def flop_counter():
    """``FlopCounterMode`` that also counts the CPU kernels of
    ``F.scaled_dot_product_attention`` (torch counts only its GPU kernels; without
    this, attention computed through SDPA on a CPU would count as free and attention
    through ``matmul`` would not)."""
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    mapping = {}
    if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
        mapping[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_sdpa_flops
        mapping[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_sdpa_backward_flops
    return FlopCounterMode(display=False, custom_mapping=mapping)


def _module_key(name: str) -> str:
    """``encoder.layers.3.self_attn.local_unit.norm`` -> ``encoder.layers.*.self_attn.local_unit``:
    layer numbers folded, at most two levels below a layer."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers":
        parts[2] = "*"
        parts = parts[:5]
    return ".".join(parts) or "(model)"  # the model itself: its own forward, outside submodules


class LargestActivations(TorchDispatchMode):
    """While active, the number of elements of the largest tensor the ops compute
    (``any``) and of the largest attention-shaped one (``attention``: two of its
    dimensions are among ``seq_lens``), leaving out the ``... x vocab`` logits (the
    same for every system) and tensors computed from parameters alone (a transposed
    or cast weight: tracked by id, and kept alive so that ids are not reused).

    Higher-order operators (FlexAttention's fused call, ``torch.cond``) come here too
    and are run and observed like any op: their outputs are what they compute."""

    supports_higher_order_operators = True

    def __init__(self, parameters, vocab: int, seq_lens):
        super().__init__()
        self.param_derived = {id(p): p for p in parameters}
        self.vocab = vocab
        self.seq_lens = set(seq_lens)
        self.any = self.attention = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = [o for o in tree_leaves(out) if isinstance(o, torch.Tensor)]
        inputs = [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
        if inputs and all(id(a) in self.param_derived for a in inputs):
            for o in outs:
                self.param_derived[id(o)] = o
            return out
        for o in outs:
            if o.dim() > 0 and o.size(-1) != self.vocab:
                self.any = max(self.any, o.numel())
                if sum(size in self.seq_lens for size in o.shape) >= 2:  # ... x Tq x Tk
                    self.attention = max(self.attention, o.numel())
        return out


@contextlib.contextmanager
def observable(model, device):
    """The passes observed by a Python dispatch mode (``FlopCounterMode``,
    :class:`LargestActivations`) on the eager path where the model's own path would
    run FlexAttention: the cores on ``"auto"`` or ``"sdpa"`` on CUDA, where the fast
    path's branches are compiled flex calls, and on ``"flex"`` (a core on ``"dense"``
    keeps its SDPA calls, whose activations are what that path keeps). A compiled call
    cannot run under such a mode (torch.compile: "non-infra torch dispatch mode
    present"), nor can the uncompiled one there (torch 2.13: no rule for the
    ``flex_attention`` operator). The eager path
    computes the same distributions, so its multiply-adds are the reference
    computation's; the activations saved are the eager path's too. On a GPU the
    benchmark measures the memory of the model's own path separately (its step's peak,
    :func:`~.bench_run._cuda_step_peak`). Yields whether the path was switched (not
    where every core is on the eager path already, or there is none)."""
    from fairseq_localness.modules.attention import AttentionCore

    cores = [m for m in model.modules() if isinstance(m, AttentionCore)]
    saved = [core.attention_impl for core in cores]

    def runs_flex(impl: str) -> bool:  # ("dense" and "eager" never do)
        return impl == "flex" or (device.type == "cuda" and impl in ("auto", "sdpa"))

    switch = any(runs_flex(impl) for impl in saved)
    if switch:
        for core in cores:
            if runs_flex(core.attention_impl):
                core.attention_impl = "eager"
    try:
        yield switch
    finally:
        for core, impl in zip(cores, saved):
            core.attention_impl = impl


def measure_static(model, batch, num_heads: int, device):
    """One training forward + backward pass, observed (not timed) for: the multiply-adds
    (:func:`flop_counter`), the bytes saved for backward (in total and by the module
    that saved them), the largest activation of the forward pass (elements), the
    largest attention-shaped activation (two of its dimensions are sequence lengths;
    in units of ``B x H x T x T``) and, on a CPU, the allocator's peak above the start
    (``torch.profiler`` memory events).

    Returns ``(flops, saved bytes, saved bytes by module, largest numel, largest T x T
    ratio, peak bytes or None)``.
    """
    storages = {}  # storage -> (bytes, module that saved it first)
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    running = ["(loss)"]  # the innermost module whose forward is running (none: the loss)

    from fairseq_localness.modules.context import distance_table_storages

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
            if key in parameter_storages or key in distance_table_storages():
                return t  # weights, and the masks' cached tables of distances, are not activations
            nbytes = t.untyped_storage().nbytes()
            owner = storages[key][1] if key in storages else running[-1]
            storages[key] = (max(storages.get(key, (0, ""))[0], nbytes), owner)
        except (RuntimeError, NotImplementedError):
            pass
        return t

    names = {module: _module_key(name) for name, module in model.named_modules()}

    def enter(module, args):
        running.append(names[module])

    def leave(module, args, output):
        running.pop()  # returns None: the output is left alone

    hooks = []
    for module in names:
        hooks.append(module.register_forward_pre_hook(enter))
        hooks.append(module.register_forward_hook(leave))

    vocab = model.decoder.output_projection.out_features
    largest = LargestActivations(model.parameters(), vocab, {batch[0].size(1), batch[2].size(1)})

    model.zero_grad(set_to_none=True)
    gc.collect()  # frees of earlier models' memory must not fall inside the profile
    profiler = None
    if device.type == "cpu":
        from torch.profiler import ProfilerActivity, profile

        profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        profiler.__enter__()
    try:
        with flop_counter() as counter:
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    with largest:
                        loss = _loss(model, batch)
            finally:
                for hook in hooks:
                    hook.remove()
            loss.backward()
        del loss
    finally:
        if profiler is not None:
            profiler.__exit__(None, None, None)
    peak = None
    if profiler is not None:
        events = [e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
        current = peak = 0
        for event in sorted(events, key=lambda e: e.start_ns()):
            current += event.nbytes()
            peak = max(peak, current)
    model.zero_grad(set_to_none=True)
    by_module: Dict[str, int] = {}
    for nbytes, owner in storages.values():
        by_module[owner] = by_module.get(owner, 0) + nbytes
    src, prev = batch[0], batch[2]
    attention = src.size(0) * num_heads * max(src.size(1), prev.size(1)) ** 2
    return (float(counter.get_total_flops()), sum(b for b, _ in storages.values()), by_module, largest.any,
            largest.attention / attention, peak)


def measure_decode_flops(model, task, decode_src, decode_len) -> float:
    """Multiply-adds (``FlopCounterMode``, as for training) of one beam search: the
    encoder once, then ``decode_len`` incremental decoder steps of 4 beams."""
    with flop_counter() as counter:
        _decode(model, task, decode_src, decode_len)
    return float(counter.get_total_flops())


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def _timed(fn, device, clock: str = "wall") -> float:
    """Seconds ``fn`` takes: wall-clock time, or with ``clock="cpu"`` the CPU time of
    this process (all its threads), which time spent waiting for a core that other
    processes hold does not count."""
    now = CLOCKS[clock]
    _sync(device)
    start = now()
    fn()
    _sync(device)
    return now() - start


PROFILE_ROWS = 25

# What torch's sync debug mode warns with (``torch.cuda.set_sync_debug_mode("warn")``)
SYNC_WARNING = "called a synchronizing CUDA operation"


def count_syncs(fn, device) -> Optional[collections.Counter]:
    """Run ``fn`` once under :func:`host_waits` and return the waits of the host for
    the GPU that torch's sync debug mode reports, by where Python made them (``file:line``
    -> count); None on a device that is no GPU.

    A step bound by its host loses the GPU's whole queue at each wait: the host stops
    launching until the GPU has run everything launched before, and the GPU then idles
    until the host has launched again. The transformer's own (fairseq's encoder tests
    its padding mask for any padding) are the baseline; a model should add none."""
    if device.type != "cuda":
        return None
    _sync(device)
    with host_waits() as waits:
        fn()
    _sync(device)
    return waits


@contextlib.contextmanager
def host_waits():
    """Within it, torch's sync debug mode warns at the host's waits for the GPU that it
    sees (the mode restored after it, also when the body fails); yields a Counter that
    it fills on exit with those waits by where Python made them (``file:line``). Other
    warnings are swallowed while it runs.

    The mode sees the operations that go through ``c10::cuda::memcpy_and_sync`` or
    ``stream_synchronize``: ``.item()``, ``bool()``, ``.tolist()``, ``nonzero``,
    ``masked_select`` and boolean indexing, blocking copies between host and GPU in
    either direction, ``Stream.synchronize()``. A wait in a backward function written
    in C++ is reported at ``graph.py``'s call into the autograd engine (the engine
    replays its threads' warnings there), one in Python at its own line. It does not
    see ``torch.cuda.synchronize()``, ``Event.synchronize()``, non-blocking copies
    from pageable memory, the CUDA runtime's or libraries' own synchronisations
    (``cudaFree`` in the allocator, cuDNN), nor C++ called without torch's Python
    warning handler (Inductor's C++ wrapper): the counts are a lower bound, compared
    between systems run alike."""
    waits = collections.Counter()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield waits
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            waits.update(f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught
                         if SYNC_WARNING in str(w.message))

# The profiled passes' ranges around each attention sublayer's forward call (host time)
SUBLAYER_PREFIX = "sublayer: "


@contextlib.contextmanager
def labelled_sublayers(model):
    """Within it, every self- and encoder-decoder attention of ``model``'s layers runs its
    forward call inside a profiler range named ``"sublayer: <side> <kind> (<class>)"``,
    so that a profile shows each sublayer's host time per call beside the others' (the
    transformer's fairseq ``MultiheadAttention`` against a model's own)."""
    handles = []
    for side in ("encoder", "decoder"):
        for layer in getattr(getattr(model, side, None), "layers", ()):
            for kind in ("self_attn", "encoder_attn"):
                module = getattr(layer, kind, None)
                if module is None:
                    continue
                label = f"{SUBLAYER_PREFIX}{side} {kind} ({type(module).__name__})"
                ranges = []

                def enter(_module, _args, label=label, ranges=ranges):
                    ranges.append(torch.profiler.record_function(label))
                    ranges[-1].__enter__()

                def leave(_module, _args, _output, ranges=ranges):
                    ranges.pop().__exit__(None, None, None)

                handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _sublayer_lines(events) -> List[str]:
    """The host time of each labelled sublayer (:func:`labelled_sublayers`): calls, CPU
    time in all and per call (its own ops and what they called, forward only)."""
    rows = sorted((e for e in events if e.key.startswith(SUBLAYER_PREFIX)), key=lambda e: e.key)
    if not rows:
        return []
    lines = ["", "Attention sublayers' forward calls, host time (CPU time with their children):", ""]
    lines += [f"{e.key[len(SUBLAYER_PREFIX):]:60s} calls {e.count:5d}  CPU {e.cpu_time_total / 1000.0:9.3f} ms  "
              f"per call {e.cpu_time_total / 1000.0 / max(e.count, 1):7.3f} ms" for e in rows]
    return lines + [""]


def profile_pass(name: str, fn, device, out_dir: str) -> Tuple[List[dict], Optional[dict]]:
    """Run ``fn`` once under ``torch.profiler`` and write torch's table of the ops with
    the most self time (device time on a GPU, CPU time on a CPU) to
    ``out_dir/<name>.txt``, each name whole (torch cuts names at 55 characters by
    default, and autograd's are longer), followed by the host time of each attention
    sublayer's forward calls where :func:`labelled_sublayers` labelled them; on a GPU
    also the ops with the most self CPU time to ``out_dir/<name>.host.txt`` (where a
    step bound by its host spends that time: launches, compiled calls' wrappers).
    Returns those ops as records (name, calls, self ms, share of the pass's total self
    time) and, on a GPU, the pass's launches: the CUDA kernels, memory copies and fills
    it ran (``kernels``), their summed device time (``device_ms``) and, from a second
    run of ``fn``, the times the host waited for the GPU (``syncs``, :func:`count_syncs`;
    where, in ``out_dir/<name>.syncs.txt``), else ``None``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    self_us = [(e, getattr(e, key)) for e in events]
    total = sum(t for _, t in self_us) or 1.0
    top = sorted(self_us, key=lambda et: -et[1])[:PROFILE_ROWS]
    os.makedirs(out_dir, exist_ok=True)
    width = max([55] + [len(e.key) + 4 for e, _ in top])  # (torch keeps 4 of it for a margin)
    with open(os.path.join(out_dir, f"{name}.txt"), "w") as f:
        f.write(events.table(sort_by=key, row_limit=PROFILE_ROWS, max_name_column_width=width))
        f.write("\n".join(_sublayer_lines(events)))
    if device.type == "cuda":  # where a step bound by its host spends that time
        with open(os.path.join(out_dir, f"{name}.host.txt"), "w") as f:
            f.write(events.table(sort_by="self_cpu_time_total", row_limit=PROFILE_ROWS, max_name_column_width=width))
    launches = None
    if device.type == "cuda":
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        launches = dict(kernels=len(kernels), device_ms=sum(e.time_range.elapsed_us() for e in kernels) / 1000.0)
        syncs = count_syncs(fn, device)  # (a second run: the sync debug mode's warnings outside the profile)
        launches["syncs"] = sum(syncs.values())
        with open(os.path.join(out_dir, f"{name}.syncs.txt"), "w") as f:
            f.write("".join(f"{count} {site}\n" for site, count in syncs.most_common()))
    return [dict(op=e.key, calls=e.count, self_ms=t / 1000.0, share=t / total) for e, t in top], launches

