"""Speed, memory and size of every model against fairseq's transformer (``make bench``).

For each system (an architecture plus options, listed in
:mod:`fairseq_localness.cli.bench_systems`) at one size preset, in one process, with
every model in ``--dtype`` (fp32, fp16 or bf16):

* **train tok/s**: target tokens per second of a full training step (forward,
  backward, Adam step) on a fixed synthetic batch; in fp16/bf16 the step is fairseq's
  ``--fp16``/``--bf16`` step: the model in that dtype, fp32 master weights for Adam
  (and a loss scale in fp16);
* **bound**: the arithmetic bound on the training throughput ratio: multiply-adds of
  one training step of the transformer divided by those of the system, counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (matrix products, convolutions and
  attention, including the CPU kernels of ``scaled_dot_product_attention``);
* **decode sent/s**: sentences per second of beam search (beam 4) with the output
  length pinned (``min_len = max_len``), so every system decodes the same number of
  steps whatever its (random) weights predict;
* **decode bound**: the same bound for decoding: multiply-adds of the transformer's
  beam search divided by the system's, counted over one whole search (the encoder
  once, then every decoder step with its cache);
* **peak MB**: peak memory of one training forward + backward pass above what is
  allocated before it (activations, temporaries, gradients), from the CPU allocator's
  allocation and free events as ``torch.profiler`` records them (``profile_memory``);
  on a GPU, ``torch.cuda.max_memory_allocated`` of a whole training step;
* **activations**: bytes of the tensors autograd saves for the backward pass of one
  training forward pass (deduplicated by storage, parameters excluded): the
  deterministic part of training memory that differs between systems; ``bench.json``
  also splits them by the (sub)module that saved them;
* **largest T x T**: the largest attention-shaped activation (two of its dimensions
  are sequence lengths) any op creates in a training forward pass, in units of the
  per-head attention weights ``B x H x T x T``: a value above 1 means the system
  materialises something larger than the attention weights it needs (e.g. stacked
  branch distributions or a ``T x T x Dh`` relative-position tensor);
* **largest tensor**: the largest activation of any shape in that pass (tensors
  computed from parameters alone, such as a transposed weight, and the output layer's
  ``B x T x vocab`` logits, which every system shares, aside), as a ratio to the
  transformer's (at short sentences the feed-forward hidden ``T x B x F`` is the
  transformer's largest);
* **params**: parameter count.

Timings are interleaved so that drift of the machine hits every system alike: the
systems are split into groups (``--group-size``, which bounds how many models with
their optimizer states are held in memory at once), each group also holds the
transformer, and in every round (``--repeats``) the transformer and then each system
of the group are timed one after the other. A system's ratio is the median over
rounds of ``transformer time / system time`` within the round (paired, so a slow
round cancels), and its tok/s or sent/s the median over rounds. Absolute numbers
from different runs or machines are not comparable; the ratios are the result.

``--quick`` (CI) uses a small batch and few rounds and finishes in under 3 minutes on
2 CPU cores; the default is meant for a GPU or a patient CPU.
"""
import argparse
import gc
import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

import torch

