"""The GPU check's training table: fairseq-train's own speed, kernels per step and peak
memory of every system, as ratios to the transformer's, for docs/benchmark.md.

    python scripts/gpu_train_table.py LOG_DIR [DEVICE_FILE] > train.md

Reads ``LOG_DIR/<system>.<dtype>.log`` and ``LOG_DIR/<system>.<attention impl>.<dtype>.log``
(fairseq-train with ``--log-format simple``, run through scripts/gpu_train_probe.py; the
second with the models' ``--attention-impl``, a row ``<system> [<impl>]``) and,
optionally, the device line(s) the check wrote (``device.txt``), and prints a markdown
table per dtype:

* ``wps``: the median of fairseq's ``wps`` over the logged intervals after update
  :data:`WARMUP` (the warm-up, the kernels' compilation and the profiled steps left
  out), and its ratio to the transformer's of the same dtype;
* ``kernels/step`` and ``peak MB``: the probe's lines, and their ratios; ``host
  syncs/step``: the probe's count of the host's waits for the GPU per step;
* ``updates``: the last update logged (a run cut short by its time limit shows fewer
  than it was given).
"""
import glob
import os
import re
import statistics
import sys
from typing import Dict, List, Optional

# Logged intervals ending at or before this update are left out of the speed; the
# probe profiles updates 101-103 (scripts/gpu_train_probe.py), inside the interval that
# ends at 125 with --log-interval 25.
WARMUP = 125
BASELINE = "transformer"


def parse(text: str) -> Dict[str, Optional[float]]:
    """wps (median after the warm-up), kernels per step, peak MB and the last update
    of one log; None where the log does not say."""
    speeds = []
    last = 0
    for line in text.splitlines():
        if "train_inner" not in line:
            continue
        wps = re.search(r"\bwps=([0-9.]+)", line)
        update = re.search(r"\bnum_updates=(\d+)", line)
        if not (wps and update):
            continue
        last = max(last, int(update.group(1)))
        if int(update.group(1)) > WARMUP:
            speeds.append(float(wps.group(1)))
    kernels = re.search(r"gpu_check: kernels per step ([0-9.]+)", text)
    syncs = re.search(r"gpu_check: host syncs per step ([0-9.]+)", text)
    peak = re.search(r"gpu_check: peak memory ([0-9.]+) MB", text)
    return {
        "wps": statistics.median(speeds) if speeds else None,
        "kernels": float(kernels.group(1)) if kernels else None,
        "syncs": float(syncs.group(1)) if syncs else None,
        "peak": float(peak.group(1)) if peak else None,
        "updates": float(last),
    }


def _ratio(value, base) -> str:
    return "-" if value is None or not base else f"{value / base:.2f}"


def _number(value, digits=0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _label(run: str) -> str:
    """``localness.dense`` -> ``localness [dense]``; a run with the default kernels keeps
    its system's name."""
    system, _, impl = run.partition(".")
    return f"{system} [{impl}]" if impl else system


def table(runs: Dict[str, Dict[str, Dict[str, Optional[float]]]], dtype: str) -> List[str]:
    """The markdown rows of one dtype (``runs[system][dtype]``), the transformer first."""
    systems = sorted((s for s in runs if dtype in runs[s]), key=lambda s: (s != BASELINE, list(runs).index(s)))
    base = runs.get(BASELINE, {}).get(dtype, {})
    lines = [f"| system ({dtype}) | wps | speed ratio | kernels/step | launch ratio | host syncs/step | peak MB "
             "| memory ratio | updates |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for system in systems:
        r = runs[system][dtype]
        lines.append(
            f"| {_label(system)} | {_number(r['wps'])} | {_ratio(r['wps'], base.get('wps'))} | "
            f"{_number(r['kernels'])} | {_ratio(r['kernels'], base.get('kernels'))} | {_number(r.get('syncs'), 1)} | "
            f"{_number(r['peak'])} | "
            f"{_ratio(r['peak'], base.get('peak'))} | {int(r['updates'])} |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2 or not os.path.isdir(argv[0]):
        print("usage: gpu_train_table.py LOG_DIR [DEVICE_FILE] "
              "(LOG_DIR: <system>[.<attention impl>].<dtype>.log files)", file=sys.stderr)
        return 2
    runs: Dict[str, Dict[str, Dict[str, Optional[float]]]] = {}
    for path in sorted(glob.glob(os.path.join(argv[0], "*.*.log"))):
        system, dtype = os.path.basename(path)[: -len(".log")].rsplit(".", 1)
        with open(path, errors="replace") as f:
            runs.setdefault(system, {})[dtype] = parse(f.read())
    device = "an unnamed device"
    if len(argv) == 2 and os.path.isfile(argv[1]):
        with open(argv[1], errors="replace") as f:
            device = "; ".join(line.strip() for line in f if line.strip()) or device
    print(f"Measured on {device}: fairseq-train, 4,096 tokens per batch, wps after update {WARMUP}, "
          "ratios to the transformer's.")
    for dtype in sorted({d for r in runs.values() for d in r}):
        print()
        print("\n".join(table(runs, dtype)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
