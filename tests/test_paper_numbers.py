"""The papers' numbers in docs/reproduce.md are the ones the reproduce drivers print.

Each driver in scripts/reproduce/ holds the paper's BLEU, parameter count and training
speed of its rows (its TABLE_ROWS) and prints them next to ours (`--table`). The
document repeats them in "The tables" section, one Markdown table per paper table,
and in the example output under "Running". The drivers are the one source: every
driver is run with `--table` on an empty work directory (nothing is trained or read)
and every number it prints as the paper's must be in the document, for the same row,
written the same way; every number the document states as the paper's must be one the
driver prints. (That both equal the papers' text was checked by hand against the
papers; a wrong number in one place now shows up as a difference here.)

How the document's tables are read: a table belongs to the last driver
(`<name>_table<N>.sh`) named above it; a column whose header says "paper BLEU",
"paper params" or "paper speed" holds that field; a row is named by the backticked
name in its first cell, combined with a backticked `prefix.*` in the column header
(`*.base` under `zh-en.*` is `zh-en.base`; `vi-en.*` with `transformer` is
`vi-en.transformer`); a params cell with several `prefix.*` in its header holds one
value per prefix, separated by " / ". Significance marks (↑, ⇑, ‡) are not part of a
number. Song et al. print "-" for a fusion without extra parameters; the driver
writes it "+0".
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO, tool_env

DOC = os.path.join(REPO, "docs", "reproduce.md")
REPRO = os.path.join(REPO, "scripts", "reproduce")
DRIVERS = sorted(f for f in os.listdir(REPRO) if re.fullmatch(r"\w+_table\d+\.sh", f))
FIELDS = {"paper BLEU": "bleu", "paper params": "params", "paper speed": "speed"}
NUMBER = re.compile(r"[+-]?[0-9][0-9.]*[MK]?")
# The paper's "-" (no extra parameters, Song et al. 2019, Table 2) is the driver's "+0".
SAME = {"-": "+0"}


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_tables(lines):
    """(index of the header line, header cells, body rows) of every Markdown table."""
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip()):
            j = i + 2
            body = []
            while j < len(lines) and lines[j].startswith("|"):
                body.append(cells(lines[j]))
                j += 1
            yield i, cells(lines[i]), body
            i = j
        else:
            i += 1


def field_of(header):
    for words, field in FIELDS.items():
        if header.startswith(words):
            return field
    return None


def value_of(cell):
    """The number in a cell without its marks ('28.31 ⇑' -> '28.31'); '-' stays '-'."""
    cell = cell.strip()
    if cell == "-":
        return "-"
    m = NUMBER.match(cell)
    assert m, f"docs/reproduce.md: no number in the cell {cell!r}"
    return m.group(0)


def row_names(first_cell, header):
    """The driver rows one cell stands for: the first cell's backticked name combined
    with the header's `prefix.*` or system name (one name per prefix)."""
    row = re.findall(r"`([^`]+)`", first_cell)
    assert len(row) == 1, f"docs/reproduce.md: row {first_cell!r} names no single row"
    row = row[0]
    col = re.findall(r"`([^`]+)`", header)
    if row.startswith("*."):
        assert col and all(c.endswith(".*") for c in col), f"{first_cell!r} under {header!r}: no `prefix.*`"
        return [c[:-1] + row[2:] for c in col]
    if row.endswith(".*"):
        assert len(col) == 1, f"{first_cell!r} under {header!r}: no system name in the header"
        return [row[:-1] + col[0]]
    assert not col, f"{first_cell!r} is a full row name; the header {header!r} must not name rows"
    return [row]


def doc_numbers():
    """{(driver, row, field): value} of every number docs/reproduce.md labels the paper's."""
    lines = open(DOC, encoding="utf-8").read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith("## The tables"))
    end = next(i for i, l in enumerate(lines) if i > start and l.startswith("## "))
    out = {}
    for at, header, body in markdown_tables(lines[start:end]):
        above = "\n".join(lines[start:start + at])
        drivers = re.findall(r"`(\w+_table\d+\.sh)`", above)
        assert drivers, f"docs/reproduce.md: no driver named above the table {header}"
        driver = drivers[-1]
        for k, h in enumerate(header):
            field = field_of(h)
            if field is None:
                continue
            for row in body:
                names = row_names(row[0], h)
                values = row[k].split(" / ")
                assert len(values) == len(names), f"{driver} {row[0]} {h}: {row[k]!r} for {names}"
                for name, v in zip(names, values):
                    key = (driver, name, field)
                    assert key not in out, f"docs/reproduce.md states {key} twice"
                    out[key] = value_of(v)
    return out