from fairseq_localness.cli.bench_systems import BASELINE, SYSTEMS, select

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Result:
    name: str
    arch: str
    options: List[str]
    attention_impl: str = "auto"
    params: int = 0
    train_flops: float = 0.0
    decode_flops: float = 0.0
    train_times: List[float] = field(default_factory=list)
    decode_times: List[float] = field(default_factory=list)
    # per round: transformer time / system time, both measured in that round
    train_ratios: List[float] = field(default_factory=list)
    decode_ratios: List[float] = field(default_factory=list)
    activation_bytes: int = 0
    # saved-for-backward bytes by the module that saved them, layer numbers as "*"
    activations_by_module: Dict[str, int] = field(default_factory=dict)
    peak_bytes: Optional[int] = None
    cuda_peak_bytes: Optional[int] = None
    largest_tensor_numel: int = 0
    largest_tensor_ratio: float = 0.0
    train_tokens: int = 0
    decode_sentences: int = 0
    # with --profile: the ops with the most self time in one training step and in one
    # beam search (name, calls, self time in ms, share of the pass's self time)
    profile: Dict[str, List[dict]] = field(default_factory=dict)
    error: Optional[str] = None

    @property
    def train_tok_s(self) -> float:
        return self.train_tokens / statistics.median(self.train_times) if self.train_times else 0.0

    @property
    def decode_sent_s(self) -> float:
        return self.decode_sentences / statistics.median(self.decode_times) if self.decode_times else 0.0

    @property
    def train_ratio(self) -> Optional[float]:
        return statistics.median(self.train_ratios) if self.train_ratios else None

    @property
    def decode_ratio(self) -> Optional[float]:
        return statistics.median(self.decode_ratios) if self.decode_ratios else None


class _Toy:
    """A task stand-in: a joined dictionary of ``vocab`` symbols."""

    def __init__(self, vocab: int):
        from fairseq.data import Dictionary

        d = Dictionary()
        for i in range(vocab - d.nspecial):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def build(model_name: str, size: str, options: List[str], task, device, dtype=torch.float32):
    from fairseq import options as fairseq_options
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_localness  # noqa: F401

    arch = f"{model_name}_{size}"
    parser = fairseq_options.get_training_parser()
    args = fairseq_options.parse_args_and_arch(
        parser, ["/dev/null", "--task", "translation", "--arch", arch, "--share-all-embeddings"] + options
    )
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task).to(device=device, dtype=dtype)
    return arch, model


def make_batch(task, bsz: int, src_len: int, tgt_len: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    lo, hi = d.nspecial, len(d)
    # lengths vary by up to 20% so that padding is exercised as in real batches
    lengths = [src_len - int(0.2 * src_len * i / max(bsz - 1, 1)) for i in range(bsz)]
    src = torch.full((bsz, src_len), d.pad(), dtype=torch.long)
    for b, n in enumerate(lengths):
        src[b, src_len - n :] = torch.randint(lo, hi, (n,), generator=g)
        src[b, -1] = d.eos()
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    tgt[:, -1] = d.eos()
    prev = torch.cat([torch.full((bsz, 1), d.eos(), dtype=torch.long), tgt[:, :-1]], 1)
    return src.to(device), torch.tensor(lengths, device=device), prev.to(device), tgt.to(device)


# --------------------------------------------------------------------------- dtype
def check_dtype(dtype: str, device_type: str, gpu_name: str = "", capability: Tuple[int, int] = (0, 0)):
    """``None`` if ``device_type`` (``"cpu"`` or ``"cuda"``, with the GPU's name and
    compute capability) can run the benchmark in ``dtype``, else why not.

    fp16 needs a CUDA GPU: fairseq trains in fp16 only there, and on a CPU most
    float16 ops run through float32 conversions (slower than fp32, so its timings
    would say nothing about the models). bf16 runs on the CPU and on GPUs with bfloat16 arithmetic (compute
    capability 8.0: A100, H100, ...); older GPUs emulate it.
    """
    if dtype == "fp16" and device_type != "cuda":
        return ("--dtype fp16: needs a CUDA GPU (fairseq trains in fp16 only on GPUs, and on the CPU most "
                "float16 ops run through float32 conversions); expected --dtype fp32 or bf16 on the CPU")
    if dtype == "bf16" and device_type == "cuda" and capability < (8, 0):
        return (f"--dtype bf16: {gpu_name} (compute capability {capability[0]}.{capability[1]}) has no "
                f"bfloat16 arithmetic (needs 8.0, e.g. A100, H100); expected --dtype fp16 or fp32")
    return None


class _MixedPrecisionAdam:
    """Adam on fp32 master copies of a fp16/bf16 model's parameters, as fairseq's
    ``FP16Optimizer`` (``--fp16``/``--bf16``): the gradients are copied to fp32 (and
    unscaled in fp16), Adam steps the master weights, which are copied back into the
    model. fp16 uses a fixed loss scale (fairseq's initial 128); bf16 needs none."""

    def __init__(self, model, lr: float, loss_scale: float):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.optimizer = torch.optim.Adam(self.master, lr=lr)
        self.loss_scale = loss_scale

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None

    def step(self):
        for p, m in zip(self.params, self.master):
            m.grad = None if p.grad is None else p.grad.float().mul_(1.0 / self.loss_scale)
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)


