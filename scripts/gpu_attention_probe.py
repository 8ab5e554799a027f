"""One attention sublayer of each system, forward and backward, timed on the host and on
the device: where a training step bound by its host loses its time.

    python scripts/gpu_attention_probe.py [--systems NAME ...] [--shapes 32x128,8x512]
        [--variants auto,dense,cpp,apart,static,eager] [--dtype bf16] [--size wmt_en_de] [--iters 10]
        [--decode 8x128] [--decode-steps 32] [--decode-systems NAME ...] [--decode-iters 3]
        [--calls 20] [--out FILE] [--cpu [--cuda-paths]]

For each system of the benchmark (``fairseq-localness-bench --list``; default: the
transformer and each model's main system) the first encoder and the first decoder
layer whose self-attention is the model's own (the transformer: its first layers,
fairseq's ``MultiheadAttention``) are called as fairseq's layers call them (``T x B x
C`` input, the source's padding on the left in the encoder, the future mask in the
decoder), forward and backward, at each shape ``B x T``. Per variant of the attention
path (``--variants``):

* ``auto``: the model as it trains (on CUDA the fused FlexAttention calls, compiled
  with dynamic shapes);
* ``static``: the same with the fused calls compiled for each shape
  (``flex.DYNAMIC_SHAPES = False``);
* ``dense``: every core on ``attention_impl="dense"`` (each branch of a full pass one
  SDPA call with its mask and bias given whole, Shaw et al.'s value term on the eager
  path: no compiled call), for what a compiled call costs against eager launches;
  only for the sublayers with fused calls;
* ``eager``: every core on the eager reference path (``attention_impl="eager"``);
* ``apart``: as ``auto`` with every fusion after the fused call and every score
  term's prologue before it, instead of within it (``flex.EPILOGUE_DEVICES`` and
  ``flex.PROLOGUE_DEVICES`` empty: HySAN's squeeze gate, Yang et al.'s predicted
  centres and windows as operators of their own); only for the sublayers with either;
* ``cpp``: as ``auto`` with the fused calls compiled by Inductor with its C++ wrapper
  (``flex.INDUCTOR_OPTIONS = {"cpp_wrapper": True}``: a compiled call's kernels
  launched from generated C++ instead of Python), for what that saves the host per
  call;
* ``graphs``: as ``auto`` with each compiled call replayed as a CUDA graph
  (``{"triton.cudagraphs": True}``, one recorded per shape: fairseq's batches vary in
  shape, so this is the bound of what graphs could save, not a way to train);
  ``cpp`` and ``graphs`` only for the sublayers with fused calls;
* ``blocks``: as ``auto`` with every fused call on the smaller blocks that Shaw et al.'s
  table takes (``flex.KERNEL_OPTIONS = flex.SMALL_BLOCKS``, ``kernel_options`` of 64 x
  64 blocks and one stage) instead of Inductor's default: on the H200 the forward kernel of HySAN's
  windows took 0.49 ms a call against 0.13 ms for its backward, a sign of its block
  configuration (docs/benchmark.md); only for the sublayers with fused calls.

First, beam search (``--decode``, ``B x T``: beam 4 over B sentences of T source
tokens, ``--decode-steps`` steps; ``none`` skips it) of each of ``--decode-systems``
(default: the transformer and the systems whose decoder steps have attention of their
own: rel_pos, HySAN, Dec-DC), once with each path of a step's attention: ``fused``, as
the model decodes (on CUDA one call of SDPA's fused kernel per step,
``kernels/step.py``), and ``kernels``, the step kernels the CPU keeps (their products,
casts and softmax; ``step.FUSED_STEP_DEVICES`` empty): the wall time of one search
(median of ``--decode-iters`` after a warm-up), its ratio to the transformer's, the
fused step calls of one search, and on a GPU its kernels and their device time. It
measures on the GPU what the CPU could only count: the fused steps' launches saved.

Last (``--calls``, rounds of 10 calls; 0: none), one call of each kind at a shape where
its kernels cost next to nothing (:data:`CALL_SHAPE`), forward and with a backward
pass: the fused call of a Gaussian term with a window's block mask, SDPA with a float
mask (what ``dense`` calls instead) and one element-wise operator, each's host and wall
time per call (:func:`measure_calls`). On a GPU it separates what a compiled call's
wrapper and launches cost the host from the rest of a sublayer (docs/benchmark.md puts
0.6 to 1.6 ms per compiled call from the H200 table; the wrapper measured 54 to 79 us on
this project's CPU).

Columns: ``host ms``, the time until the Python calls of one forward and backward pass
return (the launches, the wrappers of compiled calls); ``wall ms``, one pass with the
device synchronized (median over ``--iters`` passes after 2 warm-ups, which compile);
``fused calls``, the fused kernel's calls in the forward pass (each compiled on CUDA,
each with its own call in the backward pass: one wrapper of a compiled function per
call, host time on a training step bound by its host);
on a GPU, ``kernels`` and ``GPU ms`` (the kernels, copies and fills of one profiled
pass and their summed device time), ``host syncs`` (the times one pass made the host
wait for the GPU, counted with torch's sync debug mode; also per call in the one-call
table: a compiled call that waited would show it there) and the three kernels with
the most device time, each with its calls and time per call. The transformer's sublayers are the baseline
of each shape. Rows go shape by shape, then variant by variant, then system by system;
the table goes to ``--out`` after every row (so a run stopped by a time limit keeps
what it measured), else to standard output at the end.

On a CPU (``--cpu``, or no GPU) the same runs on the CPU's paths, without the GPU
columns (for the tests); with ``--cuda-paths``, on the paths CUDA takes
(:func:`fairseq_localness.modules.kernels.emulation.cuda_paths_on_cpu`, the fused
calls by torch's reference implementation: their count, not their time)."""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fairseq_localness.cli import bench_model  # noqa: E402
from fairseq_localness.cli.bench_measure import count_syncs  # noqa: E402
from fairseq_localness.cli.bench_systems import BASELINE, SYSTEMS  # noqa: E402
from fairseq_localness.modules.kernels import emulation  # noqa: E402

