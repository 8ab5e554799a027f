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
transformer, and in every round (``--repeats``) the transformer and each system of the
group are timed one after the other, the transformer first in rounds 1, 3, 5, ... and
last in rounds 2, 4, .... A system's ratio is the median over rounds of ``transformer time / system
time`` within the round (paired, so a slow round cancels), and its tok/s or sent/s
the median over rounds; with several rounds ``bench.md`` also gives the quartiles of
each system's per-round ``ratio / bound``, how far the rounds spread. Absolute numbers
from different runs or machines are not comparable; the ratios are the result.

``--lengths 32,256,1024`` runs the benchmark once per sentence length, with a batch
of about the same number of tokens at every length, and adds the curves of ratio /
bound and activations against the length (:mod:`fairseq_localness.cli.bench_sweep`).

``--quick`` uses a small batch and few rounds and finishes in under 3 minutes on
2 CPU cores; the default is meant for a GPU or a patient CPU.

This module is the command line; the rest is split by concern: the systems
(:mod:`~fairseq_localness.cli.bench_systems`), the models and their steps
(:mod:`~fairseq_localness.cli.bench_model`), what is counted and observed
(:mod:`~fairseq_localness.cli.bench_measure`), one run
(:mod:`~fairseq_localness.cli.bench_run`), its tables and records
(:mod:`~fairseq_localness.cli.bench_report`) and the length sweep
(:mod:`~fairseq_localness.cli.bench_sweep`).
"""
import argparse
import json
import os
import sys

import torch

from fairseq_localness.cli import bench_sweep
from fairseq_localness.cli.bench_measure import flop_counter  # noqa: F401  (re-exported)
from fairseq_localness.cli.bench_model import DTYPES, check_dtype
from fairseq_localness.cli.bench_report import machine_description, records, table
from fairseq_localness.cli.bench_run import run, select_device
from fairseq_localness.cli.bench_systems import SYSTEMS, select


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small batch, few rounds (about 2 minutes)")
    p.add_argument("--size", default="iwslt_de_en", help="size preset suffix (default: iwslt_de_en)")
    p.add_argument("--systems", nargs="*", help="restrict to these system or model names")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES),
                   help="dtype of every model (model.to(dtype)); fp16 needs a CUDA GPU, bf16 a CPU or a GPU of "
                   "compute capability >= 8.0 (default: fp32)")
    p.add_argument("--attention-impl", nargs="+", default=["auto"], choices=["auto", "sdpa", "eager", "flex", "dense"],
                   help="path of every attention core of the package's models: auto (the default: the fused "
                   "kernel where it applies and pays), sdpa (the fused kernel wherever it applies), eager "
                   "(the reference), flex (every branch one FlexAttention call; on a CPU only without "
                   "gradients, so decoding only) or dense (every branch of a full pass one SDPA call with its "
                   "mask and bias given whole, no compiled call); several values run every system once per "
                   "value, interleaved in the same rounds (rows 'system [value]'); the transformer is "
                   "fairseq's own attention either way")
    p.add_argument("--batch-size", type=int, default=None, help="sentences per training step (default: 64; quick: 6)")
    p.add_argument("--src-len", type=int, default=None, help="source tokens per sentence (default: 32; quick: 20)")
    p.add_argument("--tgt-len", type=int, default=None, help="target tokens per sentence (default: 32; quick: 20)")
    p.add_argument("--decode-batch", type=int, default=None, help="sentences per beam search (default: 32; quick: 2)")
    p.add_argument("--decode-len", type=int, default=None, help="output steps of a beam search (default: 32; quick: 10)")
    p.add_argument("--repeats", type=int, default=None, help="timed rounds (default: 7; quick: 3)")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--width", type=int, default=None, metavar="C",
                   help="every system at model width C (encoder and decoder: embedding C, feed-forward 2C, 4 "
                   "heads; the layers of --size) instead of the size preset's: at a small width (e.g. 64) each "
                   "operator call's arithmetic is negligible and the timings measure what the host pays per "
                   "call (Python, dispatch), which bounds a GPU step whose kernels are short; the bounds and "
                   "memory columns are then of that width. A multiple of 16, >= 16")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                   help="what the timings measure: wall-clock time (default), or the CPU time of the process "
                   "(CPU only; with --threads 1 it leaves out the time spent waiting for a core that other jobs "
                   "hold, for a shared machine)")
    p.add_argument(
        "--group-size", type=int, default=None,
        help="systems held in memory at once, each group timed with the transformer (default: 4)",
    )
    sweep = p.add_argument_group("length sweep", "one run per sentence length, at about equal tokens per batch; "
                                 "replaces --batch-size, --src-len, --tgt-len, --decode-batch and --decode-len")
    sweep.add_argument("--lengths", default=None, metavar="T1,T2,...",
                       help="sentence lengths, comma-separated integers >= 2 (e.g. 32,256,1024): source and target "
                       "length of each run; adds bench_sweep.png to OUTPUT_DIR")
    sweep.add_argument("--tokens-per-batch", type=int, default=None, metavar="N",
                       help="training batch at length T: max(1, N // T) sentences (default: 2048, the default "
                       "run's 64 x 32: 64 x 32, 8 x 256, 2 x 1024; quick: 120)")
    sweep.add_argument("--decode-tokens", type=int, default=None, metavar="N",
                       help="beam search at length T: max(1, N // T) sentences of T source tokens (default: 1024; "
                       "quick: 40)")
    sweep.add_argument("--max-decode-len", type=int, default=None, metavar="N",
                       help="output steps of a beam search at length T: min(T, N) (default: 256; quick: 10); "
                       "decoding 1024 steps on a CPU takes minutes per system")
    p.add_argument("--profile", action="store_true",
                   help="also profile one training step and one beam search of every system with torch.profiler: "
                   "the ops with the most self time go to OUTPUT_DIR/profile/<system>.{train,decode}.txt "
                   "(OUTPUT_DIR/T<length>/profile/ in a sweep) and to bench.json")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even where a CUDA GPU is available")
    p.add_argument("--output-dir", default="runs/bench", help="where bench.json and bench.md go")
    p.add_argument("--list", action="store_true", help="list the systems and exit")
    return p


def parse_args(argv=None):
    """The command line, with defaults filled in and every check made (usage errors
    exit with status 2 before anything is built or written)."""
    parser = get_parser()
    args = parser.parse_args(argv)
    bench_sweep.check_args(args, parser)
    # (quick, full); group_size bounds the resident models: on these VMs memory that
    # stays untouched for a while becomes slow to touch again (timings of groups of
    # 10 iwslt-size models with Adam states varied 20-fold, groups of 4 did not).
    defaults = dict(batch_size=(6, 64), src_len=(20, 32), tgt_len=(20, 32), decode_batch=(2, 32),
                    decode_len=(10, 32), repeats=(3, 7), group_size=(4, 4))
    if args.lengths:  # the sweep sets the batch per length
        defaults = {k: v for k, v in defaults.items() if k not in bench_sweep.PER_LENGTH}
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
    if args.width is not None and (args.width < 16 or args.width % 16):
        parser.error(f"--width must be a multiple of 16 and >= 16 (4 heads; HySAN's gate divides C by 16), "
                     f"got {args.width}")
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
        if args.clock == "cpu" and device.type != "cpu":
            parser.error("--clock cpu: only on the CPU (a GPU's kernels run outside the process's CPU time); "
                         "expected --clock wall, or --cpu")
    return args


SETTINGS = ("size", "dtype", "attention_impl", "batch_size", "src_len", "tgt_len", "decode_batch", "decode_len",
            "repeats", "vocab", "width", "quick", "group_size", "threads", "clock", "profile", "lengths",
            "tokens_per_batch", "decode_tokens", "max_decode_len")


def _write(args, payload: dict, md: str):
    """bench.json, then bench.md, each written whole or not at all (a run killed by its
    time limit while writing keeps the previous round's)."""
    from fairseq_localness.atomic import write_text

    os.makedirs(args.output_dir, exist_ok=True)
    write_text(os.path.join(args.output_dir, "bench.json"), json.dumps(payload, indent=2))
    write_text(os.path.join(args.output_dir, "bench.md"), md)


def main(argv=None):
    args = parse_args(argv)
    import fairseq_localness  # noqa: F401  (registers the models)

    if args.list:
        for name, (model, options) in SYSTEMS.items():
            print(f"{name}: {model}_{args.size} {' '.join(options)}")
        return

    device = select_device(args).type
    payload = {"machine": "", "device": device, "settings": {k: getattr(args, k) for k in SETTINGS}}

    def machine() -> str:  # after run() has set the threads
        line = machine_description(device, args.dtype)
        if args.clock == "cpu":
            line += ", timed by process CPU time"
        if args.width is not None:
            line += f", every model at width {args.width} (--width: the host's cost per call, not the arithmetic)"
        return line + (f", attention_impl {' '.join(args.attention_impl)}" if args.attention_impl != ["auto"] else "")

    if args.lengths:
        def write(sweep):  # after every round and length, so that an interrupted sweep keeps what it measured
            payload["machine"] = machine()
            summary, md = bench_sweep.report(sweep, args, payload["machine"])
            payload.update(summary)
            _write(args, payload, md)
            return md

        sweep = bench_sweep.run_sweep(args, write)
        results = [r for entry in sweep for r in entry["results"]]
        md = write(sweep)
    else:
        def after_round(partial, where):  # so that a run stopped by a time limit keeps its rounds
            payload.update(machine=machine(), results=records(partial), partial=where)
            _write(args, payload, f"So far: {where} (the run went on).\n\n" + table(partial, payload["machine"]))

        results = run(args, after_round)
        payload.pop("partial", None)
        payload["machine"] = machine()
        payload["results"] = records(results)
        md = table(results, payload["machine"])
        _write(args, payload, md)
    print(md)
    failed = sorted({r.name for r in results if r.error})
    if failed:
        print(f"systems that failed: {failed}", file=sys.stderr)


if __name__ == "__main__":
    main()
