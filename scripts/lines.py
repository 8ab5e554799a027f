#!/usr/bin/env python3
"""Line checks of the pipeline scripts, without importing fairseq.

    lines.py normalize [--prog P] IN OUT [IN OUT ...]
        copy IN to OUT with the line-breaking characters other than \\n and NUL bytes
        of every line replaced by a space (fairseq_localness/data/text.py,
        normalize_line), one line per line of IN, each ending in \\n; says on stderr
        which lines changed. IN must be UTF-8.
    lines.py check [--prog P] [--what TEXT] [--reference] FILE...
        the files are line-parallel (the same number of lines) and hold no
        line-breaking characters other than \\n and no NUL bytes, which other tools
        would read as more lines (or, grep, as binary data); otherwise an error
        naming the file and the first such line. --reference: a reference
        translation as sacrebleu reads it: a line end \\r\\n (Windows) and NUL
        bytes are fine there, the other line-breaking characters are not.
    lines.py hypotheses [--prog P] --expected N [--log LOG] GENERATE_OUT HYP SKIPPED_JSON
        the hypotheses (H-<id> lines) of fairseq-generate's output in input order, one
        line per sentence 0 .. N-1, into HYP; a sentence fairseq skipped for being
        longer than the model accepts (--skip-invalid-size-inputs-valid-test) gets an
        empty line and a warning naming its line; SKIPPED_JSON: {"lines": [1-based
        line numbers]}. Any other missing or repeated hypothesis is an error. LOG: the
        command's stderr, where fairseq reports the sentences it skipped.
    lines.py count FILE...
        the number of lines of each file, one per line: the \\n-terminated lines plus
        an unterminated last one; for a fairseq .idx file (mmap format) the number of
        sentences it indexes.

Errors print "<prog>: error: <message>" and exit with status 2.
"""
import argparse
import importlib
import json
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_data import load_data_package  # noqa: E402

load_data_package()
text = importlib.import_module("fairseq_localness_data.text")

MMAP_MAGIC = b"MMIDIDX\x00\x00"
_NAMES = {"\r": "\\r", "\x00": "NUL", "\x0b": "\\v", "\x0c": "\\f", "\x85": "U+0085",
          "\u2028": "U+2028", "\u2029": "U+2029"}


class LinesError(Exception):
    pass