DEFAULT_SYSTEMS = [BASELINE, "localness (query, enc 1-3)", "localness + rel_pos", "hybrid (gate, enc 1-2)",
                   "hysan e1 (gated)", "enc-dc (f=2)", "dec-dc (f=2)", "full-dc (f=2)"]
VARIANTS = ("auto", "static", "eager", "dense", "apart", "cpp", "graphs", "blocks")
# Inductor's options of the variants that compile with options of their own
# (flex.INDUCTOR_OPTIONS)
VARIANT_OPTIONS = {"cpp": {"cpp_wrapper": True}, "graphs": {"triton.cudagraphs": True}}
DECODE_SYSTEMS = [BASELINE, "localness + rel_pos", "hysan e1 (gated)", "dec-dc (f=2)"]
DECODE_PATHS = ("fused", "kernels")


def _shape(text: str):
    try:
        bsz, length = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected BxT, e.g. 32x128, got {text!r}") from None
    if bsz < 1 or length < 2:
        raise argparse.ArgumentTypeError(f"B >= 1 and T >= 2, got {text!r}")
    return bsz, length


def parse_args(argv):
    p = argparse.ArgumentParser(prog="gpu_attention_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--systems", nargs="+", default=DEFAULT_SYSTEMS, metavar="NAME")
    p.add_argument("--shapes", default="32x128,8x512", help="comma-separated B x T (default 32x128,8x512)")
    p.add_argument("--variants", default="auto,dense,cpp,apart,static,eager",
                   help="of " + ", ".join(VARIANTS) + " (default auto,dense,cpp,apart,static,eager)")
    p.add_argument("--dtype", default="bf16", choices=sorted(bench_model.DTYPES))
    p.add_argument("--size", default="wmt_en_de", help="the architecture's size suffix (default wmt_en_de)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--decode", default="8x128", help="beam search over B x T source tokens first (default 8x128; "
                                                    "none: no beam search)")
    p.add_argument("--decode-steps", type=int, default=32, help="the beam search's steps (default 32)")
    p.add_argument("--decode-systems", nargs="+", default=DECODE_SYSTEMS, metavar="NAME",
                   help="the systems whose beam search is timed (default: " + ", ".join(DECODE_SYSTEMS) + ")")
    p.add_argument("--decode-iters", type=int, default=3, help="timed searches per system and path (default 3)")
    p.add_argument("--calls", type=int, default=20,
                   help="last, rounds of one call of each kind at a tiny shape, for what a call costs the host "
                        "(default 20; 0: none)")
    p.add_argument("--out", default=None, help="write the table here (default: standard output)")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a GPU is present")
    p.add_argument("--cuda-paths", action="store_true",
                   help="on the CPU, take the paths CUDA takes (the fused calls by torch's reference implementation)")
    args = p.parse_args(argv)
    for flag, names in (("--systems", args.systems), ("--decode-systems", args.decode_systems)):
        unknown = [s for s in names if s not in SYSTEMS]
        if unknown:
            p.error(f"{flag}: unknown {', '.join(map(repr, unknown))} (see fairseq-localness-bench --list)")
    try:
        args.shapes = [_shape(s) for s in args.shapes.split(",")]
    except argparse.ArgumentTypeError as error:
        p.error(f"--shapes: {error}")
    try:
        args.decode = None if args.decode.lower() == "none" else _shape(args.decode)
    except argparse.ArgumentTypeError as error:
        p.error(f"--decode: {error}")
    if args.decode_steps < 1 or args.decode_iters < 1:
        p.error("--decode-steps and --decode-iters: at least 1")
    args.variants = args.variants.split(",")
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {', '.join(map(repr, bad))} (allowed: {', '.join(VARIANTS)})")
    if args.iters < 1:
        p.error("--iters: at least 1")
    if args.calls < 0:
        p.error("--calls: at least 0")
    return args


