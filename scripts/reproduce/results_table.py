#!/usr/bin/env python3
"""The Markdown table of a reproduce script: the paper's numbers next to ours, from
the result files that exist. Used by scripts/reproduce/common.sh (print_table).

    results_table.py --title TITLE [--tests "paired-bs compare-mt"] [--seed N] [--out FILE] < rows.tsv

rows.tsv: a header line, then one tab-separated line per row with the columns of
COLUMNS (paths of result files that may not exist yet; empty fields allowed). Columns
of the table:

- row, pair; metric: the main column's BLEU, the metric the paper names (its own
  words are in the notes under the table); paper BLEU, our BLEU, delta;
- an extra, labelled column (e.g. tokenized BLEU with compound splitting) where a
  row's configuration asks for one;
- paper params, our params (fairseq's count from train.log; for a paper number
  '+X', the difference from the row's baseline; '(shared emb.)' where the run shares
  one embedding matrix across source, target and output and the paper's count, with
  separate embeddings, differs by more than 5%);
- paper speed, our speed (fairseq's mean updates per second over the epochs);
- p-values of the significance tests run against the row's baseline.

Under the table: how many rows have results; per configuration the paper's words on
BLEU and what the columns report, the test set and the training (fixed updates and
checkpoint averaging, or early stopping on development BLEU); the sacreBLEU
signatures.

With --out, the table's numbers are also written to results.json beside it, in the
layout of fairseq-localness-results' results.json (one run per row: "systems", each with
its "meta", "runs", "summary" and "comparison"), which fairseq-localness-report reads.
"""
import argparse
import csv
import json
import os
import re
import sys

COLUMNS = ("name", "pair", "paper_bleu", "kind", "extra", "score", "extra_score", "sacrebleu", "paper_params",
           "paper_speed", "log", "baseline", "compare_mt", "paired_bs", "config", "paper_metric", "test",
           "training", "shares_embeddings", "arch")
KIND = {
    "nist": "NIST BLEU (mteval-v13a = sacreBLEU 13a)",
    "sacrebleu": "sacreBLEU",
    "multi-bleu": "multi-bleu (Moses-tok.)",
    "tok-compound": "tok. BLEU, compound split",
}
TESTS = {"paired-bs": ("p (paired bootstrap)", "paired_bs"), "compare-mt": ("p (compare-mt)", "compare_mt")}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def params_of(log):
    try:
        text = open(log, errors="replace").read()
    except OSError:
        return None
    m = re.findall(r"num\. shared model params: ([0-9,]+)", text)
    return int(m[-1].replace(",", "")) if m else None


# fairseq's updates per second in a log record: simple format ('ups 2.5', 'ups=2.5') or
# JSON, as train.sh logs ('"train_ups": "2.5"', '"ups": "2.5"' in train_inner)
UPS = re.compile(r'(?:\b|_)ups"?(?: |=|": ?"?)([0-9.]+)')


def speed_of(log):
    """Updates per second, mean over the epoch summaries (train_inner if none)."""
    try:
        lines = open(log, errors="replace").read().splitlines()
    except OSError:
        return None
    ups = [float(m.group(1)) for l in lines if "| train |" in l for m in [UPS.search(l)] if m]
    if not ups:
        ups = [float(m.group(1)) for l in lines if "train_inner" in l for m in [UPS.search(l)] if m]
    return sum(ups) / len(ups) if ups else None


def p_value(obj, name=None):
    """The p-value of `name` against the baseline in a significance file (compare-mt's
    "comparisons", or paired_bs.json's "p_value"), else the first p-value found."""
    if isinstance(obj, dict) and name is not None:
        for c in obj.get("comparisons") or []:
            if isinstance(c, dict) and c.get("system") == name and isinstance(c.get("p_value"), (int, float)):
                return c["p_value"]
    if isinstance(obj, dict):
        for k, v in obj.items():
            if re.fullmatch(r"p(_?value)?", k, re.I) and isinstance(v, (int, float)):
                return v
        for v in obj.values():
            p = p_value(v)
            if p is not None:
                return p
    elif isinstance(obj, list):
        for v in obj:
            p = p_value(v)
            if p is not None:
                return p
    return None


def millions(n):
    return "%.2fM" % (n / 1e6) if abs(n) >= 1e5 else "{:,}".format(n)


def paper_millions(text):
    """'88.0M' -> 88.0e6, '524K' -> 524e3; None for differences ('+0.4M') and others."""
    m = re.fullmatch(r"([0-9.]+)([MK])", text or "")
    return float(m.group(1)) * (1e6 if m.group(2) == "M" else 1e3) if m else None


