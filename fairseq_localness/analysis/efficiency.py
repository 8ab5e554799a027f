"""Parameter count and training speed per system against a baseline (the papers'
"Param." and "Speed" columns), from fairseq-train logs.

For each system (``--system NAME=LOG``; a directory stands for its ``train.log``):

* ``params``: fairseq-train's ``num. shared model params`` (shared tensors counted
  once), and its difference from the baseline, absolute and relative;
* ``wps``: target tokens per second, the mean over the log's ``train_inner``
  records (the epoch-level ``train`` records when there are none);
* ``ups``: updates per second, likewise; ``speed_ratio`` = ``ups`` / baseline's;
* ``updates``, ``train_seconds`` (fairseq's ``done training in ... seconds``).

Several runs of one system (its seeds): ``--system NAME=LOG`` once per run with the
same NAME. Its row then reports the mean over the runs, with the standard deviation
(n - 1 in the denominator) of ``wps``, ``ups``, ``speed_ratio`` and ``train_seconds``
(``speed_ratio``: mean ``ups`` over the baseline's mean ``ups``; its spread, that of
the system's runs' ``ups`` divided by the same), and the plot draws it as an error
bar; the runs must agree on the parameter count. ``efficiency_runs.csv`` keeps every
run's numbers.

The baseline is ``--baseline`` or the first system. Speeds are comparable only
between runs on the same hardware with the same batch size (the papers measure on
one machine); for a controlled measurement use ``fairseq-localness-bench`` (``make
bench``), which times every system in one process.

Outputs in ``--output-dir``: ``efficiency.csv`` (one row per system),
``efficiency_runs.csv`` (one row per run), ``efficiency.md`` (a Markdown table) and
``efficiency.png`` (parameters and speed relative to the baseline).

Example::

    fairseq-localness-analysis efficiency --system transformer=runs/demo/systems/transformer/seed1 \\
        --system transformer=runs/demo/systems/transformer/seed2 \\
        --system enc-dc=runs/demo/systems/enc-dc/seed1 --system enc-dc=runs/demo/systems/enc-dc/seed2 \\
        --output-dir analysis/efficiency
"""
import argparse
import math
from typing import Dict, List, Optional

from fairseq_localness.analysis.cli_args import AnalysisError, add_output_args, group_named, parse_named, run_cli
from fairseq_localness.analysis.outputs import ensure_dir, write_csv
from fairseq_localness.analysis.plotting import finish_figure, pyplot
from fairseq_localness.analysis.logs import parse_log


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis efficiency", description=__doc__.split("\n\n")[0])
    p.add_argument("--system", action="append", required=True, metavar="NAME=LOG",
                   help="a run's fairseq-train log (or a directory with train.log); repeatable; the same NAME "
                   "several times: runs of one system (e.g. seeds), reported as mean and standard deviation")
    p.add_argument("--baseline", default=None, help="name of the baseline system (default: the first)")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("efficiency", main, argv, get_parser())


