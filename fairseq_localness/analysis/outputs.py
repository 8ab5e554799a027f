"""What the analysis tools read and write: the output directory, CSV and JSON tables,
text files of one sentence a line, and progress bars (on stderr).
"""
import csv
import json
import logging
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

logger = logging.getLogger("fairseq_localness.analysis")


def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def write_csv(path: str, rows: Sequence[Dict[str, Any]], fieldnames: Optional[Sequence[str]] = None) -> str:
    """Write dict rows as CSV (columns: ``fieldnames`` or the keys in first-seen order);
    floats are written with 6 significant digits."""
    if fieldnames is None:
        fieldnames = []
        for r in rows:
            for k in r:
                if k not in fieldnames:
                    fieldnames.append(k)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(fieldnames), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    logger.info("wrote %s", path)
    return path


def read_csv(path: str) -> List[Dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_json(path: str, obj: Any) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
    logger.info("wrote %s", path)
    return path


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def progress(iterable=None, total=None, desc=None, disable=False, unit="sent"):
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=disable, unit=unit, file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True)