def read_lines(path):
    """The lines of ``path`` split at \\n only (the last one may lack it)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LinesError(f"cannot read '{path}': {e.strerror}")
    if not data:
        return []
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise LinesError(f"'{path}' is not UTF-8 text (line {line}: {e.reason}); expected UTF-8")
    lines = decoded.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def describe(line: str) -> str:
    found = sorted({_NAMES.get(ch, f"U+{ord(ch):04X}") for ch in line if ch == "\x00" or ch in text.LINE_BREAKING})
    return ", ".join(found)


def count(path: str) -> int:
    if path.endswith(".idx"):
        with open(path, "rb") as f:
            if f.read(9) == MMAP_MAGIC:
                f.read(8 + 1)  # version, dtype
                return struct.unpack("<Q", f.read(8))[0]
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def normalize(prog: str, pairs):
    for src, dst in pairs:
        lines = read_lines(src)
        changed = [i for i, line in enumerate(lines, 1) if text.has_line_breaking(line)]
        with open(dst, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(text.normalize_line(line) + "\n")
        if changed:
            first = lines[changed[0] - 1]
            print(f"{prog}: {src}: replaced line-breaking characters or NUL bytes ({describe(first)} in line "
                  f"{changed[0]}) by spaces in {len(changed)} line(s): "
                  f"{', '.join(map(str, changed[:10]))}{' ...' if len(changed) > 10 else ''}", file=sys.stderr)


def check(what: str, paths, reference: bool = False):
    counts = {}
    for path in paths:
        lines = read_lines(path)
        for i, line in enumerate(lines, 1):
            if reference:  # a Windows line end and NUL bytes do not split lines in sacrebleu
                line = (line[:-1] if line.endswith("\r") else line).replace("\x00", "")
            if text.has_line_breaking(line):
                raise LinesError(
                    f"{what}: '{path}' line {i} holds {describe(line)}, which other tools read as a line break "
                    f"(or binary data); expected one sentence per line separated by \\n only"
                    f"{'' if reference else ' (prepare_bpe.sh replaces them by spaces)'}")
        counts[path] = len(lines)
    if len(set(counts.values())) > 1:
        listing = ", ".join(f"'{p}' has {n}" for p, n in counts.items())
        raise LinesError(f"{what}: the files are not line-parallel ({listing} lines); expected the same number "
                         f"of lines in each")


_INVALID = re.compile(r"([\d,]+) samples have invalid sizes and will be skipped, max_positions=(.*?), first few")


def hypotheses(prog: str, expected: int, log: str, generate_out: str, hyp_path: str, skipped_path: str):
    """See the module docstring (``hypotheses``)."""
    lines = []
    for path in (generate_out, log):
        if path:
            with open(path, "rb") as f:  # bytes, split at \n only: text may hold anything
                lines += f.read().split(b"\n")
    hyps = {}
    reported, max_positions = 0, None
    for line in lines:
        if line.startswith(b"H-"):
            ident, _, rest = line[2:].partition(b"\t")
            _score, _, hyp = rest.partition(b"\t")
            if not ident.isdigit() or int(ident) >= expected:
                raise LinesError(f"{generate_out}: unexpected hypothesis id {ident[:20]!r} for a set of "
                                 f"{expected} sentences")
            if int(ident) in hyps:
                raise LinesError(f"{generate_out}: sentence {int(ident)} was translated twice")
            hyps[int(ident)] = hyp
        else:
            m = _INVALID.search(line.decode("utf-8", "replace"))
            if m:
                reported += int(m.group(1).replace(",", ""))
                max_positions = m.group(2)
    missing = [i for i in range(expected) if i not in hyps]
    if len(missing) != reported:
        raise LinesError(f"fairseq-generate produced {len(hyps)} hypotheses for {expected} reference lines "
                         f"(see {os.path.basename(generate_out)}"
                         f"{' and ' + os.path.basename(log) if log else ''})")
    with open(hyp_path, "wb") as f:
        for i in range(expected):
            f.write(hyps.get(i, b"") + b"\n")
    skipped = [i + 1 for i in missing]
    with open(skipped_path, "w") as f:
        json.dump({"lines": skipped}, f)
    if skipped:
        print(f"{prog}: warning: {len(skipped)} of {expected} sentences are longer than the model accepts "
              f"(max_positions={max_positions}; --max-source-positions/--max-target-positions of the "
              f"checkpoint) and were not translated: line(s) {', '.join(map(str, skipped[:20]))}"
              f"{' ...' if len(skipped) > 20 else ''}; their hypotheses are empty lines, and BLEU counts "
              f"them as such", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(prog="lines.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("normalize")
    n.add_argument("--prog", default="lines.py")
    n.add_argument("files", nargs="+")
    c = sub.add_parser("check")
    c.add_argument("--prog", default="lines.py")
    c.add_argument("--what", default="input")
    c.add_argument("--reference", action="store_true")
    c.add_argument("files", nargs="+")
    h = sub.add_parser("hypotheses")
    h.add_argument("--prog", default="lines.py")
    h.add_argument("--expected", type=int, required=True)
    h.add_argument("--log", default="")
    h.add_argument("files", nargs=3, metavar="FILE")
    k = sub.add_parser("count")
    k.add_argument("files", nargs="+")
    args = p.parse_args(argv)
    prog = getattr(args, "prog", "lines.py")
    try:
        if args.cmd == "normalize":
            if len(args.files) % 2:
                p.error("normalize: expected pairs IN OUT")
            normalize(prog, list(zip(args.files[::2], args.files[1::2])))
        elif args.cmd == "check":
            check(args.what, args.files, args.reference)
        elif args.cmd == "hypotheses":
            hypotheses(prog, args.expected, args.log, *args.files)
        else:
            for path in args.files:
                print(count(path))
    except LinesError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