def own_sublayers(model):
    """``{"encoder": module, "decoder": module}``: each side's first self-attention that
    is not fairseq's ``MultiheadAttention``, else its first layer's."""
    from fairseq.modules import MultiheadAttention

    found = {}
    for side in ("encoder", "decoder"):
        layers = getattr(model, side).layers
        own = [layer.self_attn for layer in layers if not isinstance(layer.self_attn, MultiheadAttention)]
        found[side] = own[0] if own else layers[0].self_attn
    return found


def _inputs(side, bsz, length, dim, device, dtype):
    x = torch.randn(length, bsz, dim, device=device, dtype=dtype, requires_grad=True)
    if side == "encoder":  # lengths down to 80% of T, padded on the left as fairseq's source
        padding = torch.zeros(bsz, length, dtype=torch.bool, device=device)
        for b in range(bsz):
            padding[b, : int(0.2 * length * b / max(bsz - 1, 1))] = True
        return x, padding, None
    future = torch.triu(torch.full((length, length), float("-inf"), device=device, dtype=dtype), 1)
    return x, None, future


def _pass(module, x, padding, mask, grad):
    out = module(x, x, x, key_padding_mask=padding, need_weights=False, attn_mask=mask)[0]
    out.backward(grad)


def _fused_calls(module, x, padding, mask, grad) -> int:
    """The calls of the fused kernel (``flex._kernel``: one per fused call) in one
    forward and backward pass's forward pass."""
    from fairseq_localness.modules.kernels import flex

    original, calls = flex._kernel, []

    def counted(*args, **kwargs):
        calls.append(args[1:2])
        return original(*args, **kwargs)

    flex._kernel = counted
    try:
        _pass(module, x, padding, mask, grad)
    finally:
        flex._kernel = original
    return len(calls)