def make_optimizer(model, dtype):
    if dtype == torch.float32:
        return torch.optim.Adam(model.parameters(), lr=1e-4)
    return _MixedPrecisionAdam(model, lr=1e-4, loss_scale=128.0 if dtype == torch.float16 else 1.0)


def _train_step(model, optimizer, batch):
    src, lengths, prev, tgt = batch
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
    optimizer.zero_grad(set_to_none=True)
    (loss * getattr(optimizer, "loss_scale", 1.0)).backward()
    optimizer.step()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _loss(model, batch):
    src, lengths, prev, tgt = batch
    logits, _ = model(src, lengths, prev)
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


# --------------------------------------------------------------------------- counting
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


def _decode(model, task, decode_src, decode_len):
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    gen = SequenceGenerator(
        [model], task.target_dictionary, beam_size=4, max_len_a=0, max_len_b=decode_len, min_len=decode_len,
    )
    sample = {"net_input": {"src_tokens": decode_src[0], "src_lengths": decode_src[1]}}
    with torch.no_grad():
        gen.generate([model], sample)
    model.train()


def measure_decode_flops(model, task, decode_src, decode_len) -> float:
    """Multiply-adds (``FlopCounterMode``, as for training) of one beam search: the
    encoder once, then ``decode_len`` incremental decoder steps of 4 beams."""
    with flop_counter() as counter:
        _decode(model, task, decode_src, decode_len)
    return float(counter.get_total_flops())


def run_name(system: str, impl: str, impls: List[str]) -> str:
    """The row name of ``system`` run with ``attention_impl`` ``impl``: the system's
    name, with ``[impl]`` appended when the run compares several settings."""
    return f"{system} [{impl}]" if len(impls) > 1 else system


def _prepare(name, args, task, batch, decode_src, device, result: Result, impl: str = "auto"):
    """Build, measure (untimed) and warm up one system (its attention cores set to
    ``impl``); returns (model, optimizer) or None when the system fails (the failure
    is reported, not fatal)."""
    model_name, options = SYSTEMS[name]
    dtype = DTYPES[args.dtype]
    try:
        result.arch, model = build(model_name, args.size, options, task, device, dtype)
    except Exception as exc:
        result.error = f"build failed: {exc}"
        return None
    from fairseq_localness.modules.attention import set_attention_impl

    set_attention_impl(model, impl)
    result.params = sum(p.numel() for p in model.parameters())
    model.train()
    layer0 = model.encoder.layers[0]
    heads = layer0.self_attn.num_heads if hasattr(layer0, "self_attn") else 1
    (
        result.train_flops,
        result.activation_bytes,
        result.activations_by_module,
        result.largest_tensor_numel,
        result.largest_tensor_ratio,
        result.peak_bytes,
    ) = measure_static(model, batch, heads, device)
    optimizer = make_optimizer(model, dtype)
    _train_step(model, optimizer, batch)  # warm-up (allocates the optimizer state)
    # the decoding warm-up, counted (the same kernels run as in the timed searches)
    result.decode_flops = measure_decode_flops(model, task, decode_src, args.decode_len)
    result.train_tokens = int(batch[3].numel())
    result.decode_sentences = args.decode_batch
    print(f"built {name}: {result.params:,} parameters", file=sys.stderr)
    return model, optimizer


