"""The HTML of the page: one file, its style inline, no script, font, stylesheet or
image from elsewhere (the figures are PNG files beside it, linked relatively), readable
from a phone's width (the table scrolls sideways in its box) to a wide screen."""
import html
import os
import re
import shlex
import time
from typing import Dict, List, Optional

from fairseq_localness.report.collect import Row, Work

STYLE = """
:root { color-scheme: light; --paper: #6b4e00; --ours: #0b4f8a; --muted: #555; }
* { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; margin: 0;
       color: #1b1b1b; background: #fff; }
main { max-width: 1400px; margin: 0 auto; padding: 12px 16px 40px; }
h1 { font-size: 1.35em; margin: .4em 0; } h2 { font-size: 1.15em; margin: 1.6em 0 .5em;
border-bottom: 1px solid #ddd; } h3 { font-size: 1em; margin: 1.2em 0 .3em; }
dl.run { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
dl.run dt { font-weight: 600; } dl.run dd { margin: 0; overflow-wrap: anywhere; }
code, pre { font: 13px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
pre { background: #f5f5f5; padding: 8px 10px; overflow-x: auto; white-space: pre-wrap; overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 8px; border-bottom: 1px solid #e5e5e5; text-align: right; vertical-align: top;
         white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.text, th.text { text-align: left; } td.wrap { white-space: normal; min-width: 16em; max-width: 26em; }
.v { display: block; } .v small { color: var(--muted); font-size: 10px; margin-right: 3px; }
.ours { color: var(--ours); font-weight: 600; } .paper { color: var(--paper); }
.state { display: inline-block; padding: 0 6px; border-radius: 8px; font-size: 12px; }
.state-done { background: #e3f4e1; } .state-failed, .state-unreadable { background: #fbe0e0; }
.state-running { background: #fff3cd; } .state-queued, .state-stopped, .state-not-run { background: #eee; }
.better { color: #11772b; } .worse { color: #a11; }
.links a { margin-right: 6px; }
.curves { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 540px), 1fr)); gap: 0 16px; }
figure { margin: .5em 0 1.2em; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { font-size: 13px; color: var(--muted); }
.why { color: #a11; overflow-wrap: anywhere; }
ul.notes { font-size: 13px; color: #333; padding-left: 1.2em; }
@media (max-width: 640px) { body { font-size: 14px; } main { padding: 8px; }
  dl.run { grid-template-columns: 1fr; } dl.run dt { margin-top: 6px; } }
"""
MARK = {"better": "▲ better", "worse": "▼ worse", "n.s.": "n.s."}
NUMBER = re.compile(r"^[-+<]?[\d.,]+")  # a cell that is a number (right-aligned)


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def href(work: Work, path: str) -> str:
    """A link relative to the page (percent-encoded), so that the folder can be moved."""
    from urllib.parse import quote

    rel = os.path.relpath(path, work.path) if os.path.isabs(path) else path
    return quote(rel.replace(os.sep, "/"))


def state_badge(state: str, text: Optional[str] = None) -> str:
    return f'<span class="state state-{esc(state.replace(" ", "-"))}">{esc(text or state)}</span>'


def row_state_text(row: Row) -> str:
    n = len(row.runs)
    if n <= 1:
        return row.state
    counts = {}
    for r in row.runs:
        counts[r.state] = counts.get(r.state, 0) + 1
    return ", ".join(f"{c} {s}" for s, c in counts.items())


def columns(header: List[str]):
    """The table's columns: results.md's, a paper's value and ours in one cell where
    both are there ('paper X' + 'our X')."""
    cols, used = [], set()
    for h in header:
        if h in used:
            continue
        if h.startswith("our ") and "paper " + h[4:] in header:
            cols.append(("pair", h[4:], ["paper " + h[4:], h]))
            used.update(["paper " + h[4:], h])
        elif h.startswith("paper ") and "our " + h[6:] in header:
            cols.append(("pair", h[6:], [h, "our " + h[6:]]))
            used.update([h, "our " + h[6:]])
        else:
            cols.append(("one", h, [h]))
            used.add(h)
    return cols