def _host_and_wall(run, device, iters, warm_up, repeat=1):
    """The medians over ``iters`` rounds of ``run()`` called ``repeat`` times, per call, in
    seconds: the host's time (until the calls return) and the wall time (the device
    synchronized), after ``warm_up`` calls (which compile)."""
    for _ in range(warm_up):
        run()
    host, wall = [], []
    for _ in range(iters):
        bench_model._sync(device)
        start = time.perf_counter()
        for _ in range(repeat):
            run()
        host.append((time.perf_counter() - start) / repeat)
        bench_model._sync(device)
        wall.append((time.perf_counter() - start) / repeat)
    return statistics.median(host), statistics.median(wall)


def measure(module, side, bsz, length, dim, device, dtype, iters):
    """The sublayer's host and wall times per forward and backward pass (medians), its
    fused calls, and on a GPU its kernels, their device time and the top three kernels
    of one pass."""
    x, padding, mask = _inputs(side, bsz, length, dim, device, dtype)
    grad = torch.randn_like(x)
    host, wall = _host_and_wall(lambda: _pass(module, x, padding, mask, grad), device, iters, warm_up=2)
    row = dict(host_ms=1000 * host, wall_ms=1000 * wall, fused=_fused_calls(module, x, padding, mask, grad))
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _pass(module, x, padding, mask, grad)
            bench_model._sync(device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        by_name = {}
        for e in kernels:
            calls, us = by_name.get(e.name, (0, 0.0))
            by_name[e.name] = (calls + 1, us + e.time_range.elapsed_us())
        top = sorted(by_name.items(), key=lambda item: -item[1][1])[:3]
        row.update(kernels=len(kernels), gpu_ms=sum(us for _, us in by_name.values()) / 1000.0,
                   top="; ".join(f"{name[:48]} x{calls} {us / calls:.0f} us" for name, (calls, us) in top),
                   syncs=sum(count_syncs(lambda: _pass(module, x, padding, mask, grad), device).values()))
    return row


CALL_SHAPE = (2, 8, 16, 64)  # B x H x T x Dh of measure_calls: the kernels' own work is a few microseconds


def measure_calls(device, dtype, iters):
    """What one call costs the host where its kernels cost next to nothing (``B x H x T x
    Dh`` = :data:`CALL_SHAPE`): rows ``(call, pass, host us, wall us)``, the medians of
    ``iters`` rounds of 10 calls, without gradients (``forward``) and with a backward
    pass of the output's sum (``forward + backward``, the sum's own operators in every
    row): the fused call of a Gaussian term with a window's block mask (on CUDA one
    compiled call each way: its wrapper, its launches), SDPA with a float mask (what
    ``attention_impl="dense"`` calls instead), and one element-wise operator; on a GPU
    also the times one call made the host wait for the GPU (:func:`count_syncs`, a fifth
    value). A pass a device cannot run (a CPU has no backward pass of the fused call)
    is ``None``."""
    from fairseq_localness.modules.kernels import flex

    bsz, heads, length, head_dim = CALL_SHAPE
    block_mask = flex._block_mask(3, 3, length, length, device)
    geometry = flex._geometry(3, 3, 0, 0, device)
    k_pos = torch.arange(length, device=device, dtype=torch.float32).expand(bsz, length).contiguous()
    mask = torch.zeros(bsz, 1, length, length, device=device, dtype=dtype)
    rows = []
    for grad in (False, True):
        q, k, v = (torch.randn(bsz, heads, length, head_dim, device=device, dtype=dtype, requires_grad=grad)
                   for _ in range(3))
        centre = (torch.rand(bsz, heads, length, device=device) * length).requires_grad_(grad)
        coeff = (-torch.rand(bsz, heads, length, device=device) - 0.1).requires_grad_(grad)
        calls = (
            ("fused call (Gaussian, window)", lambda: flex._fused_call(
                q, k, v, head_dim ** -0.5, block_mask, None, centre, coeff, k_pos, None, geometry, None, False,
                None)),
            ("SDPA (float mask)", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)),
            ("one operator (add)", lambda: q + k),
        )
        for name, call in calls:
            def once(call=call):
                out = call()
                if grad:
                    out.sum().backward()

            side = "forward + backward" if grad else "forward"
            try:
                with torch.set_grad_enabled(grad):  # (the fused call's kind depends on the grad mode)
                    host, wall = _host_and_wall(once, device, iters, warm_up=3, repeat=10)
                    syncs = count_syncs(once, device)
            except NotImplementedError:  # (torch: no backward pass of the fused call on a CPU)
                rows.append((name, side, None, None, None))
                continue
            rows.append((name, side, 1e6 * host, 1e6 * wall, None if syncs is None else sum(syncs.values())))
    return rows