def score_of(path):
    s = load(path) if path else None
    return s["score"] if s and "score" in s else None


def summary(value):
    """fairseq-localness-results' summary of one run's value."""
    return {"mean": value, "sd": None, "n": 0 if value is None else 1, "min": value, "max": value}


def verdict(delta, p, alpha=0.05):
    if p is None or delta is None:
        return None
    if delta == 0:  # (identical scores: sacreBLEU's p is 1 / (samples + 1) for identical outputs)
        return "n.s."
    return ("better" if delta > 0 else "worse") if p < alpha else "n.s."


def table(title, rows, tests, seed=1, root=None):
    """The Markdown table and notes, and the table's numbers per row in the layout of
    fairseq-localness-results' results.json ("systems"; run directories relative to
    ``root``)."""
    has_extra = any(r["extra"] for r in rows)
    extra_kinds = sorted({r["extra"] for r in rows if r["extra"]})
    has_params = any(r["paper_params"] for r in rows)
    has_speed = any(r["paper_speed"] for r in rows)
    tests = [t for t in tests if any(r["baseline"] for r in rows)]
    ours_params = {r["name"]: params_of(r["log"]) for r in rows}
    head = ["row", "pair", "metric", "paper BLEU", "our BLEU", "delta"]
    if has_extra:
        head += [" / ".join(KIND[k] for k in extra_kinds) + " (extra)"]
    if has_params:
        head += ["paper params", "our params"]
    if has_speed:
        head += ["paper speed", "our speed"]
    head += [TESTS[t][0] for t in tests]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if i < 3 else "---:" for i in range(len(head))) + "|"]
    signatures, done, shared_note, failed, systems = set(), 0, False, [], []
    scores = {r["name"]: score_of(r["score"]) for r in rows}
    for r in rows:
        ours = scores[r["name"]]
        # a row whose SLURM jobs failed (--slurm's table job writes RUN/FAILED, with the reason)
        why = None
        if ours is None and r["log"]:
            try:
                with open(os.path.join(os.path.dirname(r["log"]), "FAILED"), errors="replace") as f:
                    why = f.read().strip() or "a job failed"
            except OSError:
                pass
        if why is not None:
            failed.append((r["name"], why))
        sacre = load(r["sacrebleu"])
        if sacre and "signature" in sacre:
            signatures.add(sacre["signature"])
        delta = "-"
        if ours is not None:
            done += 1
            if r["paper_bleu"] != "-":
                delta = "%+.2f" % (round(ours, 2) - float(r["paper_bleu"]))
        cells = [r["name"], r["pair"], KIND[r["kind"]], r["paper_bleu"],
                 "%.2f" % ours if ours is not None else ("failed" if why is not None else "-"), delta]
        extra = score_of(r["extra_score"]) if r["extra"] else None
        if has_extra:
            cells += ["%.2f" % extra if extra is not None else "-"]
        mine, speed, p_values = None, None, {}
        if has_params:
            n, base = ours_params.get(r["name"]), r["baseline"]
            if n is None:
                mine = "-"
            elif r["paper_params"].startswith("+") and base and ours_params.get(base) is not None:
                b = ours_params[base]
                mine = "+" + millions(n - b) if n >= b else "-" + millions(b - n)
            else:
                mine = millions(n)
                paper = paper_millions(r["paper_params"])
                if r["shares_embeddings"] == "1" and paper and abs(n - paper) > 0.05 * paper:
                    mine += " (shared emb.)"
                    shared_note = True
            cells += [r["paper_params"] or "-", mine]
        if has_speed:
            speed = speed_of(r["log"])
            cells += [r["paper_speed"] or "-", "%.2f" % speed if speed is not None else "-"]
        for t in tests:
            p = p_value(load(r[TESTS[t][1]]), r["name"]) if r["baseline"] else None
            p_values[t] = p
            cells += ["%.3f" % p if p is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
        systems.append(system_entry(r, seed, root, ours, extra, ours_params.get(r["name"]), mine, speed, why,
                                    scores.get(r["baseline"]) if r["baseline"] else None, p_values))
    notes = ["", "%s. Our numbers: %d of %d rows have results ('-': not run yet). delta = ours - paper."
             % (title, done, len(rows))]
    notes += ["failed: %s: %s" % (name, why) for name, why in failed]
    seen = set()
    for r in rows:  # per configuration: the metric, the test set, the training
        if r["config"] in seen:
            continue
        seen.add(r["config"])
        n = sum(r2["config"] == r["config"] for r2 in rows)
        label = "%s (%d row%s)" % (r["config"], n, "s" if n > 1 else "")
        extra = ("; extra column: " + KIND[r["extra"]]) if r["extra"] else ""
        notes.append(f"{label}: BLEU as the paper states it: \"{r['paper_metric']}\"; main column: {KIND[r['kind']]}"
                     f"{extra}. Test set: {r['test']}. Training: {r['training']}.")
    if has_speed:
        notes.append("Speed: training updates per second (the paper's on its hardware; ours as trained here, mean of "
                     "fairseq's 'ups' per epoch).")
    if "paired-bs" in tests:
        notes.append("p (paired bootstrap): Koehn (2004), 1000 full-size resamples (sacrebleu --paired-bs), against "
                     "the row's baseline, on the main column's BLEU.")
    if "compare-mt" in tests:
        notes.append("p (compare-mt): compare-mt's paired bootstrap (significance.sh, 1000 resamples of half the "
                     "sentences), against the row's baseline, on the main column's BLEU.")
    if any(r["paper_params"].startswith("+") for r in rows):
        notes.append("Params: for rows whose paper number starts with '+', ours is the difference from the row's "
                     "baseline too.")
    if shared_note:
        notes.append("(shared emb.): our run shares one embedding matrix between source, target and output "
                     "(--share-all-embeddings, fairseq's recipe for a joint vocabulary); the paper's count includes "
                     "separate source embeddings, hence the difference in parameters.")
    for s in sorted(signatures):
        notes.append("sacreBLEU signature: " + s)
    return "\n".join(lines + notes) + "\n", systems


def system_entry(r, seed, root, ours, extra, params, params_text, speed, why, base_score, p_values):
    """One row of the table as an entry of results.json's "systems"."""
    run_dir = os.path.dirname(r["log"]) if r["log"] else ""
    rel = os.path.relpath(run_dir, root) if root and run_dir else run_dir
    run = {"seed": seed, "dir": rel, "done": ours is not None, "bleu": ours, "extra": extra,
           "params": params, "ups": speed}
    if why is not None:
        run["failed"] = why
    comparison = None
    if r["baseline"] and r["baseline"] != r["name"] and p_values:
        delta = ours - base_score if ours is not None and base_score is not None else None
        p = next((v for v in p_values.values() if v is not None), None)
        comparison = {"baseline": r["baseline"], "delta_mean": delta, "tests": p_values,
                      "pooled": {"delta": delta, "p_value": p, "verdict": verdict(delta, p)}}
    meta = {"pair": r["pair"], "metric": r["kind"], "extra_metric": r["extra"], "paper_bleu": r["paper_bleu"],
            "paper_params": r["paper_params"], "paper_speed": r["paper_speed"], "config": r["config"],
            "paper_metric": r["paper_metric"], "test": r["test"], "training": r["training"],
            "shares_embeddings": r["shares_embeddings"], "arch": r["arch"], "our_params": params_text or "-"}
    return {"system": r["name"], "meta": meta, "baseline": r["baseline"] or None, "seeds": [seed],
            "seeds_done": [seed] if ours is not None else [], "runs": [run],
            "summary": {"bleu": summary(ours), "extra": summary(extra), "params": summary(params),
                        "ups": summary(speed)},
            "comparison": comparison}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--title", required=True)
    p.add_argument("--tests", default="", help="significance tests whose p-values to show: paired-bs, compare-mt")
    p.add_argument("--seed", type=int, default=1, help="the runs' training seed (for results.json)")
    p.add_argument("--out", default="", help="also write the table here, and its numbers to results.json beside it")
    args = p.parse_args(argv)
    reader = csv.DictReader(sys.stdin, delimiter="\t", quoting=csv.QUOTE_NONE)
    assert tuple(reader.fieldnames) == COLUMNS, reader.fieldnames
    rows = [{k: (v or "") for k, v in r.items()} for r in reader]
    root = os.path.dirname(os.path.abspath(args.out)) if args.out else None
    text, systems = table(args.title, rows, args.tests.split(), args.seed, root)
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        result = {"title": args.title, "layout": "reproduce", "systems": systems}
        with open(os.path.join(root, "results.json.tmp"), "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        os.replace(os.path.join(root, "results.json.tmp"), os.path.join(root, "results.json"))


if __name__ == "__main__":
    main()