def significance_cell(row: Row, cell: Optional[str] = None, col: str = "") -> str:
    """The mark of the test against the row's baseline (▲ better, ▼ worse, n.s.); in
    results.md's verdict column (``cell``, kept as it is) or with Δ and p."""
    data = f' data-col="{esc(col)}"' if col else ""
    c = row.entry.get("comparison")
    pooled = (c or {}).get("pooled") or {}
    verdict, p = pooled.get("verdict"), pooled.get("p_value")
    if verdict is None:
        text = cell if cell is not None else ("baseline" if row.entry.get("_is_baseline") else "-")
        return f'<td class="text"{data}>{esc(text)}</td>'
    mark = {"better": "▲ ", "worse": "▼ "}.get(verdict, "")
    if cell is not None:
        return f'<td class="text sig {esc(verdict.replace(".", ""))}" data-verdict="{esc(verdict)}"{data}>' \
               f'<small>{mark}</small>{esc(cell)}</td>'
    delta = c.get("delta_mean")
    detail = (f" (Δ {delta:+.2f} vs {esc(c.get('baseline', ''))}" if delta is not None else " (") + \
        (f", p {p:.3f})" if p is not None and p >= 0.001 else ", p < 0.001)")
    return f'<td class="text sig {esc(verdict.replace(".", ""))}" data-verdict="{esc(verdict)}">' \
           f'{esc(MARK.get(verdict, verdict))}{detail}</td>'


def links(work: Work, row: Row) -> str:
    out = []
    for run in row.runs:
        tag = f"seed {run.seed}: " if len(row.runs) > 1 else ""
        parts = []
        for label, title, path in (("log", "train.log", os.path.join(run.dir, "train.log")),
                                   ("checkpoints", "the run's folder", run.dir),
                                   ("hyp", "hypotheses", os.path.join(run.dir, "eval", "hyp.detok")),
                                   ("config", "what the run was trained with", os.path.join(run.dir, "SYSTEM"))):
            if os.path.exists(path):
                parts.append(f'<a href="{href(work, path)}" title="{title}">{label}</a>')
        if parts:
            out.append(tag + " ".join(parts))
    config = row.entry.get("meta", {}).get("config")
    repo = work.info.get("repo")
    if config and repo and os.path.isfile(os.path.join(repo, "configs", "papers", config + ".sh")):
        out.append(f'<a href="{href(work, os.path.join(repo, "configs", "papers", config + ".sh"))}">{esc(config)}.sh</a>')
    return "<br>".join(out) or "-"


def table(work: Work, figures: Dict[str, str]) -> str:
    header = work.header or ["row"]
    cols = columns(header[1:])
    head = ['<th class="text">' + esc(header[0]) + "</th>", '<th class="text">status</th>']
    for kind, title, _ in cols:
        if kind == "pair":
            head.append(f'<th>{esc(title)}<br><small><span class="ours">ours</span> · '
                        f'<span class="paper">paper\'s</span></small></th>')
        else:
            numeric = any(NUMBER.match(row.cells.get(title, "")) for row in work.rows)
            head.append(f'<th class="{"" if numeric else "text"}">{esc(title)}</th>')
    # the significance mark: in results.md's verdict column where it has one ('vs. baseline',
    # 'vs transformer'), else in a column of its own
    verdict_col = next((h for h in header[1:] if h.startswith("vs")), None)
    head += ([] if verdict_col else ['<th class="text">significance</th>']) + ['<th class="text">files</th>']
    lines = ["<tr>" + "".join(head) + "</tr>"]
    for row in work.rows:
        name = esc(row.name)
        anchor = f' <a href="#curves-{name}">curves</a>' if row.name in figures else ""
        cells = [f'<td class="text"><b>{name}</b>{anchor}</td>',
                 f'<td class="text" data-state="{esc(row.state)}">{state_badge(row.state, row_state_text(row))}</td>']
        for kind, title, hs in cols:
            if kind == "pair":
                paper, ours = (row.cells.get(h, "-") for h in hs)
                cells.append(f'<td><span class="v ours" data-col="{esc(hs[1])}"><small>ours</small>{esc(ours)}</span>'
                             f'<span class="v paper" data-col="{esc(hs[0])}"><small>paper</small>{esc(paper)}</span>'
                             "</td>")
            elif hs[0] == verdict_col:
                cells.append(significance_cell(row, row.cells.get(hs[0], "-"), hs[0]))
            else:
                value = row.cells.get(hs[0], "-")
                numeric = bool(NUMBER.match(value))
                cls = "" if numeric else "text wrap" if len(value) > 48 else "text"
                cells.append(f'<td class="{cls}" data-col="{esc(hs[0])}">{esc(value)}</td>')
        if not verdict_col:
            cells.append(significance_cell(row))
        cells.append(f'<td class="text links">{links(work, row)}</td>')
        lines.append(f'<tr id="row-{name}" data-row="{name}">' + "".join(cells) + "</tr>")
    return '<div class="scroll"><table id="results">\n' + "\n".join(lines) + "\n</table></div>"