def _model(models, name, args, task, device, dtype):
    """The benchmark's model of system ``name`` (built once, kept in ``models``)."""
    if name not in models:
        model_name, options = SYSTEMS[name]
        models[name] = bench_model.build(model_name, args.size, options, task, device, dtype)[1].train()
    return models[name]


@contextlib.contextmanager
def _switched(module, **values):
    """The module-level switches ``values`` of ``module`` set within the block, restored
    after it."""
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def _attempt(lines, write, cells, measure_row):
    """``measure_row()``; where it fails, None, and a row of the table (its first
    ``cells``, then the error's type and first line) written instead: the other rows
    are measured."""
    try:
        return measure_row()
    except Exception as error:  # noqa: BLE001 - reported in the row
        reason = str(error).splitlines()[0][:100] if str(error) else ""
        lines.append("| " + " | ".join(cells + [f"failed: {type(error).__name__}: {reason}"]) + " |")
        write()
        return None


def _fused_steps(search) -> int:
    """The fused step calls (``step.row_attention``) of ``search()``."""
    from fairseq_localness.modules import relative_position
    from fairseq_localness.modules.kernels import step, windows

    modules = (step, windows, relative_position)  # (the last two import it by name)
    original, calls = step.row_attention, []

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    for module in modules:
        module.row_attention = counted
    try:
        search()
    finally:
        for module in modules:
            module.row_attention = original
    return len(calls)


def measure_decode(model, task, bsz, length, steps, device, iters):
    """One beam search's wall time (median of ``iters`` after a warm-up), its fused step
    calls, and on a GPU its kernels and their device time."""
    src = bench_model.make_batch(task, bsz, length, length, device)

    def search():
        bench_model._decode(model, task, (src[0], src[1]), steps)

    wall = _host_and_wall(search, device, iters, warm_up=1)[1]  # (the warm-up compiles the encoder's fused calls)
    row = dict(wall_ms=1000 * wall, fused=_fused_steps(search))
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            search()
            bench_model._sync(device)
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        row.update(kernels=len(kernels), gpu_ms=sum(e.time_range.elapsed_us() for e in kernels) / 1000.0)
    return row


