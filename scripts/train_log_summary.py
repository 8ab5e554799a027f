"""One line per fairseq-train log: how far training got and whether it stayed finite.

    python scripts/train_log_summary.py LOG_DIR > train.tsv

For every ``LOG_DIR/<run>.log`` (fairseq-train's output with ``--log-format simple``),
a tab-separated row: the run's name, the last ``num_updates`` logged, the last training
loss, how many logged losses were NaN or infinite, how many times fp16's loss scaler
found a gradient overflow (fairseq's "gradient overflow detected" note: a few while the
scale calibrates are normal, a stream of them is an overflow storm), and ``done`` where
fairseq reported "done training" (else the log's last line). scripts/gpu_check.sh
writes its training stage's summary with it.
"""
import glob
import math
import os
import re
import sys
from typing import List

HEADER = ["run", "updates", "last loss", "NaN/inf losses", "loss-scale reductions", "ended"]


def summarise(text: str) -> List[str]:
    updates = [int(u) for u in re.findall(r"num_updates=(\d+)", text)] or [0]
    losses = [float(x) for x in re.findall(r"\bloss=([-+]?(?:[0-9.]+(?:e[-+]?\d+)?|inf|nan))", text)]
    bad = sum(1 for x in losses if not math.isfinite(x))
    overflows = len(re.findall(r"gradient overflow detected", text))
    lines = text.strip().splitlines()
    ended = "done" if "done training" in text else (lines[-1][:120] if lines else "(empty log)")
    last = f"{losses[-1]:.3f}" if losses else "-"
    return [str(max(updates)), last, str(bad), str(overflows), ended]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        print("usage: train_log_summary.py LOG_DIR (a folder of fairseq-train logs, <run>.log)", file=sys.stderr)
        return 2
    print("\t".join(HEADER))
    for path in sorted(glob.glob(os.path.join(argv[0], "*.log"))):
        with open(path, errors="replace") as f:
            row = summarise(f.read())
        print("\t".join([os.path.basename(path)[: -len(".log")]] + row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
