"""Speed, memory and size of every model against fairseq's transformer (``make bench``).

For each system (an architecture plus options) at one size preset, in one process:

* **train tok/s**: target tokens per second of a full training step (forward,
  backward, Adam step) on a fixed synthetic batch;
* **decode sent/s**: sentences per second of beam search (beam 4) with the output
  length pinned (``min_len = max_len``), so every system decodes the same number of
  steps whatever its (random) weights predict;
* **activations**: bytes of the tensors autograd saves for the backward pass of one
  training forward pass (deduplicated by storage). On a CPU this is the measurable,
  deterministic part of training memory that differs between systems; on a GPU the
  CUDA peak is reported as well;
* **largest tensor**: the largest tensor any op creates in a training forward pass
  (the output layer's ``B x T x vocab`` logits aside, which every system shares), in
  units of the per-head attention weights ``B x H x T x T``: a value above 1 means the
  system materialises something larger than the attention it needs;
* **params**: parameter count;
* **bound**: the arithmetic bound on the throughput ratio: multiply-adds of one
  training step of the transformer divided by those of the system, counted by
  ``torch.utils.flop_counter.FlopCounterMode`` (matrix products and attention).

Timings are interleaved (round-robin over systems, ``--repeats`` rounds, median
taken) so that drift of the machine hits every system alike, and every figure is also
given as a ratio to the transformer measured in the same run. Absolute numbers from
different runs or machines are not comparable; the ratios are the result.

``--quick`` (CI) uses a small batch and few rounds and finishes in a few minutes on 2
CPU cores; the default is meant for a GPU or a patient CPU.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

import torch

# name -> (model name, extra options); the arch is "<model>_<size>"
SYSTEMS: Dict[str, tuple] = {
    "transformer": ("transformer", []),
    "localness (query, enc 1-3)": ("localness_transformer", []),
    "localness + rel_pos": ("localness_transformer", ["--localness-rel-pos"]),
    "hysan e1 (gated)": ("hysan_transformer", []),
    "hysan e1 (sum)": ("hysan_transformer", ["--hysan-fusion", "sum"]),
    "enc-dc (f=2)": ("dc_transformer", ["--dc-mode", "enc"]),
    "dec-dc (f=2)": ("dc_transformer", ["--dc-mode", "dec"]),
    "full-dc (f=2)": ("dc_transformer", ["--dc-mode", "full"]),
}
BASELINE = "transformer"


def register_system(name: str, model: str, options: List[str]):
    """Add a system to the benchmark (a model module may register its variants)."""
    SYSTEMS[name] = (model, list(options))


@dataclass
class Result:
    name: str
    arch: str
    options: List[str]
    params: int = 0
    train_flops: float = 0.0
    train_times: List[float] = field(default_factory=list)
    decode_times: List[float] = field(default_factory=list)
    activation_bytes: int = 0
    cuda_peak_bytes: Optional[int] = None
    largest_tensor_ratio: float = 0.0
    train_tokens: int = 0
    decode_sentences: int = 0
    error: Optional[str] = None

    @property
    def train_tok_s(self) -> float:
        return self.train_tokens / statistics.median(self.train_times) if self.train_times else 0.0

    @property
    def decode_sent_s(self) -> float:
        return self.decode_sentences / statistics.median(self.decode_times) if self.decode_times else 0.0


class _Toy:
    """A task stand-in: a joined dictionary of ``vocab`` symbols."""

    def __init__(self, vocab: int):
        from fairseq.data import Dictionary

        d = Dictionary()
        for i in range(vocab - d.nspecial):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def build(model_name: str, size: str, options: List[str], task, device):
    from fairseq import options as fairseq_options
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_localness  # noqa: F401

    arch = f"{model_name}_{size}"
    parser = fairseq_options.get_training_parser()
    args = fairseq_options.parse_args_and_arch(
        parser, ["/dev/null", "--task", "translation", "--arch", arch, "--share-all-embeddings"] + options
    )
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task).to(device)
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


def _train_step(model, optimizer, batch):
    src, lengths, prev, tgt = batch
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def count_train_flops(model, batch) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    src, lengths, prev, tgt = batch
    with FlopCounterMode(display=False) as counter:
        logits, _ = model(src, lengths, prev)
        torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1)).backward()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops())


def measure_memory(model, batch, num_heads: int):
    """Saved-for-backward bytes and the largest tensor of a training forward pass."""
    from torch.utils._python_dispatch import TorchDispatchMode

    src, lengths, prev, tgt = batch
    storages = {}

    def pack(t):
        try:
            key = t.untyped_storage().data_ptr()
            storages[key] = max(storages.get(key, 0), t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):
            pass
        return t

    largest = [0]
    vocab = model.decoder.output_projection.out_features

    class Largest(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for o in out if isinstance(out, (tuple, list)) else (out,):
                # the output layer's B x T x vocab logits are the same for every system
                if isinstance(o, torch.Tensor) and o.dim() > 0 and o.size(-1) != vocab:
                    largest[0] = max(largest[0], o.numel())
            return out

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with Largest():
            logits, _ = model(src, lengths, prev)
    del logits
    attention = src.size(0) * num_heads * max(src.size(1), prev.size(1)) ** 2
    return sum(storages.values()), largest[0] / attention


def run(args) -> List[Result]:
    from fairseq.sequence_generator import SequenceGenerator

    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    if device.type == "cpu" and args.threads:
        torch.set_num_threads(args.threads)
    task = _Toy(args.vocab)
    batch = make_batch(task, args.batch_size, args.src_len, args.tgt_len, device)
    decode_src = make_batch(task, args.decode_batch, args.src_len, args.tgt_len, device, seed=1)[:2]
    names = [n for n in SYSTEMS if not args.systems or n in args.systems or SYSTEMS[n][0] in args.systems]
    if BASELINE not in names:
        names.insert(0, BASELINE)

    models, optimizers, results = {}, {}, {}
    for name in names:
        model_name, options = SYSTEMS[name]
        res = Result(name=name, arch="", options=options)
        results[name] = res
        try:
            res.arch, model = build(model_name, args.size, options, task, device)
        except Exception as exc:  # a broken system is reported, not fatal
            res.error = f"build failed: {exc}"
            continue
        res.params = sum(p.numel() for p in model.parameters())
        model.train()
        res.train_flops = count_train_flops(model, batch)
        heads = model.encoder.layers[0].self_attn.num_heads if hasattr(model.encoder.layers[0], "self_attn") else 1
        res.activation_bytes, res.largest_tensor_ratio = measure_memory(model, batch, heads)
        optimizers[name] = torch.optim.Adam(model.parameters(), lr=1e-4)
        _train_step(model, optimizers[name], batch)  # warm-up
        models[name] = model
        res.train_tokens = int(batch[3].numel())
        res.decode_sentences = args.decode_batch
        print(f"built {name}: {res.params:,} parameters", file=sys.stderr)

    for round_ in range(args.repeats):
        for name, model in models.items():
            model.train()
            _sync(device)
            start = time.perf_counter()
            _train_step(model, optimizers[name], batch)
            _sync(device)
            results[name].train_times.append(time.perf_counter() - start)
        for name, model in models.items():
            model.eval()
            gen = SequenceGenerator(
                [model], task.target_dictionary, beam_size=4, max_len_a=0,
                max_len_b=args.decode_len, min_len=args.decode_len,
            )
            sample = {"net_input": {"src_tokens": decode_src[0], "src_lengths": decode_src[1]}}
            _sync(device)
            start = time.perf_counter()
            with torch.no_grad():
                gen.generate([model], sample)
            _sync(device)
            results[name].decode_times.append(time.perf_counter() - start)
        print(f"round {round_ + 1}/{args.repeats} done", file=sys.stderr)

    if device.type == "cuda":
        for name, model in models.items():
            torch.cuda.reset_peak_memory_stats()
            _train_step(model, optimizers[name], batch)
            results[name].cuda_peak_bytes = torch.cuda.max_memory_allocated()
    return [results[n] for n in names]


def table(results: List[Result], machine: str) -> str:
    base = next((r for r in results if r.name == BASELINE and not r.error), None)

    def ratio(value, ref):
        return f"{value / ref:.3f}" if ref else "n/a"

    lines = [
        f"Measured on {machine}.",
        "",
        "| system | params | train tok/s | train ratio | bound | ratio / bound | decode sent/s | decode ratio | activations MB | act. ratio | largest tensor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.name} | {r.error} |" + " |" * 9)
            continue
        tr = r.train_tok_s / base.train_tok_s if base else 0
        bound = base.train_flops / r.train_flops if base and r.train_flops else 0
        lines.append(
            f"| {r.name} | {r.params:,} | {r.train_tok_s:,.0f} | {tr:.3f} | {bound:.3f} | "
            f"{(tr / bound if bound else 0):.3f} | {r.decode_sent_s:.2f} | "
            f"{ratio(r.decode_sent_s, base.decode_sent_s if base else 0)} | {r.activation_bytes / 2**20:,.1f} | "
            f"{ratio(r.activation_bytes, base.activation_bytes if base else 0)} | {r.largest_tensor_ratio:.2f} |"
        )
    return "\n".join(lines) + "\n"


def machine_description(device: str) -> str:
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
        desc += f", GPU {torch.cuda.get_device_name()}"
    return desc


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small batch, few rounds (CI)")
    p.add_argument("--size", default="iwslt_de_en", help="size preset suffix (default: iwslt_de_en)")
    p.add_argument("--systems", nargs="*", help="restrict to these system or model names")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--src-len", type=int, default=None)
    p.add_argument("--tgt-len", type=int, default=None)
    p.add_argument("--decode-batch", type=int, default=None)
    p.add_argument("--decode-len", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--output-dir", default="runs/bench", help="where bench.json and bench.md go")
    p.add_argument("--list", action="store_true", help="list the systems and exit")
    return p


def main(argv=None):
    args = get_parser().parse_args(argv)
    import fairseq_localness  # noqa: F401  (registers the models)

    if args.list:
        for name, (model, options) in SYSTEMS.items():
            print(f"{name}: {model}_{args.size} {' '.join(options)}")
        return
    defaults = dict(batch_size=(8, 64), src_len=(24, 32), tgt_len=(24, 32), decode_batch=(4, 32),
                    decode_len=(12, 32), repeats=(3, 7))
    for key, (quick, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    for key in defaults:
        if getattr(args, key) < 1:
            sys.exit(f"benchmark: --{key.replace('_', '-')} must be >= 1")
    unknown = [s for s in args.systems or [] if s not in SYSTEMS and s not in {m for m, _ in SYSTEMS.values()}]
    if unknown:
        sys.exit(f"benchmark: unknown system(s) {unknown}; known: {sorted(SYSTEMS)}")

    results = run(args)
    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    machine = machine_description(device)
    md = table(results, machine)
    os.makedirs(args.output_dir, exist_ok=True)
    settings = {k: getattr(args, k) for k in ("size", "batch_size", "src_len", "tgt_len", "decode_batch", "decode_len", "repeats", "vocab", "quick")}
    base = next((r for r in results if r.name == BASELINE and not r.error), None)
    payload = {
        "machine": machine,
        "settings": settings,
        "results": [
            dict(
                asdict(r),
                train_tok_s=r.train_tok_s,
                decode_sent_s=r.decode_sent_s,
                train_ratio=(r.train_tok_s / base.train_tok_s) if base and not r.error else None,
                decode_ratio=(r.decode_sent_s / base.decode_sent_s) if base and not r.error else None,
                arithmetic_bound=(base.train_flops / r.train_flops) if base and r.train_flops else None,
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
    # Run the package's copy of this module, whose SYSTEMS the models extend.
    from fairseq_localness.benchmark import main as package_main

    package_main()