def _decode_rows(args, models, task, device, dtype, gpu, lines, write):
    """Measure the beam-search rows (``lines``), writing the tables after each."""
    from fairseq_localness.modules.kernels import step

    bsz, length = args.decode
    base = {}
    for name in [BASELINE] + [s for s in args.decode_systems if s != BASELINE]:
        for path in DECODE_PATHS:  # (each system's two paths one after the other)
            model = _model(models, name, args, task, device, dtype)
            with _switched(step, FUSED_STEP_DEVICES=() if path == "kernels" else step.FUSED_STEP_DEVICES):
                row = _attempt(lines, write, [name, f"{bsz} x {length}, {args.decode_steps} steps", path],
                               lambda: measure_decode(model, task, bsz, length, args.decode_steps, device,
                                                      args.decode_iters))
            if row is None:
                continue
            if name == BASELINE:
                base[path] = row["wall_ms"]
            cells = [name, f"{bsz} x {length}, {args.decode_steps} steps", path, f"{row['wall_ms']:.1f}",
                     f"{base[path] / row['wall_ms']:.2f}" if path in base else "-", str(row["fused"])]
            if gpu:
                cells += [str(row["kernels"]), f"{row['gpu_ms']:.1f}"]
            lines.append("| " + " | ".join(cells) + " |")
            write()
            print(f"{name}, beam search, {path}: wall {row['wall_ms']:.1f} ms", file=sys.stderr, flush=True)


def _has_part_within(module) -> bool:
    """Whether something of ``module``'s can run within its fused call: its fusion (an
    epilogue, HySAN's squeeze gate) or a score term's prologue (Yang et al.'s centres
    and windows predicted from the queries, eq. 6-9)."""
    from fairseq_localness.modules.fusion import Fusion
    from fairseq_localness.modules.gaussian import GaussianLocalness

    fusion = getattr(module, "fusion", None)
    if fusion is not None and type(fusion).epilogue is not Fusion.epilogue:
        return True
    return any(isinstance(m, GaussianLocalness) and m.centre == "predicted" and m.window == "query"
               for m in module.modules())