def problems(work: Work) -> str:
    items = []
    for row in work.rows:
        for run in row.runs:
            if run.state in ("failed", "unreadable"):
                seed = f" seed {run.seed}" if len(row.runs) > 1 else ""
                tail = (f"<br>its log ends: <code>{esc(run.last_line)}</code>" if run.last_line else "")
                items.append(f'<li data-row="{esc(row.name)}">{state_badge(run.state)} <b>{esc(row.name)}</b>{seed}: '
                             f'<span class="why">{esc(run.why)}</span>{tail}</li>')
    out = []
    if items:
        out.append("<h3>Failed and unreadable</h3><ul>" + "".join(items) + "</ul>")
    waiting = [f'<li>{state_badge(s)} {esc(", ".join(r.name for r in work.rows if r.state == s))}</li>'
               for s in ("running", "queued", "stopped", "not run") if any(r.state == s for r in work.rows)]
    if waiting:
        out.append("<h3>Not finished</h3><ul>" + "".join(waiting) + "</ul>")
    return "\n".join(out)


def run_section(work: Work, now: float) -> str:
    info = work.info
    done = [r for row in work.rows for r in row.runs if r.state == "done"]
    total = sum(len(row.runs) for row in work.rows)
    seeds_done = sorted({r.seed for r in done if r.seed is not None})
    started = info.get("started_epoch")
    ends = [os.path.getmtime(p) for p in (os.path.join(work.path, "results.md"), os.path.join(work.path, "results.json"))
            if os.path.exists(p)]
    busy = any(row.state in ("running", "queued") for row in work.rows)
    wall = "-"
    if started:
        end = now if busy or not ends else max(ends)
        secs = max(0, int(end - started))
        wall = f"{secs // 3600} h {secs % 3600 // 60:02d} min {secs % 60:02d} s" + (" so far" if busy else "")
    items = [
        ("driver", esc(" — ".join(x for x in (info.get("driver"), work.title) if x) or "-")),
        ("command", f"<code>{esc(info.get('command', '-'))}</code>"),
        ("commit", esc(info.get("commit", "-"))),
        ("started", esc(info.get("started", "-"))),
        ("hardware", esc(info.get("hardware", "-"))),
        ("wall time", esc(wall)),
        ("seeds", esc(f"{len(seeds_done)} of {len(work.seeds) or 1}" + (f" ({' '.join(map(str, work.seeds))})"
                                                                      if work.seeds else ""))),
        ("runs", esc(f"{len(done)} of {total} done")),
    ]
    return '<dl class="run">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>"
                                        for k, v in items) + "</dl>"


