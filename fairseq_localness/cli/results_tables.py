"""The tables of ``fairseq-localness-results``: the demo's and the reproduce drivers'
table (mean ± sd over seeds, the paired test's columns), their notes, the per-seed
table and TSV."""
import re
from typing import Dict, List, Optional

from fairseq_localness.cli.results_stats import phenomenon_order

# The reproduce drivers' BLEU kinds (--bleu), named as scripts/reproduce/results_table.py
# names them in the one-seed table.
METRIC_NAMES = {
    "nist": "NIST BLEU (mteval-v13a = sacreBLEU 13a)",
    "sacrebleu": "sacreBLEU",
    "multi-bleu": "multi-bleu (Moses-tok.)",
    "tok-compound": "tok. BLEU, compound split",
}


def fmt(summary: Dict, spec: str, multi: bool) -> str:
    """``mean ± sd`` (``mean`` alone for one value; with ``multi``, a single value of a
    table that has several seeds elsewhere is still just the value)."""
    if summary is None or summary["mean"] is None:
        return "-"
    text = format(summary["mean"], spec)
    if multi and summary["sd"] is not None:
        text += " ± " + format(summary["sd"], spec)
    return text


def _int(v) -> str:
    return "-" if v is None else "{:,}".format(int(round(v)))


def _p(p) -> str:
    if p is None:
        return "-"
    return "%.3f" % p if p >= 0.001 else "<0.001"


def test_cells(entry: Dict, multi: bool) -> List[str]:
    """Δ BLEU, p, verdict (and, with several seeds, the per-seed counts)."""
    c = entry["comparison"]
    if c is None:
        return ["-", "-", "baseline" if entry.get("_is_baseline") else "-"] + (["-"] if multi else [])
    cells = ["%+.2f" % c["delta_mean"], _p(c["pooled"]["p_value"]), c["pooled"]["verdict"]]
    if multi:
        cells.append("%d / %d of %d" % (c["seeds_better"], c["seeds_worse"], c["seeds_tested"])
                     if c["seeds_tested"] else "-")
    return cells


def _mark_baselines(result: Dict):
    bases = {e["baseline"] for e in result["systems"] if e["baseline"] and e["baseline"] != e["system"]}
    for e in result["systems"]:
        e["_is_baseline"] = e["system"] in bases


