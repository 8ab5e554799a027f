"""Parameter count and training speed per system against a baseline (the papers'
"Param." and "Speed" columns), from fairseq-train logs.

For each system (``--system NAME=LOG``; a directory stands for its ``train.log``):

* ``params``: fairseq-train's ``num. shared model params`` (shared tensors counted
  once), and its difference from the baseline, absolute and relative;
* ``wps``: target tokens per second, the mean over the log's ``train_inner``
  records (the epoch-level ``train`` records when there are none);
* ``ups``: updates per second, likewise; ``speed_ratio`` = ``ups`` / baseline's;
* ``updates``, ``train_seconds`` (fairseq's ``done training in ... seconds``).

The baseline is ``--baseline`` or the first system. Speeds are comparable only
between runs on the same hardware with the same batch size (the papers measure on
one machine); for a controlled measurement use ``fairseq-localness-bench`` (``make
bench``), which times every system in one process.

Outputs in ``--output-dir``: ``efficiency.csv``, ``efficiency.md`` (a Markdown
table) and ``efficiency.png`` (parameters and speed relative to the baseline).

Example::

    python -m fairseq_localness.analysis.efficiency --system transformer=runs/demo/systems/transformer \\
        --system enc-dc=runs/demo/systems/enc-dc --output-dir analysis/efficiency
"""
import argparse
from typing import Dict, List, Optional

from fairseq_localness.analysis import common as C
from fairseq_localness.analysis.logs import parse_log


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis efficiency", description=__doc__.split("\n\n")[0])
    p.add_argument("--system", action="append", required=True, metavar="NAME=LOG",
                   help="a system's fairseq-train log (or a directory with train.log); repeatable")
    p.add_argument("--baseline", default=None, help="name of the baseline system (default: the first)")
    C.add_output_args(p)
    return p


def _mean(values: List[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def system_row(name: str, path: str) -> Dict:
    log = parse_log(path)
    if log.params is None:
        raise C.AnalysisError(f"{name}: {log.path} has no 'num. model params' line (is it a fairseq-train log?)")
    records = log.of_kind("train_inner") or log.of_kind("train")
    return {
        "system": name, "params": log.params,
        "wps": _mean([r["wps"] for r in records if "wps" in r]),
        "ups": _mean([r["ups"] for r in records if "ups" in r]),
        "updates": log.last_update, "train_seconds": log.train_seconds, "log": log.path,
    }


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(rows: List[Dict], baseline: str) -> str:
    lines = [
        f"| system | params | Δ params vs {baseline} | wps | ups | speed vs {baseline} | updates | train time (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        delta = f"{r['params_delta']:+,} ({r['params_delta_pct']:+.1f}%)"
        lines.append(
            f"| {r['system']} | {r['params']:,} | {delta} | {_fmt(r['wps'], '.1f')} | {_fmt(r['ups'], '.3f')} | "
            f"{_fmt(r['speed_ratio'], '.2f')} | {_fmt(r['updates'], 'd')} | {_fmt(r['train_seconds'], '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def plot(rows: List[Dict], baseline: str, path: str):
    plt = C.pyplot()
    names = [r["system"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(6, 1.1 * len(names) + 3), 3.6))
    ax1.bar(range(len(rows)), [r["params"] / 1e6 for r in rows], color=["C7" if n == baseline else "C0" for n in names])
    ax1.set_ylabel("parameters (M)")
    ax1.set_title("Param.", fontsize=9)
    ratios = [r["speed_ratio"] if r["speed_ratio"] is not None else 0.0 for r in rows]
    ax2.bar(range(len(rows)), ratios, color=["C7" if n == baseline else "C1" for n in names])
    ax2.axhline(1.0, color="black", lw=0.8)
    ax2.set_ylabel(f"updates/s relative to {baseline}")
    ax2.set_title("Speed", fontsize=9)
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    return C.save_figure(fig, path)


def main(args):
    out_dir = C.ensure_dir(args.output_dir)
    systems = C.parse_named(args.system, "--system")
    rows = [system_row(name, path) for name, path in systems]
    baseline = args.baseline or rows[0]["system"]
    base = next((r for r in rows if r["system"] == baseline), None)
    if base is None:
        raise C.AnalysisError(f"--baseline {baseline!r} is not one of the systems {[r['system'] for r in rows]}")
    for r in rows:
        r["params_delta"] = r["params"] - base["params"]
        r["params_delta_pct"] = 100.0 * r["params_delta"] / base["params"]
        r["speed_ratio"] = r["ups"] / base["ups"] if r["ups"] and base["ups"] else None
    cols = ["system", "params", "params_delta", "params_delta_pct", "wps", "ups", "speed_ratio", "updates",
            "train_seconds", "log"]
    C.write_csv(f"{out_dir}/efficiency.csv", rows, cols)
    with open(f"{out_dir}/efficiency.md", "w", encoding="utf-8") as f:
        f.write(markdown(rows, baseline))
    plot(rows, baseline, f"{out_dir}/efficiency.png")
    return {"baseline": baseline, "rows": rows}


def cli_main(argv=None):
    return C.run_cli("efficiency", main, argv, get_parser())


if __name__ == "__main__":
    cli_main()