def driver_table(driver, work_dir):
    p = subprocess.run(["bash", os.path.join(REPRO, driver), "--table", "--work-dir", str(work_dir)],
                       capture_output=True, text=True, env=tool_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout


def driver_numbers(driver, stdout):
    """{(driver, row, field): value} of the paper's numbers in a driver's table."""
    lines = stdout.splitlines()
    tables = list(markdown_tables(lines))
    assert len(tables) == 1, stdout
    _, header, body = tables[0]
    out = {}
    for row in body:
        for k, h in enumerate(header):
            field = {"paper BLEU": "bleu", "paper params": "params", "paper speed": "speed"}.get(h)
            if field and row[k] not in ("", "-"):
                out[(driver, row[0], field)] = row[k]
    return out


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("paper_numbers")
    return {d: driver_table(d, root / d) for d in DRIVERS}


def test_every_driver_is_read():
    assert set(DRIVERS) == {"yang2018_table4.sh", "xu2019_table1.sh", "xu2019_table2.sh", "song2019_table2.sh",
                            "song2019_table3.sh", "song2019_table4.sh", "dc_table1.sh", "dc_table2.sh"}


@pytest.mark.parametrize("driver", DRIVERS)
def test_doc_states_the_drivers_paper_numbers(driver, tables):
    printed = driver_numbers(driver, tables[driver])
    stated = {k: SAME.get(v, v) for k, v in doc_numbers().items() if k[0] == driver}
    assert printed, f"{driver} prints no paper number"
    missing = {k: v for k, v in printed.items() if k not in stated}
    assert not missing, f"docs/reproduce.md does not state these numbers {driver} prints as the paper's: {missing}"
    extra = {k: v for k, v in stated.items() if k not in printed}
    assert not extra, f"docs/reproduce.md states numbers as the paper's that {driver} does not print: {extra}"
    differ = {k: (stated[k], printed[k]) for k in printed if stated[k] != printed[k]}
    assert not differ, f"docs/reproduce.md vs {driver} (doc, driver): {differ}"


def test_doc_counts_every_row(tables):
    """The "rows" column of the first table of docs/reproduce.md is each driver's number of rows."""
    text = open(DOC, encoding="utf-8").read()
    for driver in DRIVERS:
        m = re.search(r"^\| `%s` \|.*\| (\d+) \|$" % re.escape(driver), text, re.M)
        assert m, driver
        rows = [r for r in markdown_tables(tables[driver].splitlines())][0][2]
        assert int(m.group(1)) == len(rows), driver


def test_example_output_is_the_drivers(tables):
    """The example table under "Running" (dc_table1.sh) shows the driver's rows as it prints them."""
    text = open(DOC, encoding="utf-8").read()
    running = text[text.index("## Running"):text.index("\nOptions:")]
    shown = [l for l in running.splitlines() if re.match(r"\| (transformer|enc-dc|dec-dc|full-dc) \|", l)]
    assert len(shown) >= 2, running
    printed = tables["dc_table1.sh"].splitlines()
    for line in shown:
        assert line in printed, f"docs/reproduce.md shows a row dc_table1.sh --table does not print: {line}"


def test_a_wrong_number_in_the_doc_is_found(monkeypatch, tmp_path, tables):
    """The check can fail: one changed digit in the document is reported."""
    text = open(DOC, encoding="utf-8").read()
    wrong = tmp_path / "reproduce.md"
    old = "| `enc-dc` | `--dc-mode enc` | 29.26 ‡ |"
    assert old in text
    wrong.write_text(text.replace(old, old.replace("29.26", "29.62")), encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "DOC", str(wrong))
    stated = doc_numbers()
    assert stated[("dc_table1.sh", "enc-dc", "bleu")] == "29.62"
    assert driver_numbers("dc_table1.sh", tables["dc_table1.sh"])[("dc_table1.sh", "enc-dc", "bleu")] == "29.26"