def demo_table(result: Dict, args) -> List[str]:
    systems = result["systems"]
    multi = any(len(e["seeds_done"]) > 1 for e in systems)
    phen = phenomenon_order(list(dict.fromkeys(p for e in systems for p in e["phenomena"])))
    bases = sorted({e["baseline"] for e in systems if e["baseline"] and e["baseline"] != e["system"]})
    base_name = bases[0] if len(bases) == 1 else "baseline"
    head = ["system", "arch", "params"] + (["seeds"] if multi else []) + ["BLEU"] + \
        [p.replace("_", " ") for p in phen] + ["train time (s)"]
    test_head = ["Δ BLEU", "p", f"vs {base_name}"] + (["seeds better / worse"] if multi else [])
    if bases:
        head += test_head
    align = ["---", "---"] + ["---:"] * (len(head) - 2)
    if bases:
        align[-len(test_head):] = ["---:", "---:", "---"] + (["---:"] if multi else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for e in systems:
        s = e["summary"]
        cells = [e["system"], e["meta"].get("arch", "-"), _int(s["params"]["mean"])]
        if multi:
            cells.append("%d" % len(e["seeds_done"]) if len(e["seeds_done"]) == len(e["seeds"])
                         else "%d of %d" % (len(e["seeds_done"]), len(e["seeds"])))
        cells.append(fmt(s["bleu"], ".2f", multi))
        cells += [fmt(e["phenomena"].get(p), ".1f", multi) for p in phen]
        cells.append(fmt(s["train_seconds"], ".1f", multi))
        if bases:
            cells += test_cells(e, multi)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def reproduce_table(result: Dict, args) -> List[str]:
    """The reproduce drivers' table over seeds: the columns of the one-seed table
    (``scripts/reproduce/results_table.py``: row, pair, metric, paper BLEU, our BLEU,
    delta, the extra column, parameters, speed), ours as mean ± sd over the seeds, with
    the number of seeds and the paired test against the row's baseline."""
    systems = result["systems"]
    multi = any(len(e["seeds"]) > 1 for e in systems)
    extra_kinds = sorted({e["meta"]["extra_metric"] for e in systems if e["meta"].get("extra_metric")})
    has_params = any(e["meta"].get("paper_params") for e in systems)
    has_speed = any(e["meta"].get("paper_speed") for e in systems)
    has_sig = args.significance and any(e["baseline"] for e in systems)
    head = ["row", "pair", "metric"] + (["seeds"] if multi else []) + ["paper BLEU", "our BLEU", "delta"]
    if extra_kinds:
        head += [" / ".join(METRIC_NAMES.get(k, k) for k in extra_kinds) + " (extra)"]
    if has_params:
        head += ["paper params", "our params"]
    if has_speed:
        head += ["paper speed", "our speed"]
    if has_sig:
        head += ["Δ vs. baseline", "p (vs. baseline)", "vs. baseline"] + (["seeds better / worse"] if multi else [])
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join("---" if h in ("row", "pair", "metric", "vs. baseline") else "---:" for h in head) + "|"]
    params = {e["system"]: e["summary"]["params"]["mean"] for e in systems}
    for e in systems:
        m, s = e["meta"], e["summary"]
        paper = m.get("paper_bleu", "-") or "-"
        cells = [e["system"], m.get("pair", "-"), METRIC_NAMES.get(m.get("metric", ""), m.get("metric", "-"))]
        failed = sum(1 for r in e["runs"] if r.get("failed"))
        if multi:
            cells.append("%d of %d" % (len(e["seeds_done"]), len(e["seeds"]))
                         + (", %d failed" % failed if failed else ""))
        cells += [paper, "failed" if failed and not e["seeds_done"] else fmt(s["bleu"], ".2f", multi)]
        cells.append("%+.2f" % (round(s["bleu"]["mean"], 2) - float(paper))
                     if s["bleu"]["mean"] is not None and paper != "-" else "-")
        if extra_kinds:
            cells.append(fmt(s["extra"], ".2f", multi) if m.get("extra_metric") else "-")
        if has_params:
            n, pp, base = params[e["system"]], m.get("paper_params", ""), e["baseline"]
            if n is None:
                mine = "-"
            elif pp.startswith("+") and base and params.get(base) is not None:
                d = int(round(n - params[base]))
                mine = ("+" if d >= 0 else "-") + _millions(abs(d))
            else:
                mine = _millions(int(round(n)))
                if _shared_embeddings_differ(m, n):
                    mine += " (shared emb.)"
            cells += [pp or "-", mine]
        if has_speed:
            cells += [m.get("paper_speed") or "-", fmt(s["ups"], ".2f", multi)]
        if has_sig:
            cells += test_cells(e, multi)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _millions(n: int) -> str:
    return "%.2fM" % (n / 1e6) if abs(n) >= 1e5 else "{:,}".format(n)


def _paper_millions(text: str) -> Optional[float]:
    """'88.0M' -> 88.0e6, '524K' -> 524e3; None for differences ('+0.4M') and others."""
    m = re.fullmatch(r"([0-9.]+)([MK])", text or "")
    return float(m.group(1)) * (1e6 if m.group(2) == "M" else 1e3) if m else None


def _shared_embeddings_differ(meta: Dict[str, str], ours: float) -> bool:
    """Our run shares one embedding matrix where the paper's count has separate ones, and
    the counts differ by more than 5% (the one-seed table's '(shared emb.)')."""
    paper = _paper_millions(meta.get("paper_params", ""))
    return meta.get("shares_embeddings") == "1" and bool(paper) and abs(ours - paper) > 0.05 * paper


