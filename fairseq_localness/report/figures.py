"""The page's figures (matplotlib, PNG files beside the page in ``WORK/report/``):
each row's learning curves with its seeds overlaid, and the paper's figures that the
analysis tools have made under ``WORK/analysis/``.

A figure's file name carries a hash of what it is drawn from (each log's path, size and
modification time), so a page written again (every ``--status``) redraws only the rows
whose logs changed; files of older pages are removed.
"""
import hashlib
import os
import re
from typing import Dict, List, Optional

from fairseq_localness.atomic import replacing
from fairseq_localness.analysis.plotting import pyplot
from fairseq_localness.report.collect import Row, Work

FIG_DIR = "report"   # in WORK, beside report.html
DPI = 96


def safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)


def series(log, kind: str, metric: str):
    pts = sorted((r["num_updates"], r[metric]) for r in log.of_kind(kind) if metric in r)
    return [p[0] for p in pts], [p[1] for p in pts]


def curve_panels(row: Row) -> List[str]:
    """The panels a row's logs can fill: loss, BLEU (where the run validates on it), lr."""
    logs = [r.log for r in row.runs if r.log is not None]
    panels = []
    if any(r.get("loss") is not None for log in logs for r in log.records):
        panels.append("loss")
    if any("bleu" in r for log in logs for k in log.valid_subsets for r in log.of_kind(k)):
        panels.append("BLEU")
    if any("lr" in r for log in logs for r in log.records):
        panels.append("learning rate")
    return panels


