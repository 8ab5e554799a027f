"""One benchmark run at one batch shape (``fairseq-localness-bench``): every system
built next to the transformer, measured (untimed), then timed in interleaved rounds;
the results and the bounds. The command line is :mod:`fairseq_localness.cli.benchmark`,
the length sweep :mod:`fairseq_localness.cli.bench_sweep`."""
import gc
import os
import re
import statistics
import sys
import traceback
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch

from fairseq_localness.cli.bench_measure import (
    _timed, labelled_sublayers, measure_decode_flops, measure_static, observable, profile_pass,
)
from fairseq_localness.cli.bench_model import DTYPES, _decode, _Toy, _train_step, build, make_batch, make_optimizer
from fairseq_localness.cli.bench_systems import BASELINE, SYSTEMS, select


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
    # with --profile on a GPU: per pass ("train", "decode"), the CUDA kernels, copies
    # and fills it launched and their summed device time in ms
    launches: Dict[str, dict] = field(default_factory=dict)
    # whether the multiply-adds and activations were observed on the eager path
    # (:func:`~.bench_measure.observable`: CUDA, or attention_impl "flex")
    observed_on_eager: bool = False
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


def run_name(system: str, impl: str, impls: List[str]) -> str:
    """The row name of ``system`` run with ``attention_impl`` ``impl``: the system's
    name, with ``[impl]`` appended when the run compares several settings."""
    return f"{system} [{impl}]" if len(impls) > 1 else system


def _prepare(name, args, task, batch, decode_src, device, result: Result, impl: str = "auto"):
    """Build, measure (untimed) and warm up one system (its attention cores set to
    ``impl``); returns (model, optimizer) or None when the system fails (the failure
    is reported in its row and its traceback on stderr, not fatal: the other systems
    are measured)."""
    model_name, options = SYSTEMS[name]
    dtype = DTYPES[args.dtype]
    try:
        result.arch, model = build(model_name, args.size, options + width_options(args.width), task, device, dtype)
    except Exception as exc:
        result.error = f"build failed: {exc}"
        return None
    try:
        return _measure_and_warm_up(name, model, args, task, batch, decode_src, device, result, impl, dtype)
    except Exception as exc:  # noqa: BLE001 - reported in the system's row
        traceback.print_exc()
        result.error = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return None


def _measure_and_warm_up(name, model, args, task, batch, decode_src, device, result: Result, impl: str, dtype):
    from fairseq_localness.modules.attention import set_attention_impl

    set_attention_impl(model, impl)
    result.params = sum(p.numel() for p in model.parameters())
    model.train()
    layer0 = model.encoder.layers[0]
    heads = layer0.self_attn.num_heads if hasattr(layer0, "self_attn") else 1
    with observable(model, device) as result.observed_on_eager:
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
    # the decoding warm-up, counted (the same kernels run as in the timed searches),
    # and where the count took the eager path, one more search on the model's own
    with observable(model, device):
        result.decode_flops = measure_decode_flops(model, task, decode_src, args.decode_len)
    if result.observed_on_eager:
        _decode(model, task, decode_src, args.decode_len)
    result.train_tokens = int(batch[3].numel())
    result.decode_sentences = args.decode_batch
    print(f"built {name}: {result.params:,} parameters", file=sys.stderr)
    return model, optimizer


def width_options(width: Optional[int]) -> List[str]:
    """fairseq's options for ``--width C`` (embedding C, feed-forward 2C, 4 heads, on
    the encoder and the decoder side); none without it."""
    if width is None:
        return []
    return [option for side in ("encoder", "decoder") for option in (
        f"--{side}-embed-dim", str(width), f"--{side}-ffn-embed-dim", str(2 * width),
        f"--{side}-attention-heads", "4")]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def select_device(args) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")


def _time_round(run_pass, base_model, base_opt, members, base_last: bool, device, clock) -> Dict[str, float]:
    """One timed pass (:func:`~.bench_measure._timed`) of ``run_pass(model, opt)`` for
    the transformer and for each system of a group (``members``: name -> (model,
    opt)), the transformer first or, with ``base_last``, last; returns the times by
    name, the transformer's under :data:`BASELINE`."""
    order = [(name, model, opt) for name, (model, opt) in members.items()]
    base = (BASELINE, base_model, base_opt)
    order = order + [base] if base_last else [base] + order
    return {name: _timed(lambda: run_pass(model, opt), device, clock) for name, model, opt in order}