def config_notes(systems: List[Dict]) -> List[str]:
    """Per configuration (the ``config`` column), as the one-seed table writes them: the
    paper's words on BLEU, the main and extra columns' BLEU, the test set, the training."""
    out, seen = [], set()
    for e in systems:
        m = e["meta"]
        if not m.get("config") or m["config"] in seen:
            continue
        seen.add(m["config"])
        n = sum(x["meta"].get("config") == m["config"] for x in systems)
        label = "%s (%d row%s)" % (m["config"], n, "s" if n > 1 else "")
        extra = ("; extra column: " + METRIC_NAMES.get(m["extra_metric"], m["extra_metric"])) \
            if m.get("extra_metric") else ""
        out.append(f"{label}: BLEU as the paper states it: \"{m.get('paper_metric', '')}\"; main column: "
                   f"{METRIC_NAMES.get(m.get('metric', ''), m.get('metric', '-'))}{extra}. "
                   f"Test set: {m.get('test', '-')}. Training: {m.get('training', '-')}.")
    return out


def notes(result: Dict, args, layout: str) -> List[str]:
    systems = result["systems"]
    multi = any(len(e["seeds"]) > 1 for e in systems)
    out = [""]
    if args.title:
        done = sum(1 for e in systems if e["seeds_done"])
        out.append(f"{args.title}. Our numbers: {done} of {len(systems)} rows have results ('-': not run yet)."
                   + (" delta = ours - paper." if layout == "reproduce" else ""))
    if multi:
        seeds = sorted({s for e in systems for s in e["seeds"]})
        out.append("Seeds %s: each cell is the mean ± the standard deviation over the seeds (n - 1 in the "
                   "denominator); every seed's numbers are in results.json and below." % ",".join(map(str, seeds)))
    if any(e["comparison"] for e in systems):
        out.append(
            "%s: mean minus the baseline's mean. p: paired bootstrap resampling (Koehn 2004) of the test "
            "sentences, %d resamples, %s; p as sacreBLEU's --paired-bs. 'better'/'worse' only where p < %g, "
            "else 'n.s.'.%s"
            % ("Δ vs. baseline" if layout == "reproduce" else "Δ BLEU", args.samples,
               ("the translations of all seeds pooled and each system's seeds resampled too, so the seed-to-seed "
                "spread counts" if multi and not args.fixed_seeds else
                "the translations of all seeds pooled" if multi else "one run per system"),
               args.alpha,
               " seeds better / worse: the seeds whose own run is significantly better / worse than the "
               "baseline's run with the same seed (the same test, per seed)." if multi else ""))
    if layout == "reproduce":
        out += config_notes(systems)
    if layout == "reproduce" and any(e["meta"].get("paper_speed") for e in systems):
        out.append("Speed: training updates per second (the paper's on its hardware; ours as trained here, "
                   "mean of fairseq's 'ups' per epoch).")
    if layout == "reproduce" and any((e["meta"].get("paper_params") or "").startswith("+") for e in systems):
        out.append("Params: for rows whose paper number starts with '+', ours is the difference from the row's "
                   "baseline too.")
    if layout == "reproduce" and any(e["summary"]["params"]["mean"] is not None
                                     and _shared_embeddings_differ(e["meta"], e["summary"]["params"]["mean"])
                                     for e in systems):
        out.append("(shared emb.): our run shares one embedding matrix between source, target and output "
                   "(--share-all-embeddings, fairseq's recipe for a joint vocabulary); the paper's count includes "
                   "separate source embeddings, hence the difference in parameters.")
    for e in systems:  # runs whose SLURM jobs failed (DIR/FAILED), with the reason
        for r in e["runs"]:
            if r.get("failed"):
                out.append("failed: %s%s: %s" % (e["system"], " seed %d" % r["seed"] if multi else "", r["failed"]))
    for note in args.note or []:
        out.append(note)
    for s in result["signatures"]:
        out.append(("sacreBLEU signature: " if layout == "reproduce" else "BLEU: sacrebleu ") + s)
    return out


