"""The benchmark's outputs: the markdown table of one run, the machine line and the
records that go to ``bench.json``."""
import os
import platform
import statistics
from dataclasses import asdict
from typing import List, Optional

import torch

from fairseq_localness.cli.bench_run import BASELINE, Result, arithmetic_bound, decode_bound


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
    return "\n".join(lines + observed(results) + spread(results, base) + launches(results, base)) + "\n"


def observed(results: List[Result]) -> List[str]:
    """The line under the table that names the rows whose counts (bounds, activations,
    largest tensors) were observed on the eager path while their times are their own
    path's (:func:`~.bench_measure.observable`: CUDA, or ``attention_impl="flex"``)."""
    names = [r.name for r in results if r.observed_on_eager and not r.error]
    if not names:
        return []
    return ["", "Counted on the eager path, which computes the same distributions (a dispatch mode cannot "
            "observe a compiled FlexAttention call), and timed on their own: the bounds, activations and "
            "largest tensors of " + ", ".join(names) + "."]


def launches(results: List[Result], base: Optional[Result]) -> List[str]:
    """The lines under the table on a GPU with ``--profile``: the kernels (with the
    memory copies and fills) that one profiled training step and one beam search
    launched, and their summed device time, with the kernels as a ratio to the
    transformer's."""
    rows = [r for r in results if r.launches and not r.error]
    if not rows:
        return []

    def cells(r, kind):
        mine = r.launches.get(kind)
        if not mine:
            return "n/a | n/a | n/a | n/a"
        ref = (base.launches.get(kind) or {}).get("kernels") if base is not None else None
        ratio = f"{mine['kernels'] / ref:.2f}" if ref else "n/a"
        syncs = mine.get("syncs")
        return f"{mine['kernels']:,} | {ratio} | {mine['device_ms']:.1f} | {'n/a' if syncs is None else syncs}"

    lines = ["", "GPU launches of one profiled pass: kernels, memory copies and fills, their ratio to the "
             "transformer's and their summed device time; and the times the pass made the host wait for the "
             "GPU (syncs, where: profile/<system>.<pass>.syncs.txt).", "",
             "| system | train kernels | ratio | train GPU ms | train syncs | decode kernels | ratio | decode GPU ms "
             "| decode syncs |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.name} | {cells(r, 'train')} | {cells(r, 'decode')} |")
    return lines


def spread(results: List[Result], base: Optional[Result]) -> List[str]:
    """The lines under the table: how far each system's paired ratios (``transformer
    time / system time`` of one round, divided by the bound) spread over the rounds,
    as quartiles, so that a reader can tell a gap between two ratios from the
    machine's noise; none for a run of one round."""
    rows = [r for r in results if r.name != BASELINE and not r.error]
    if base is None or not rows or max(len(r.train_ratios) for r in rows) < 2:
        return []

    def cell(values, median, bound):
        if not bound or median is None or len(values) < 2:
            return "n/a"
        # statistics' inclusive quartiles; the median as the table computes it (the
        # same value, to the last digit)
        first, _, third = statistics.quantiles([v / bound for v in values], n=4, method="inclusive")
        return f"{median / bound:.3f} ({first:.3f}-{third:.3f})"

    lines = ["", "Spread over the rounds: ratio / bound of each round, median (first-third quartile).", "",
             "| system | rounds | train ratio / bound | dec. ratio / bound |", "|---|---:|---:|---:|"]
    for r in rows:
        train = cell(r.train_ratios, r.train_ratio, arithmetic_bound(r, base))
        decode = cell(r.decode_ratios, r.decode_ratio, decode_bound(r, base))
        lines.append(f"| {r.name} | {len(r.train_ratios)} | {train} | {decode} |")
    return lines


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
    plural = "s" if threads != 1 else ""
    desc = f"{cpu}, {os.cpu_count()} cores ({threads} torch thread{plural}), torch {torch.__version__}"
    if device == "cuda":
        desc += f", GPU {torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    return desc + f", {dtype}"



def baseline(results: List[Result]) -> Optional[Result]:
    """The transformer's result, or ``None`` where it failed."""
    return next((r for r in results if r.name == BASELINE and not r.error), None)


def records(results: List[Result]) -> List[dict]:
    """One ``bench.json`` record per result: its raw fields, the medians and the bounds."""
    base = baseline(results)
    return [
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
    ]
