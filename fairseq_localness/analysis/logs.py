"""Reading fairseq-train logs (the lines fairseq writes to stdout / ``--log-file``):
training and validation records, the parameter count, the training time. Used by
``learning_curves``, ``efficiency`` and ``fairseq-localness-results``.

The records are read as JSON: ``scripts/train.sh`` trains with ``--log-format json``,
so each ``train_inner`` / ``train`` / ``valid`` record is one JSON object after
fairseq's logger prefix (the tag prefixed to every key, e.g. ``valid_loss``, is
removed; values become numbers)::

    ... | INFO | train_inner | {"epoch": 1, "update": 0.25, "loss": "7.46", "wps": "35191.2", "ups": "47.64", "num_updates": "10", ...}
    ... | INFO | valid | {"epoch": 1, "valid_loss": "6.629", "valid_bleu": "3.25", "valid_num_updates": "25"}
    ... | INFO | train | {"epoch": 1, "train_loss": "7.161", "train_wps": "680.9", "train_ups": "0.35", "train_num_updates": "40"}

A log written by fairseq's ``--log-file`` (the reproduce drivers' ``train.log``) holds
the same records without the prefix, one JSON object a line; the kind is read from the
keys (``valid_num_updates``: ``valid``, ``train_num_updates``: ``train``, a bare
``num_updates``: ``train_inner``)::

    {"epoch": 1, "valid_loss": "7.421", "valid_nll_loss": "7.383", "valid_num_updates": "1"}

plus two plain lines of ``fairseq_cli.train``::

    ... | INFO | fairseq_cli.train | num. shared model params: 245,760 (num. trained: 245,760)
    ... | INFO | fairseq_cli.train | done training in 947.1 seconds

Logs written with ``--log-format simple`` (``epoch 001 | loss 7.161 | ... |
num_updates 40``, ``loss=6.983, ..., num_updates=50``) are read too. fairseq's
default ``tqdm`` progress bar does not write parseable records.
"""
import json
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from fairseq_localness.analysis.cli_args import AnalysisError

_LINE = re.compile(r"\|\s*(?:INFO|WARNING)\s*\|\s*([A-Za-z0-9_.\-]+)\s*\|\s?(.*)$")
_PARAMS = re.compile(r"num\. (?:shared )?model params: ([\d,]+)(?: \(num\. trained: ([\d,]+)\))?")
_DONE = re.compile(r"done training in ([\d.]+) seconds")
_KV_EQ = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=([-+0-9.eE]+|nan|inf)")
_KV_BAR = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*) ([-+0-9.eE]+|nan|inf)\s*$")
_EPOCH = re.compile(r"epoch (\d+)")
_BARE_KIND = re.compile(r'"(?:([A-Za-z0-9]+)_)?num_updates"')


@dataclass
class TrainingLog:
    path: str
    params: Optional[int] = None
    trained_params: Optional[int] = None
    train_seconds: Optional[float] = None
    records: List[Dict] = field(default_factory=list)  # {"kind", "epoch", metric: float, ...}

    def of_kind(self, kind: str) -> List[Dict]:
        return [r for r in self.records if r["kind"] == kind]

    @property
    def valid_subsets(self) -> List[str]:
        return list(dict.fromkeys(r["kind"] for r in self.records if r["kind"] not in ("train", "train_inner")))

    @property
    def last_update(self) -> Optional[int]:
        ups = [r["num_updates"] for r in self.records if "num_updates" in r]
        return int(max(ups)) if ups else None


def _number(value) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _parse_record(kind: str, text: str) -> Optional[Dict]:
    text = text.strip()
    record: Dict = {"kind": kind}
    if text.startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            return None
        for key, value in obj.items():
            if key.startswith(kind + "_"):  # fairseq's json records prefix every key with the tag
                key = key[len(kind) + 1:]
            v = _number(value)
            if v is not None:
                record[key] = v
    else:
        m = _EPOCH.search(text)
        if m:
            record["epoch"] = float(m.group(1))
        for part in text.split("|"):
            kv = _KV_BAR.match(part)
            if kv:
                record[kv.group(1)] = float(kv.group(2))
        for key, value in _KV_EQ.findall(text):
            record[key] = float(value)
    return record if "num_updates" in record else None


def parse_log(path: str) -> TrainingLog:
    """Parse one fairseq-train log. ``path`` may be the log file or a directory with a
    ``train.log`` (the layout of ``scripts/train.sh`` / ``make demo``)."""
    if os.path.isdir(path):
        path = os.path.join(path, "train.log")
    if not os.path.isfile(path):
        raise AnalysisError(f"training log {path!r} does not exist")
    log = TrainingLog(path=path)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = _PARAMS.search(line)
            if m and log.params is None:
                log.params = int(m.group(1).replace(",", ""))
                if m.group(2):
                    log.trained_params = int(m.group(2).replace(",", ""))
                continue
            m = _DONE.search(line)
            if m:
                log.train_seconds = float(m.group(1))
                continue
            m = _LINE.search(line)
            if m:
                kind, text = m.group(1), m.group(2)
            elif line.startswith('{"'):  # (--log-file: the record alone)
                k = _BARE_KIND.search(line)
                if not k:
                    continue
                kind, text = k.group(1) or "train_inner", line
            else:
                continue
            if kind.startswith("fairseq") or kind in ("root",):
                continue
            record = _parse_record(kind, text)
            if record is not None:
                log.records.append(record)
    return log
