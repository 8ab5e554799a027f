"""What the benchmark counts and observes (not timed): the multiply-adds behind the
bounds (``FlopCounterMode``, CPU attention kernels included), the activations a training
forward pass saves for backward, the largest tensors, the CPU allocator's peak, the
multiply-adds of a beam search; and the timer and profiler of a pass."""
import gc
import os
import time
from typing import Dict, List

import torch

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
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    storages = {}  # storage -> (bytes, module that saved it first)
    parameter_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    running = ["(loss)"]  # the innermost module whose forward is running (none: the loss)

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
            if key in parameter_storages:  # weights saved for backward are not activations
                return t
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

    largest = [0, 0]  # any activation, attention-shaped activation (numel)
    vocab = model.decoder.output_projection.out_features
    seq_lens = {batch[0].size(1), batch[2].size(1)}
    # Tensors computed from parameters alone (a transposed or cast weight) are not
    # activations; they are tracked by id (and kept alive so ids are not reused).
    param_derived = {id(p): p for p in model.parameters()}
    in_forward = [True]

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not in_forward[0]:
                return out
            outs = out if isinstance(out, (tuple, list)) else (out,)
            inputs = [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor)]
            if inputs and all(id(a) in param_derived for a in inputs):
                for o in outs:
                    if isinstance(o, torch.Tensor):
                        param_derived[id(o)] = o
                return out
            for o in outs:
                # the output layer's B x T x vocab logits are the same for every system
                if isinstance(o, torch.Tensor) and o.dim() > 0 and o.size(-1) != vocab:
                    largest[0] = max(largest[0], o.numel())
                    if sum(size in seq_lens for size in o.shape) >= 2:  # ... x Tq x Tk
                        largest[1] = max(largest[1], o.numel())
            return out

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
                    with Largest():
                        loss = _loss(model, batch)
            finally:
                for hook in hooks:
                    hook.remove()
            in_forward[0] = False
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
    return (float(counter.get_total_flops()), sum(b for b, _ in storages.values()), by_module, largest[0],
            largest[1] / attention, peak)


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


def profile_pass(name: str, fn, device, out_dir: str) -> List[dict]:
    """Run ``fn`` once under ``torch.profiler`` and write torch's table of the ops with
    the most self time (device time on a GPU, CPU time on a CPU) to
    ``out_dir/<name>.txt``, each name whole (torch cuts names at 55 characters by
    default, and autograd's are longer); returns those ops as records (name, calls, self ms,
    share of the pass's total self time)."""
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
    with open(os.path.join(out_dir, f"{name}.txt"), "w") as f:
        width = max([55] + [len(e.key) + 4 for e, _ in top])  # (torch keeps 4 of it for a margin)
        f.write(events.table(sort_by=key, row_limit=PROFILE_ROWS, max_name_column_width=width))
    return [dict(op=e.key, calls=e.count, self_ms=t / 1000.0, share=t / total) for e, t in top]