def _has_extra(systems: List[Dict]) -> bool:
    return any(r.get("extra") is not None for e in systems for r in e["runs"])


def per_seed_table(result: Dict) -> List[str]:
    systems = result["systems"]
    phen = phenomenon_order(list(dict.fromkeys(p for e in systems for p in e["phenomena"])))
    extra = _has_extra(systems)
    tested = any(e["comparison"] for e in systems)
    head = ["system", "seed", "params", "BLEU"] + (["extra"] if extra else []) + \
        [p.replace("_", " ") for p in phen] + ["train time (s)", "updates", "ups"] + \
        (["Δ BLEU vs. baseline's seed", "p"] if tested else [])
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for e in systems:
        tests = {t["seed"]: t for t in (e["comparison"] or {}).get("per_seed", [])}
        for r in e["runs"]:
            if not r["done"]:
                blank = ["-"] * (len(head) - 2)
                if r.get("failed"):
                    blank[head.index("BLEU") - 2] = "failed"
                lines.append("| %s | %d | %s |" % (e["system"], r["seed"], " | ".join(blank)))
                continue
            t = tests.get(r["seed"])
            cells = [e["system"], str(r["seed"]), _int(r.get("params")), "%.2f" % r["bleu"]]
            if extra:
                cells.append("%.2f" % r["extra"] if r.get("extra") is not None else "-")
            cells += ["%.1f" % r["phenomena"][p] if r["phenomena"].get(p) is not None else "-" for p in phen]
            cells += ["%.1f" % r["train_seconds"] if r.get("train_seconds") is not None else "-",
                      _int(r.get("updates")), "%.2f" % r["ups"] if r.get("ups") is not None else "-"]
            if tested:
                cells += ["%+.2f" % t["delta"] if t else "-", _p(t["p_value"]) if t else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def per_seed_tsv(result: Dict) -> str:
    systems = result["systems"]
    phen = phenomenon_order(list(dict.fromkeys(p for e in systems for p in e["phenomena"])))
    meta = list(dict.fromkeys(k for e in systems for k in e["meta"]))
    extra = _has_extra(systems)
    cols = ["system", "seed"] + meta + ["params", "bleu"] + (["extra"] if extra else []) + phen + \
        ["train_seconds", "updates", "ups", "p_vs_baseline_seed"]
    out = ["\t".join(cols)]
    for e in systems:
        tests = {t["seed"]: t for t in (e["comparison"] or {}).get("per_seed", [])}
        for r in e["runs"]:
            def v(x, spec):
                return "" if x is None else format(x, spec)
            row = [e["system"], str(r["seed"])] + [e["meta"].get(k, "") for k in meta]
            row += [v(r.get("params"), ".0f"), v(r.get("bleu"), ".2f")]
            row += [v(r.get("extra"), ".2f")] if extra else []
            row += [v(r["phenomena"].get(p), ".2f") for p in phen]
            row += [v(r.get("train_seconds"), ".1f"), v(r.get("updates"), ".0f"), v(r.get("ups"), ".3f"),
                    v(tests[r["seed"]]["p_value"] if r["seed"] in tests else None, ".4f")]
            out.append("\t".join(row))
    return "\n".join(out) + "\n"


def render(result: Dict, args) -> str:
    _mark_baselines(result)
    table = demo_table(result, args) if args.layout == "demo" else reproduce_table(result, args)
    text = table + notes(result, args, args.layout)
    if any(len(e["seeds"]) > 1 for e in result["systems"]):
        text += ["", "Per seed" + (" (p: the seed's run against the baseline's run with the same seed):"
                                   if any(e["comparison"] for e in result["systems"]) else ":"), ""]
        text += per_seed_table(result)
    for e in result["systems"]:
        e.pop("_is_baseline", None)
    return "\n".join(text) + "\n"