def _mean(values: List[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _sd(values: List[float]) -> Optional[float]:
    if len(values) < 2:
        return None
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def run_row(name: str, path: str) -> Dict:
    """One run: parameters, mean wps/ups over its records, updates, training time."""
    log = parse_log(path)
    if log.params is None:
        raise AnalysisError(f"{name}: {log.path} has no 'num. model params' line (is it a fairseq-train log?)")
    records = log.of_kind("train_inner") or log.of_kind("train")
    return {
        "system": name, "params": log.params,
        "wps": _mean([r["wps"] for r in records if "wps" in r]),
        "ups": _mean([r["ups"] for r in records if "ups" in r]),
        "updates": log.last_update, "train_seconds": log.train_seconds, "log": log.path,
    }


def system_row(name: str, paths: List[str]) -> Dict:
    """A system over its runs: the mean (and, with several runs, the standard deviation)."""
    runs = [run_row(name, p) for p in paths]
    params = {r["params"] for r in runs}
    if len(params) > 1:
        raise AnalysisError(f"{name}: its runs have different parameter counts ({sorted(params)}): "
                            + ", ".join(r["log"] for r in runs) + "; expected runs of one model")
    row = {"system": name, "runs": len(runs), "params": runs[0]["params"], "log": ";".join(r["log"] for r in runs),
           "_runs": runs}
    for key in ("wps", "ups", "updates", "train_seconds"):
        vals = [r[key] for r in runs if r[key] is not None]
        row[key] = _mean(vals) if len(vals) == len(runs) else None
        row[key + "_sd"] = _sd(vals) if len(vals) == len(runs) else None
    return row


def _fmt(v, spec: str, sd=None) -> str:
    if v is None:
        return "-"
    return format(v, spec) + ("" if sd is None else " ± " + format(sd, spec))


def markdown(rows: List[Dict], baseline: str) -> str:
    multi = any(r["runs"] > 1 for r in rows)
    lines = [
        f"| system |{' runs |' if multi else ''} params | Δ params vs {baseline} | wps | ups | speed vs {baseline} "
        "| updates | train time (s) |",
        "|---|" + ("---:|" if multi else "") + "---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        delta = f"{r['params_delta']:+,} ({r['params_delta_pct']:+.1f}%)"
        lines.append(
            f"| {r['system']} |{' %d |' % r['runs'] if multi else ''} {r['params']:,} | {delta} "
            f"| {_fmt(r['wps'], '.1f', r['wps_sd'])} | {_fmt(r['ups'], '.3f', r['ups_sd'])} "
            f"| {_fmt(r['speed_ratio'], '.2f', r['speed_ratio_sd'])} | {_fmt(r['updates'], '.0f')} "
            f"| {_fmt(r['train_seconds'], '.1f', r['train_seconds_sd'])} |"
        )
    if multi:
        lines += ["", "mean ± standard deviation over each system's runs"]
    return "\n".join(lines) + "\n"


def plot(rows: List[Dict], baseline: str, path: str):
    plt = pyplot()
    names = [r["system"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(6, 1.1 * len(names) + 3), 3.6))
    ax1.bar(range(len(rows)), [r["params"] / 1e6 for r in rows], color=["C7" if n == baseline else "C0" for n in names])
    ax1.set_ylabel("parameters (M)")
    ax1.set_title("Param.", fontsize=9)
    ratios = [r["speed_ratio"] if r["speed_ratio"] is not None else 0.0 for r in rows]
    errs = [r["speed_ratio_sd"] or 0.0 for r in rows]
    ax2.bar(range(len(rows)), ratios, color=["C7" if n == baseline else "C1" for n in names],
            yerr=errs if any(errs) else None, capsize=3)
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_ylabel(f"updates/s relative to {baseline}")
    ax2.set_title("Speed" + (" (mean ± sd over runs)" if any(r["runs"] > 1 for r in rows) else ""), fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    return finish_figure(fig, path)


def main(args):
    out_dir = ensure_dir(args.output_dir)
    systems = group_named(parse_named(args.system, "--system", repeats=True))
    rows = [system_row(name, paths) for name, paths in systems]
    baseline = args.baseline or rows[0]["system"]
    base = next((r for r in rows if r["system"] == baseline), None)
    if base is None:
        raise AnalysisError(f"--baseline {baseline!r} is not one of the systems {[r['system'] for r in rows]}")
    for r in rows:
        r["params_delta"] = r["params"] - base["params"]
        r["params_delta_pct"] = 100.0 * r["params_delta"] / base["params"]
        r["speed_ratio"] = r["ups"] / base["ups"] if r["ups"] and base["ups"] else None
        r["speed_ratio_sd"] = r["ups_sd"] / base["ups"] if r["ups_sd"] is not None and base["ups"] else None
    runs = [dict(run, run=k) for r in rows for k, run in enumerate(r.pop("_runs"), start=1)]
    cols = ["system", "runs", "params", "params_delta", "params_delta_pct", "wps", "wps_sd", "ups", "ups_sd",
            "speed_ratio", "speed_ratio_sd", "updates", "updates_sd", "train_seconds", "train_seconds_sd", "log"]
    write_csv(f"{out_dir}/efficiency.csv", rows, cols)
    write_csv(f"{out_dir}/efficiency_runs.csv", runs,
              ["system", "run", "params", "wps", "ups", "updates", "train_seconds", "log"])
    with open(f"{out_dir}/efficiency.md", "w", encoding="utf-8") as f:
        f.write(markdown(rows, baseline))
    plot(rows, baseline, f"{out_dir}/efficiency.png")
    return {"baseline": baseline, "rows": rows, "runs": runs}


if __name__ == "__main__":
    cli_main()