def _rows(args, systems, models, task, device, dtype, gpu, base, lines, write):
    """Measure every row of the table (``lines``), writing the table after each."""
    from fairseq_localness.modules.attention import set_attention_impl
    from fairseq_localness.modules.kernels import flex

    fused = {}  # (system, side, B, T) -> the fused calls of its last row on the compiled path
    # each shape, then each variant, then each system: the first shape's rows first
    for bsz, length in args.shapes:
        for variant in args.variants:
            for name in systems:
                if name == BASELINE and variant != args.variants[0]:
                    continue  # (fairseq's attention has no variants)
                model = _model(models, name, args, task, device, dtype)
                for side, module in own_sublayers(model).items():
                    if variant == "apart" and not _has_part_within(module):
                        continue  # (the same as auto)
                    if (variant in VARIANT_OPTIONS or variant in ("dense", "blocks")) \
                            and fused.get((name, side, bsz, length)) == 0:
                        continue  # (no compiled call in the auto variant: the same as auto)
                    set_attention_impl(model, variant if variant in ("eager", "dense") else "auto")
                    apart = variant == "apart"
                    dim = getattr(model, side).embed_tokens.embedding_dim
                    with _switched(flex, DYNAMIC_SHAPES=variant != "static",
                                   EPILOGUE_DEVICES=() if apart else flex.EPILOGUE_DEVICES,
                                   PROLOGUE_DEVICES=() if apart else flex.PROLOGUE_DEVICES,
                                   INDUCTOR_OPTIONS=VARIANT_OPTIONS.get(variant, flex.INDUCTOR_OPTIONS),
                                   KERNEL_OPTIONS=flex.SMALL_BLOCKS if variant == "blocks" else flex.KERNEL_OPTIONS):
                        row = _attempt(lines, write, [name, side, f"{bsz} x {length}", variant],
                                       lambda: measure(module, side, bsz, length, dim, device, dtype, args.iters))
                    if row is None:
                        continue
                    if variant not in ("dense", "eager"):  # (those make no fused call by design)
                        fused[(name, side, bsz, length)] = row["fused"]
                    key = (side, bsz, length)
                    if name == BASELINE:
                        base[key] = row["host_ms"]
                    cells = [name, f"{side} ({type(module).__name__})", f"{bsz} x {length}", variant,
                             f"{row['host_ms']:.2f}", f"{row['wall_ms']:.2f}",
                             f"{row['host_ms'] / base[key]:.2f}" if key in base else "-", str(row["fused"])]
                    if gpu:
                        cells += [str(row["kernels"]), f"{row['gpu_ms']:.2f}", str(row["syncs"]),
                                  row["top"].replace("|", "/")]
                    lines.append("| " + " | ".join(cells) + " |")
                    write()
                    print(f"{name}, {side}, {bsz} x {length}, {variant}: host {row['host_ms']:.2f} ms, "
                          f"wall {row['wall_ms']:.2f} ms", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if args.cuda_paths and device.type != "cpu":
        print("gpu_attention_probe.py: error: --cuda-paths: only on the CPU (with --cpu where a GPU is present; "
              "a GPU takes CUDA's paths itself)", file=sys.stderr)
        return 2
    dtype = bench_model.DTYPES[args.dtype]
    problem = bench_model.check_dtype(args.dtype, device.type, *(
        (torch.cuda.get_device_name(), torch.cuda.get_device_capability()) if device.type == "cuda" else ()))
    if problem:
        print(f"gpu_attention_probe.py: error: --dtype {args.dtype}: {problem}", file=sys.stderr)
        return 2
    task = bench_model._Toy(32000 if args.size.startswith("wmt") else 1000)
    gpu = device.type == "cuda"
    where = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if gpu
             else f"CPU, torch {torch.__version__}" + (", CUDA's paths" if args.cuda_paths else ""))
    head = ["system", "sublayer", "B x T", "variant", "host ms", "wall ms", "host ratio", "fused calls"]
    head += ["kernels", "GPU ms", "host syncs", "top kernels (calls, time per call)"] if gpu else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    decode_head = ["system", "beam search", "steps' attention", "wall ms", "speed ratio", "fused steps"]
    decode_head += ["kernels", "GPU ms"] if gpu else []
    decode_lines = ["| " + " | ".join(decode_head) + " |", "|" + "---|" * len(decode_head)]
    base, models = {}, {}
    systems = [BASELINE] + [s for s in args.systems if s != BASELINE]
    call_lines = (["| call | pass | host us | wall us | host syncs |", "|---|---|---:|---:|---:|"] if gpu
                  else ["| call | pass | host us | wall us |", "|---|---|---:|---:|"])

    def write():  # after every row: a run stopped by its time limit keeps what it measured
        text = ""
        if args.decode is not None:
            text += f"Beam search (beam 4), {args.dtype}, {args.size} ({where}):\n\n"
            text += "\n".join(decode_lines) + "\n\n"
        text += f"Attention sublayers, forward and backward, {args.dtype}, {args.size} ({where}):\n\n"
        text += "\n".join(lines) + "\n"
        if len(call_lines) > 2:
            shape = " x ".join(map(str, CALL_SHAPE))
            text += f"\nOne call, B x H x T x Dh = {shape}, {args.dtype} ({where}), per call:\n\n"
            text += "\n".join(call_lines) + "\n"
        if args.out:
            with open(args.out + ".partial", "w") as f:
                f.write(text)
            os.replace(args.out + ".partial", args.out)
        return text

    with contextlib.ExitStack() as stack:
        if args.cuda_paths:
            stack.enter_context(emulation.cuda_paths_on_cpu())
        if args.decode is not None:  # first: a few seconds, where the sublayers' rows compile for minutes
            _decode_rows(args, models, task, device, dtype, gpu, decode_lines, write)
        _rows(args, systems, models, task, device, dtype, gpu, base, lines, write)
        if args.calls:  # last: the sublayers' rows first where the time limit cuts the probe short
            for name, side, host, wall, syncs in measure_calls(device, dtype, args.calls):
                cells = ["-", "-"] if host is None else [f"{host:.1f}", f"{wall:.1f}"]
                cells += ["-" if syncs is None else str(syncs)] if gpu else []
                call_lines.append("| " + " | ".join([name, side] + cells) + " |")
            write()
    text = write()
    if not args.out:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