def draw_curves(row: Row, path: str, panels: List[str]):
    """One PNG: a panel per quantity, a line per seed (and per train/valid for the loss).
    Laid out by fixed margins, with few ticks and one legend (a figure a few tenths of
    a second: the page of 32 rows stays within its seconds)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.1 * len(panels), 2.3), squeeze=False)
    fig.subplots_adjust(left=0.25 / len(panels), right=0.99, bottom=0.2, top=0.88, wspace=0.3)
    axes = dict(zip(panels, axes[0]))
    for k, run in enumerate(r for r in row.runs if r.log is not None):
        log, color = run.log, f"C{k % 10}"
        label = f"seed {run.seed}" if run.seed is not None else "run"
        subset = (log.valid_subsets or ["valid"])[0]
        train_kind = "train_inner" if log.of_kind("train_inner") else "train"
        for panel, kind, metric, style, text in (("loss", train_kind, "loss", "-", " train"),
                                                 ("loss", subset, "loss", "--", " valid"),
                                                 ("BLEU", subset, "bleu", "-", ""),
                                                 ("learning rate", train_kind, "lr", "-", "")):
            xs, ys = series(log, kind, metric)
            if panel in axes and xs:
                axes[panel].plot(xs, ys, style, color=color, lw=1, marker="." if len(xs) < 30 else None,
                                 label=label + text)
    for name, ax in axes.items():
        ax.set_title(name + (" (valid)" if name == "BLEU" else ""), fontsize=8)
        ax.set_xlabel("updates", fontsize=7, labelpad=1)
        ax.locator_params(nbins=4)
        ax.tick_params(labelsize=6, pad=1)
    first = next(iter(axes.values()))
    if first.get_legend_handles_labels()[0]:
        first.legend(fontsize=5, loc="upper right", frameon=False)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _draw(job):
    row, path, panels = job
    with replacing(path, ".png") as tmp:
        draw_curves(row, tmp, panels)


def draw_all(jobs):
    """Draw the figures, in two processes where there are many and two cores (matplotlib
    draws in one thread)."""
    workers = min(2, os.cpu_count() or 1)
    if len(jobs) < 8 or workers < 2:
        for job in jobs:
            _draw(job)
        return
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pool.map(_draw, jobs, chunksize=max(1, len(jobs) // (4 * workers)))


def fingerprint(paths: List[str]) -> str:
    h = hashlib.sha1()
    for p in paths:
        st = os.stat(p)
        h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:12]


def curves(work: Work) -> Dict[str, Optional[str]]:
    """{row: its learning curves' PNG, relative to WORK} for the rows with training
    records; drawn again only where a log changed."""
    out_dir = os.path.join(work.path, FIG_DIR)
    os.makedirs(out_dir, exist_ok=True)
    made, keep, todo = {}, set(), []
    for row in work.rows:
        panels = curve_panels(row)
        if not panels:
            continue
        name = f"curves-{safe(row.name)}-{fingerprint([r.log_path for r in row.runs if r.log is not None])}.png"
        path = os.path.join(out_dir, name)
        if not os.path.exists(path):
            todo.append((row, path, panels))
        made[row.name] = f"{FIG_DIR}/{name}"
        keep.add(name)
    draw_all(todo)
    for old in os.listdir(out_dir):
        if old.startswith("curves-") and old not in keep:
            os.remove(os.path.join(out_dir, old))
    return made


# The papers' figures that fairseq-localness-analysis reproduces: per driver (the
# reproduce script's name, or the demo), (figure, what it shows, the tool (and the
# beginning of its PNG's name, where it makes several), the architectures of the rows
# it needs; None: any row).
PAPER_FIGURES = {
    "yang2018": [("Yang et al. 2018, Fig. 3", "the predicted Gaussian windows per layer", "windows",
                  {"localness_transformer"}),
                 ("Yang et al. 2018, Fig. 4", "BLEU gain over the baseline by n-gram order",
                  "bleu_breakdown/bleu_by_ngram", None)],
    "xu2019": [("Xu et al. 2019, Fig. 3 and 4", "the local/global gate per layer and per POS tag", "gates",
                {"hybrid_transformer"}),
               ("Xu et al. 2019, Tables 3-4", "SentEval probing tasks", "probing", None)],
    "song2019": [("Song et al. 2019, Fig. 4", "development BLEU and loss during training", "learning_curves", None),
                 ("Song et al. 2019, Fig. 5", "each branch's attention as a heatmap", "heatmaps",
                  {"hysan_transformer"})],
    "dc": [("Ampomah et al. 2021, Fig. 4", "JS divergence between the DC module's contexts", "divergence",
            {"dc_transformer"}),
           ("Ampomah et al. 2021, Fig. 5", "BLEU by source sentence length", "bleu_breakdown/bleu_by_length", None),
           ("Ampomah et al. 2021, Table 4", "SentEval probing tasks", "probing", None)],
}
PAPER_FIGURES["demo"] = [f for key in ("yang2018", "xu2019", "song2019", "dc") for f in PAPER_FIGURES[key]]
ANALYSIS_DIR = "analysis"


def arch_of(run_dir: str) -> Optional[str]:
    """The architecture a run was trained with, from its SYSTEM file (the reproduce
    drivers write one per run; the demo's rows carry theirs in results.json)."""
    try:
        with open(os.path.join(run_dir, "SYSTEM"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("arch "):
                    return line.split()[1]
    except OSError:
        pass
    return None


def run_files(run) -> Dict[str, str]:
    """A finished run's files the analysis tools read: its checkpoint (the averaged or
    the best one), its hypotheses, its log, and its data (the binarized folder from the
    log's configuration; its raw/ and bpe/ beside it, as prepare_data.sh lays them)."""
    files = {"dir": run.dir, "log": run.log_path, "hyp": os.path.join(run.dir, "eval", "hyp.detok")}
    try:
        names = sorted(os.listdir(run.dir))
    except OSError:
        names = []
    ckpt = [n for n in names if n.startswith("checkpoint_avg") and n.endswith(".pt")] or \
        [n for n in names if n == "checkpoint_best.pt"]
    files["ckpt"] = os.path.join(run.dir, ckpt[0]) if ckpt else ""
    files["data"] = ""
    if run.log_path:
        with open(run.log_path, encoding="utf-8", errors="replace") as f:
            m = re.search(r"'data': '([^']+)'", f.readline())
        files["data"] = m.group(1) if m else ""
    return files


def commands(tool: str, rows: List[Row], work: Work) -> List[List[str]]:
    """The commands that make ``tool``'s figure from these finished rows (those whose
    data is the first row's: one test set per figure), into WORK/analysis/<tool>."""
    runs = [(row, next(r for r in row.runs if r.state == "done")) for row in rows]
    files = [(row, run_files(run)) for row, run in runs]
    data = files[0][1]["data"]
    files = [(row, f) for row, f in files if f["data"] == data]
    if not data:
        return []
    pair = (files[0][0].entry.get("meta", {}).get("pair") or "-").split("-")
    src, tgt = (pair + ["", ""])[:2]
    root, out = os.path.dirname(data), os.path.join(work.path, ANALYSIS_DIR, tool)
    a = ["fairseq-localness-analysis", tool]
    paths = [x for _, f in files if f["ckpt"] for x in ("--path", f["ckpt"])]
    labels = ["--labels"] + [row.name for row, f in files if f["ckpt"]]
    if tool in ("windows", "divergence", "heatmaps"):
        extra = ["--split", "test", "--ids", "0", "--layer", "1"] if tool == "heatmaps" else []
        return [a + [data] + paths + labels + extra + ["--output-dir", out]] if paths else []
    if tool == "gates":
        pos = os.path.join(out, "valid.pos")
        return [["fairseq-localness-analysis", "pos_tags", "--input", os.path.join(root, "raw", f"valid.{src}"),
                 "--output", pos, "--words-output", os.path.join(out, "valid.words")],
                a + [data] + paths[:2] + ["--pos-tags", pos, "--pos-words", os.path.join(out, "valid.words"),
                                          "--output-dir", out]] if paths else []
    if tool == "bleu_breakdown":
        base = [row.entry.get("baseline") for row, _ in files if row.entry.get("baseline")]
        hyps = [x for row, f in files for x in ("--hyp", f"{row.name}={f['hyp']}")]
        return [a + ["--ref", os.path.join(root, "raw", f"test.{tgt}"), "--src", os.path.join(root, "bpe", f"test.{src}")]
                + hyps + (["--baseline", base[0]] if base else []) + ["--output-dir", out]]
    if tool == "learning_curves":
        logs = [x for row in rows for r in row.runs if r.log_path for x in ("--log", f"{row.name}={r.log_path}")]
        return [a + logs + ["--train-loss", "--output-dir", out]]
    if tool == "probing":
        return [a + [data] + paths + labels + ["--senteval-dir", "SENTEVAL_DATA", "--output-dir", out]] \
            if paths else []
    return []


def paper_figures(work: Work, driver: str) -> List[Dict]:
    """Per figure of the driver's paper: the PNGs of WORK/analysis/<tool>/ (relative to
    WORK), the rows it needs that ran and those that did not, and the commands that
    make it from the rows that ran."""
    key = "demo" if driver == "demo" else re.sub(r"_table\d+$", "", driver or "")
    figures = []
    for label, what, spec, archs in PAPER_FIGURES.get(key, []):
        tool, _, prefix = spec.partition("/")
        folder = os.path.join(work.path, ANALYSIS_DIR, tool)
        pngs = sorted(f for f in os.listdir(folder) if f.endswith(".png") and f.startswith(prefix)) \
            if os.path.isdir(folder) else []
        needed, ran = [], []
        for row in work.rows:
            arch = row.entry.get("meta", {}).get("arch") or next(
                (a for a in (arch_of(r.dir) for r in row.runs) if a), None)
            # (a named architecture, e.g. localness_transformer_wmt_en_de, is of its model's family)
            if archs is None or (arch and any(arch == a or arch.startswith(a + "_") for a in archs)):
                needed.append(row)
                if row.state == "done":
                    ran.append(row)
        figures.append({"label": label, "what": what, "tool": tool,
                        "pngs": [f"{ANALYSIS_DIR}/{tool}/{p}" for p in pngs],
                        "needed": [r.name for r in needed], "ran": [r.name for r in ran],
                        "commands": commands(tool, ran, work) if ran and not pngs else []})
    return figures