def curves_section(work: Work, figures: Dict[str, str]) -> str:
    parts, empty = [], []
    for row in work.rows:
        name = esc(row.name)
        if row.name not in figures and row.state != "unreadable":
            empty.append(f'<span id="curves-{name}">{name}</span>')
        elif row.name in figures:
            seeds = [r.seed for r in row.runs if r.log is not None]
            caption = "train and valid loss, valid BLEU where the run validates on it, learning rate; against " \
                      "updates" + (f"; seeds {', '.join(map(str, seeds))} overlaid" if len(seeds) > 1 else "")
            parts.append(f'<figure id="curves-{name}"><h3>{name}</h3><img src="{esc(figures[row.name])}" '
                         f'alt="learning curves of {name}"><figcaption>{esc(caption)}</figcaption>'
                         "</figure>")
        else:
            why = next(r.why for r in row.runs if r.state == "unreadable")
            parts.append(f'<p id="curves-{name}"><b>{name}</b>: unreadable ({esc(why)})</p>')
    text = '<div class="curves">' + "\n".join(parts) + "</div>"
    if empty:
        text += "<p>No training records yet: " + ", ".join(empty) + ".</p>"
    return text


def paper_section(work: Work, paper: List[Dict], driver: str) -> str:
    if not paper:
        return "<p>This table's paper has no figure that fairseq-localness-analysis reproduces.</p>"
    parts = []
    for f in paper:
        head = f"<h3>{esc(f['label'])}: {esc(f['what'])}</h3>"
        if f["pngs"]:
            imgs = "".join(f'<figure><img src="{esc(p)}" alt="{esc(f["label"])}">'
                           f'<figcaption>{esc(p)}</figcaption></figure>' for p in f["pngs"])
            parts.append(head + imgs)
            continue
        missing = [n for n in f["needed"] if n not in f["ran"]]
        text = []
        if missing:
            text.append(f"It needs rows that did not run: {esc(', '.join(missing))}.")
        if not f["needed"]:
            text.append("None of this table's rows has the architecture it reads.")
        if f["ran"]:
            text.append(f"Not made yet. From the rows that ran ({esc(', '.join(f['ran']))}) "
                        + ("these commands make it (their options: docs/analysis.md), and this page then shows it:"
                           if f["commands"] else "fairseq-localness-analysis makes it (docs/analysis.md)."))
        cmds = "".join(f"<pre>{esc(shlex.join(c))}</pre>" for c in f["commands"])
        parts.append(head + "<p>" + " ".join(text) + "</p>" + cmds)
    return "\n".join(parts)


def rerun_section(work: Work) -> str:
    info = work.info
    cmds = []
    if info.get("command"):
        cmds.append(("the run (it continues where it stopped; finished steps are skipped)", info["command"]))
    driver_path = info.get("driver_path")
    if driver_path:
        base = " ".join(x for x in (shlex.quote(driver_path), info.get("table_args", ""),
                                    "--work-dir", shlex.quote(work.path)) if x)
        cmds.append(("the table from the results so far", base + " --table"))
        if os.path.isdir(os.path.join(work.path, "slurm")):
            cmds.append(("the jobs of the --slurm graph (and this page again)", base + " --status"))
    cmds.append(("this page", shlex.join(["fairseq-localness-report", work.path])))
    cmds.append(("every metric of every run (where tensorboard is installed)",
                 shlex.join(["tensorboard", "--logdir", work.path])))
    return "".join(f"<p>{esc(what)}:</p><pre>{esc(cmd)}</pre>" for what, cmd in cmds)


def render(work: Work, figures: Dict[str, str], paper: List[Dict], driver: str, now: float) -> str:
    for row in work.rows:  # (which rows are some row's baseline)
        row.entry["_is_baseline"] = any(r.entry.get("baseline") == row.name and r is not row for r in work.rows)
    notes = "".join(f"<li>{esc(n)}</li>" for n in work.notes)
    written = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(work.title)}</title>
<style>{STYLE}</style>
</head>
<body>
<main>
<h1>{esc(work.title)}</h1>
<p>Written {esc(written)} by fairseq-localness-report from <code>{esc(work.path)}</code>.</p>
<h2 id="run">The run</h2>
{run_section(work, now)}
<h2 id="table">The table</h2>
{table(work, figures)}
{problems(work)}
<ul class="notes">{notes}</ul>
<h2 id="curves">Learning curves</h2>
{curves_section(work, figures)}
<h2 id="figures">The paper's figures</h2>
{paper_section(work, paper, driver)}
<h2 id="rerun">How to rerun this</h2>
{rerun_section(work)}
</main>
</body>
</html>
"""