def run(args, after_round: Optional[Callable[[List[Result], str], object]] = None) -> List[Result]:
    """Every system beside the transformer, in groups of ``--group-size``, ``--repeats``
    rounds each; returns the transformer's result and the systems'. After each round,
    ``after_round(results so far, which round)`` (the transformer and the systems with a
    round or an error), so that a run stopped by a time limit keeps its rounds."""
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
            # the transformer first in rounds 1, 3, 5, ... and last in rounds 2, 4, ...
            # (an even --repeats balances them), so that what comes before or after a
            # pass (the caches, the allocator, the machine's other jobs) falls on both
            # sides of the ratios alike
            base_last = round_ % 2 == 1  # round_ counts from 0
            # training: one step each; then decoding: one beam search each, same order
            train = _time_round(lambda model, opt: _train_step(model, opt, batch), base_model, base_opt,
                                members, base_last, device, args.clock)
            decode = _time_round(lambda model, opt: _decode(model, task, decode_src, args.decode_len),
                                 base_model, base_opt, members, base_last, device, args.clock)
            base.train_times.append(train[BASELINE])
            base.decode_times.append(decode[BASELINE])
            for name in members:
                result = results[name]
                result.train_times.append(train[name])
                result.train_ratios.append(train[BASELINE] / train[name])
                result.decode_times.append(decode[name])
                result.decode_ratios.append(decode[BASELINE] / decode[name])
            print(f"group {number}/{len(groups)}: round {round_ + 1}/{args.repeats} done", file=sys.stderr)
            if after_round is not None:
                base.train_ratios = [1.0] * len(base.train_times)
                base.decode_ratios = [1.0] * len(base.decode_times)
                after_round([base] + [results[n] for n in names if results[n].train_times or results[n].error],
                            f"round {round_ + 1} of {args.repeats} of group {number} of {len(groups)}")
        # the group's systems, and the transformer with the first group
        measured = list(members.items()) + ([(BASELINE, (base_model, base_opt))] if number == 1 else [])
        if args.profile:
            out_dir = os.path.join(args.output_dir, "profile")
            for name, (model, opt) in measured:
                with labelled_sublayers(model):
                    passes = {
                        "train": profile_pass(f"{_slug(name)}.train", lambda: _train_step(model, opt, batch),
                                              device, out_dir),
                        "decode": profile_pass(f"{_slug(name)}.decode",
                                               lambda: _decode(model, task, decode_src, args.decode_len), device,
                                               out_dir),
                    }
                results[name].profile = {kind: ops for kind, (ops, _) in passes.items()}
                results[name].launches = {kind: launches for kind, (_, launches) in passes.items() if launches}
        if device.type == "cuda":
            for name, (model, opt) in measured:
                results[name].cuda_peak_bytes = _cuda_step_peak(model, opt, batch)
        del members
        gc.collect()
    base.train_ratios = [1.0] * len(base.train_times)
    base.decode_ratios = [1.0] * len(base.decode_times)
    return [results[n] for n in [BASELINE] + names]


def _cuda_step_peak(model, opt, batch) -> int:
    """The GPU memory one training step of ``model`` needs at its peak: the step's
    peak above what was allocated before it (the other systems of the group are held
    on the GPU too), plus what the model holds between steps, which was allocated
    before it: its parameters and gradients, and the optimizer's state (in bf16 and
    fp16 the fp32 master copies and their gradients; Adam's moments)."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _train_step(model, opt, batch)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before + held_bytes(model, opt, "cuda")


def held_bytes(model, opt, device_type: str) -> int:
    """The bytes on ``device_type`` that ``model`` and its optimizer ``opt`` hold
    between training steps, each storage once: the parameters and their gradients,
    the optimizer's parameters (in bf16 and fp16 the fp32 master copies of
    :class:`~.bench_model._MixedPrecisionAdam`, in fp32 the model's own) and their
    gradients (its fp32 gradient buffers, also where a parameter had no gradient in
    the last step), and the optimizer's state (Adam's moments)."""
    inner = getattr(opt, "optimizer", opt)  # _MixedPrecisionAdam wraps torch's Adam
    params = list(model.parameters()) + [p for group in inner.param_groups for p in group["params"]]
    tensors = params + [p.grad for p in params if p.grad is not None]
    tensors += list(getattr(opt, "grads", ()))  # its fp32 gradient buffers, kept from the start
    tensors += [t for state in inner.state.values() for t in state.values() if torch.is_tensor(t)]
    owned = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
             if t.device.type == device_type and t.numel()}
    return sum(owned.values())


def arithmetic_bound(result: Result, base: Optional[Result]) -> Optional[float]:
    """Training: the transformer's multiply-adds / the system's."""
    return base.train_flops / result.train_flops if base and result.train_flops else None


def decode_bound(result: Result, base: Optional[Result]) -> Optional[float]:
    """Beam search: the transformer's multiply-adds / the system's."""
    return base.decode_flops / result.decode_flops if base and result.decode_flops else None