def _timed(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


PROFILE_ROWS = 25


def profile_pass(name: str, fn, device, out_dir: str) -> List[dict]:
    """Run ``fn`` once under ``torch.profiler`` and write torch's table of the ops with
    the most self time (device time on a GPU, CPU time on a CPU) to
    ``out_dir/<name>.txt``; returns those ops as records (name, calls, self ms,
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
        f.write(events.table(sort_by=key, row_limit=PROFILE_ROWS))
    return [dict(op=e.key, calls=e.count, self_ms=t / 1000.0, share=t / total) for e, t in top]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def select_device(args) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")


def run(args) -> List[Result]:
    device = select_device(args)
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    task = _Toy(args.vocab)
    batch = make_batch(task, args.batch_size, args.src_len, args.tgt_len, device)
    decode_src = make_batch(task, args.decode_batch, args.src_len, args.tgt_len, device, seed=1)[:2]
    impls = args.attention_impl
    # one row per system and attention_impl: (system, impl) by row name
    rows = {run_name(n, impl, impls): (n, impl) for n in select(args.systems or []) if n != BASELINE
            for impl in impls}
    names = list(rows)
    results = {BASELINE: Result(name=BASELINE, arch="", options=SYSTEMS[BASELINE][1])}
    for name, (system, impl) in rows.items():
        results[name] = Result(name=name, arch="", options=SYSTEMS[system][1], attention_impl=impl)
    base = results[BASELINE]
    prepared = _prepare(BASELINE, args, task, batch, decode_src, device, base)
    if prepared is None:
        sys.exit(f"fairseq-localness-bench: the baseline failed: {base.error}")
    base_model, base_opt = prepared

    size = max(1, args.group_size)
    groups = [names[i : i + size] for i in range(0, len(names), size)] or [[]]
    for number, group in enumerate(groups, 1):
        members = {}
        for name in group:
            system, impl = rows[name]
            prepared = _prepare(system, args, task, batch, decode_src, device, results[name], impl)
            if prepared is not None:
                members[name] = prepared
        for round_ in range(args.repeats):
            # training: the transformer, then each system of the group
            t_base = _timed(lambda: _train_step(base_model, base_opt, batch), device)
            base.train_times.append(t_base)
            for name, (model, opt) in members.items():
                t = _timed(lambda: _train_step(model, opt, batch), device)
                results[name].train_times.append(t)
                results[name].train_ratios.append(t_base / t)
            # decoding, in the same order
            d_base = _timed(lambda: _decode(base_model, task, decode_src, args.decode_len), device)
            base.decode_times.append(d_base)
            for name, (model, _) in members.items():
                d = _timed(lambda: _decode(model, task, decode_src, args.decode_len), device)
                results[name].decode_times.append(d)
                results[name].decode_ratios.append(d_base / d)
            print(f"group {number}/{len(groups)}: round {round_ + 1}/{args.repeats} done", file=sys.stderr)
        # the group's systems, and the transformer with the first group
        measured = list(members.items()) + ([(BASELINE, (base_model, base_opt))] if number == 1 else [])
        if args.profile:
            out_dir = os.path.join(args.output_dir, "profile")
            for name, (model, opt) in measured:
                results[name].profile = {
                    "train": profile_pass(f"{_slug(name)}.train", lambda: _train_step(model, opt, batch),
                                          device, out_dir),
                    "decode": profile_pass(f"{_slug(name)}.decode",
                                           lambda: _decode(model, task, decode_src, args.decode_len), device, out_dir),
                }
        if device.type == "cuda":
            for name, (model, opt) in measured:
                torch.cuda.reset_peak_memory_stats()
                _train_step(model, opt, batch)
                results[name].cuda_peak_bytes = torch.cuda.max_memory_allocated()
        del members
        gc.collect()
    base.train_ratios = [1.0] * len(base.train_times)
    base.decode_ratios = [1.0] * len(base.decode_times)
    return [results[n] for n in [BASELINE] + names]


def arithmetic_bound(result: Result, base: Optional[Result]) -> Optional[float]:
    """Training: the transformer's multiply-adds / the system's."""
    return base.train_flops / result.train_flops if base and result.train_flops else None


def decode_bound(result: Result, base: Optional[Result]) -> Optional[float]:
    """Beam search: the transformer's multiply-adds / the system's."""
    return base.decode_flops / result.decode_flops if base and result.decode_flops else None


COLUMNS = ("system", "params", "train tok/s", "train ratio", "bound", "ratio / bound", "decode sent/s",
           "decode ratio", "decode bound", "dec. ratio / bound", "peak MB", "peak ratio", "activations MB",
           "act. ratio", "largest T x T", "largest tensor")


def table(results: List[Result], machine: str) -> str:
    base = next((r for r in results if r.name == BASELINE and not r.error), None)

    def ratio(value, ref):
        return f"{value / ref:.3f}" if value is not None and ref else "n/a"

    def mb(value):
        return f"{value / 2**20:,.1f}" if value is not None else "n/a"

    lines = [
        f"Measured on {machine}.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|---|" + "---:|" * (len(COLUMNS) - 1),
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.name} | {r.error} |" + " |" * (len(COLUMNS) - 2))
            continue
        tr = r.train_ratio or 0.0
        dr = r.decode_ratio or 0.0
        bound = arithmetic_bound(r, base) or 0.0
        dbound = decode_bound(r, base) or 0.0
        peak = r.cuda_peak_bytes if r.cuda_peak_bytes is not None else r.peak_bytes
        base_peak = None
        if base is not None:
            base_peak = base.cuda_peak_bytes if base.cuda_peak_bytes is not None else base.peak_bytes
        lines.append(
            f"| {r.name} | {r.params:,} | {r.train_tok_s:,.0f} | {tr:.3f} | {bound:.3f} | "
            f"{(tr / bound if bound else 0):.3f} | {r.decode_sent_s:.2f} | {dr:.3f} | {dbound:.3f} | "
            f"{(dr / dbound if dbound else 0):.3f} | {mb(peak)} | {ratio(peak, base_peak)} | "
            f"{r.activation_bytes / 2**20:,.1f} | "
            f"{ratio(r.activation_bytes, base.activation_bytes if base else 0)} | {r.largest_tensor_ratio:.2f} | "
            f"{ratio(r.largest_tensor_numel, base.largest_tensor_numel if base else 0)} |"
        )
    return "\n".join(lines) + "\n"


def machine_description(device: str, dtype: str = "fp32") -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    threads = torch.get_num_threads()
    desc = f"{cpu}, {os.cpu_count()} cores ({threads} torch threads), torch {torch.__version__}"
    if device == "cuda":
        desc += f", GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return desc + f", {dtype}"


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small batch, few rounds (CI)")
    p.add_argument("--size", default="iwslt_de_en", help="size preset suffix (default: iwslt_de_en)")
    p.add_argument("--systems", nargs="*", help="restrict to these system or model names")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES),
                   help="dtype of every model (model.to(dtype)); fp16 needs a CUDA GPU, bf16 a CPU or a GPU of "
                   "compute capability >= 8.0 (default: fp32)")
    p.add_argument("--attention-impl", nargs="+", default=["auto"], choices=["auto", "sdpa", "eager"],
                   help="path of every attention core of the package's models: auto (the default: the fused "
                   "kernel where it applies and pays), sdpa (the fused kernel wherever it applies) or eager "
                   "(the reference); several values run every system once per value, interleaved in the same "
                   "rounds (rows 'system [value]'); the transformer is fairseq's own attention either way")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--src-len", type=int, default=None)
    p.add_argument("--tgt-len", type=int, default=None)
    p.add_argument("--decode-batch", type=int, default=None)
    p.add_argument("--decode-len", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--group-size", type=int, default=None,
        help="systems held in memory at once, each group timed with the transformer (default: 4)",
    )
    p.add_argument("--profile", action="store_true",
                   help="also profile one training step and one beam search of every system with torch.profiler: "
                   "the ops with the most self time go to OUTPUT_DIR/profile/<system>.{train,decode}.txt and to "
                   "bench.json")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a CUDA GPU is available")
    p.add_argument("--output-dir", default="runs/bench", help="where bench.json and bench.md go")
    p.add_argument("--list", action="store_true", help="list the systems and exit")
    return p


def parse_args(argv=None):
    """The command line, with defaults filled in and every check made (usage errors
    exit with status 2 before anything is built or written)."""
    parser = get_parser()
    args = parser.parse_args(argv)
    # (quick, full); group_size bounds the resident models: on these VMs memory that
    # stays untouched for a while becomes slow to touch again (timings of groups of
    # 10 iwslt-size models with Adam states varied 20-fold, groups of 4 did not).
    defaults = dict(batch_size=(6, 64), src_len=(20, 32), tgt_len=(20, 32), decode_batch=(2, 32),
                    decode_len=(10, 32), repeats=(3, 7), group_size=(4, 4))
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    for key in defaults:
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if len(set(args.attention_impl)) < len(args.attention_impl):
        parser.error(f"--attention-impl: a value given twice ({' '.join(args.attention_impl)})")
    if args.vocab < 8:
        parser.error(f"--vocab must be >= 8 (the 4 special symbols and some words), got {args.vocab}")
    try:
        select(args.systems or [])
    except ValueError as exc:
        parser.error(f"--systems: {exc}")
    if not args.list:
        device = select_device(args)
        name = torch.cuda.get_device_name() if device.type == "cuda" else ""
        capability = torch.cuda.get_device_capability() if device.type == "cuda" else (0, 0)
        problem = check_dtype(args.dtype, device.type, name, capability)
        if problem:
            parser.error(problem)
    return args


def main(argv=None):
    args = parse_args(argv)
    import fairseq_localness  # noqa: F401  (registers the models)

    if args.list:
        for name, (model, options) in SYSTEMS.items():
            print(f"{name}: {model}_{args.size} {' '.join(options)}")
        return

    results = run(args)
    device = select_device(args).type
    machine = machine_description(device, args.dtype)
    if args.attention_impl != ["auto"]:
        machine += f", attention_impl {' '.join(args.attention_impl)}"
    md = table(results, machine)
    os.makedirs(args.output_dir, exist_ok=True)
    settings = {
        k: getattr(args, k)
        for k in ("size", "dtype", "attention_impl", "batch_size", "src_len", "tgt_len", "decode_batch", "decode_len", "repeats",
                  "vocab", "quick", "group_size", "threads", "profile")
    }
    base = next((r for r in results if r.name == BASELINE and not r.error), None)
    payload = {
        "machine": machine,
        "device": device,
        "settings": settings,
        "results": [
            dict(
                asdict(r),
                train_tok_s=r.train_tok_s,
                decode_sent_s=r.decode_sent_s,
                train_ratio=r.train_ratio,
                decode_ratio=r.decode_ratio,
                arithmetic_bound=arithmetic_bound(r, base),
                decode_bound=decode_bound(r, base),
            )
            for r in results
        ],
    }
    with open(os.path.join(args.output_dir, "bench.json"), "w") as f:
        json.dump(payload, f, indent=2)
    with open(os.path.join(args.output_dir, "bench.md"), "w") as f:
        f.write(md)
    print(md)
    failed = [r.name for r in results if r.error]
    if failed:
        print(f"systems that failed: {failed}", file=sys.stderr)


if __name__ == "__main__":
    main()
