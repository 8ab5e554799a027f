#!/usr/bin/env python3
"""What the reproduce driver computes: its options, configurations and rows, checked.

scripts/reproduce/common.sh orchestrates a reproduce run in shell (it sources the
configurations, which are shell files, and runs the pipeline steps); the checks and
the text it derives from its options, configurations and TABLE_ROWS are here, in a few
calls per run (standard library only: fairseq is not imported):

    plan.py --prog PROG options --datasets "D ..." --paper-test T -- ARGS...
        the script's options checked (in the order of their checks in the shell, so
        the first error is the same), printed as shell assignments for eval: DRY_RUN,
        WORK, GPUS, ..., SEEDS (an array), RAW_DIRS[dataset]=dir, RUN_TESTS (the
        significance tests to run); HELP=1 alone at a --help before any error
    plan.py --prog PROG config --file F --datasets "D ..." < values
        the values a configuration sets (config.sh's config_values: NUL-separated
        name, count, values) checked; prints CFG_MAX_TOKENS, CFG_SAVE_INTERVAL and
        CFG_EVAL_BLEU_ARGS (--eval-bleu-args for early stopping)
    plan.py --prog PROG rows --title TITLE [--only "A B"] < rows
        every row checked (7 fields 'name|config[:src-tgt]|extra args|paper BLEU|
        baseline row|paper params|paper speed', a valid and new name, a number or '-'
        as the paper's BLEU, an earlier row as baseline, a leading '--arch NAME' split
        off the extra args, none of the options the driver sets itself), then --only
        checked against the names; one line per row on stdout, its fields separated by
        US (\\x1f): name, config, direction, architecture of a leading --arch (or
        empty), the other extra args, paper BLEU, baseline, paper params, paper speed,
        1 when the row is selected (else 0)
    plan.py --prog PROG list --title TITLE < rows
        the rows as --list prints them (nothing checked)

A bad option, configuration, row or --only stops with exit status 2 and
'PROG: error: ...' on stderr, the message of scripts/lib.sh's checks (require_int,
require_choice, ...) where they are the same check.
"""
import argparse
import importlib.util
import re
import shlex
import sys
from pathlib import Path

# Options the driver and train.sh set themselves; a configuration or row must not.
RESERVED_OPTS = ("--max-update", "--update-freq", "--seed", "--save-dir", "--arch", "--cpu", "--log-file",
                 "--source-lang", "--target-lang", "--user-dir", "--task", "--fp16", "--bf16", "--restore-file",
                 "--eval-bleu", "--patience", "--best-checkpoint-metric")
FIELDS = ("name", "config", "extra args", "paper BLEU", "baseline", "params", "speed")
SEP = "\x1f"
_NAME = re.compile(r"[A-Za-z0-9_.+-]+")
_FLOAT = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")  # scripts/lib.sh's require_float



class RowError(ValueError):
    """A bad option, row or --only: the message common.sh prints after 'PROG: error: '."""


# ------------------------------------------------------------------ options
BLEU_KINDS = ("nist", "sacrebleu", "multi-bleu", "tok-compound")
TRAININGS = ("fixed", "early-stop")
TESTS = ("paired-bs", "compare-mt")
# The options: flag -> (variable, value it sets); value options -> variable. Their
# defaults are OPTION_DEFAULTS; --raw-dir, --seed, --seeds and --help are read apart.
FLAGS = {"--dry-run": "DRY_RUN", "--table": "TABLE_ONLY", "--list": "LIST_ONLY", "--rehearse": "REHEARSE",
         "--download": "DOWNLOAD", "--cpu": "CPU", "--slurm": "SLURM", "--status": "STATUS", "--cancel": "CANCEL"}
VALUES = {"--work-dir": "WORK", "--data-dir": "DATA_DIR", "--variant": "VARIANT", "--bleu": "BLEU_OVERRIDE",
          "--training": "TRAINING_CHOICE", "--patience": "PATIENCE_OVERRIDE", "--significance": "SIGNIFICANCE",
          "--only": "ONLY", "--gpus": "GPUS", "--max-tokens": "MAX_TOKENS", "--precision": "PRECISION",
          "--seed": "SEED", "--seeds": "SEEDS_SPEC", "--raw-dir": "RAW_ROOT",
          # --slurm (scripts/reproduce/slurm.sh, fairseq_localness/slurm/); --slurm-arg is read apart
          "--partition": "S_PARTITION", "--nodes": "S_NODES", "--gpus-per-node": "S_GPN",
          "--cpus-per-task": "S_CPUS", "--mem": "S_MEM", "--time": "S_TIME", "--account": "S_ACCOUNT",
          "--qos": "S_QOS", "--constraint": "S_CONSTRAINT", "--max-running": "S_MAX_RUNNING",
          "--max-requeues": "S_MAX_REQUEUES", "--signal-delay": "S_SIGNAL_DELAY", "--slurm-arg": "S_ARG",
          "--max-jobs": "S_MAX_JOBS"}
SLURM_VALUES = ("--partition", "--nodes", "--gpus-per-node", "--cpus-per-task", "--mem", "--time", "--account",
                "--qos", "--constraint", "--max-running", "--max-requeues", "--signal-delay", "--slurm-arg",
                "--max-jobs")
OPTION_DEFAULTS = dict(DRY_RUN="0", TABLE_ONLY="0", LIST_ONLY="0", REHEARSE="0", DOWNLOAD="0", CPU="0", WORK="",
                       DATA_DIR="", RAW_ROOT="", ONLY="", GPUS="1", MAX_TOKENS="", PRECISION="", SEED="1",
                       VARIANT="", BLEU_OVERRIDE="", TRAINING_CHOICE="paper", PATIENCE_OVERRIDE="",
                       SIGNIFICANCE="paper", SEEDS_SPEC="", SLURM="0", STATUS="0", CANCEL="0",
                       S_PARTITION="", S_NODES="", S_GPN="", S_CPUS="", S_MEM="", S_TIME="", S_ACCOUNT="",
                       S_QOS="", S_CONSTRAINT="", S_MAX_RUNNING="", S_MAX_REQUEUES="3", S_SIGNAL_DELAY="90",
                       S_ARG="", S_MAX_JOBS="500")
_INT = re.compile(r"[0-9]+")


def require_int(opt, value, minimum=1):
    """scripts/lib.sh's require_int: a whole number >= minimum (a number, or a string of digits)."""
    if not (_INT.fullmatch(value) and int(value) >= int(minimum)):
        raise RowError(f"{opt}: expected a whole number >= {minimum}, got '{value}'")


def require_choice(opt, value, choices):
    """scripts/lib.sh's require_choice."""
    if value not in choices:
        raise RowError(f"{opt}: expected one of: {' '.join(choices)}; got '{value}'")


def parse_seeds(opt, value):
    """scripts/lib.sh's parse_seeds: a number of seeds N (1..N) or a list of distinct seeds."""
    if _INT.fullmatch(value):
        if int(value) < 1:
            raise RowError(f"{opt}: expected a whole number >= 1, got '{value}' (a number of seeds N, seeds 1..N, "
                           "or a comma-separated list of distinct seeds, e.g. 1,5,7)")
        return list(range(1, int(value) + 1))
    if re.fullmatch(r"[0-9]+(,[0-9]+)+", value):
        seeds = [int(s) for s in value.split(",")]
        if len(set(seeds)) != len(seeds):
            raise RowError(f"{opt}: '{value}' names a seed twice; expected distinct seeds (e.g. 1,5,7)")
        return seeds
    raise RowError(f"{opt}: expected a number of seeds (e.g. 3: seeds 1,2,3) or a comma-separated list of seeds "
                   f"(whole numbers, e.g. 1,5,7), got '{value}'")


def run_tests(significance, paper_test):
    """The significance tests to run (a space-separated list) for --significance and the
    script's TABLE_SIGNIFICANCE (none, paired-bs, compare-mt; 0 and 1 the old none and compare-mt)."""
    paper_test = {"0": "none", "1": "compare-mt", "": "none"}.get(paper_test, paper_test)
    return {"paper": paper_test.replace("none", "", 1), "both": "paired-bs compare-mt", "none": ""}.get(
        significance, significance)


def parse_options(argv, datasets, prog, paper_test="none"):
    """The reproduce options in argv, checked in the order common.sh checked them: a dict
    of the shell variables they set (OPTION_DEFAULTS' names, SEEDS a list, RAW_DIRS a
    dict, RUN_TESTS), or {"HELP": "1"} at a --help that comes before any error."""
    v, raw_dirs, given, i = dict(OPTION_DEFAULTS), {}, set(), 0
    slurm_args, table_args = [], []
    while i < len(argv):
        opt = argv[i]
        if opt in ("-h", "--help"):
            return {"HELP": "1"}
        if opt in FLAGS:
            v[FLAGS[opt]] = "1"
            if opt not in ("--slurm", "--status", "--cancel", "--dry-run", "--table"):
                table_args.append(opt)
            i += 1
            continue
        if opt not in VALUES:
            raise RowError(f"unknown option '{opt}' (see '{prog} --help')")
        if i + 1 >= len(argv):
            raise RowError(f"option {opt} needs a value")
        value, i = argv[i + 1], i + 2
        given.add(opt)
        if opt == "--slurm-arg":
            slurm_args.append(value)
            continue
        if opt not in SLURM_VALUES and opt != "--work-dir":  # (the table job gets WORK, absolute)
            table_args += [opt, value]
        dataset, eq, where = value.partition("=")
        if opt == "--raw-dir" and eq and re.fullmatch(r"[a-z0-9_]+", dataset):
            require_choice("--raw-dir DATASET=DIR: dataset", dataset, datasets)
            if not where:
                raise RowError(f"--raw-dir {dataset}=: expected a directory after '='")
            raw_dirs[dataset] = where
        else:
            v[VALUES[opt]] = value
    if v["DRY_RUN"] == "1" and v["TABLE_ONLY"] == "1":
        raise RowError("--dry-run and --table: expected one of them, not both")
    require_int("--gpus", v["GPUS"], 1)
    v["GPUS"] = str(int(v["GPUS"]))
    require_int("--seed", v["SEED"], 0)
    seeds = [int(v["SEED"])]
    if "--seeds" in given:
        if "--seed" in given:
            raise RowError("--seed and --seeds: expected one of them, not both (--seed N: one run with seed N; "
                           "--seeds: one run per seed)")
        seeds = parse_seeds("--seeds", v["SEEDS_SPEC"])
    v["SEED"] = str(seeds[0])
    if v["MAX_TOKENS"]:
        require_int("--max-tokens", v["MAX_TOKENS"], 1)
    if v["PRECISION"]:
        require_choice("--precision", v["PRECISION"], ("auto", "fp32", "fp16", "bf16"))
    if v["VARIANT"] and not re.fullmatch(r"[A-Za-z0-9_-]+", v["VARIANT"]):
        raise RowError(f"--variant: expected a variant name, got '{v['VARIANT']}'")
    if v["BLEU_OVERRIDE"]:
        require_choice("--bleu", v["BLEU_OVERRIDE"], BLEU_KINDS)
    require_choice("--training", v["TRAINING_CHOICE"], ("paper",) + TRAININGS)
    if v["PATIENCE_OVERRIDE"]:
        require_int("--patience", v["PATIENCE_OVERRIDE"], 1)
    require_choice("--significance", v["SIGNIFICANCE"], ("paper",) + TESTS + ("both", "none"))
    slurm = check_slurm(v, given, slurm_args)
    if v["CPU"] == "1" and v["GPUS"] != "1" and not (v["SLURM"] == "1" and "--gpus" not in given):
        raise RowError(f"--cpu and --gpus {v['GPUS']}: expected one of them, not both")
    v.update(SEEDS=seeds, RAW_DIRS=raw_dirs, RUN_TESTS=run_tests(v["SIGNIFICANCE"], paper_test),
             SLURM_SUBMIT_ARGS=slurm, TABLE_ARGS=table_args)
    return v


_MEM = re.compile(r"[0-9]+[KMGT]?")


def slurm_times():
    """fairseq_localness/slurm/times.py, the SLURM job's own --time parser, loaded from
    its file: importing the package would import fairseq and torch."""
    path = Path(__file__).resolve().parents[2] / "fairseq_localness" / "slurm" / "times.py"
    spec = importlib.util.spec_from_file_location("fairseq_localness_slurm_times", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_slurm(v, given, slurm_args):
    """--slurm's options checked; the options of `python -m fairseq_localness.slurm submit` (a list).
    S_NODES and S_GPN are set (processes per node; GPUS becomes the processes of a run)."""
    slurm_opts = [o for o in SLURM_VALUES if o in given]
    modes = [o for o, k in (("--status", "STATUS"), ("--cancel", "CANCEL")) if v[k] == "1"]
    if len(modes) > 1:
        raise RowError(f"{modes[0]} and {modes[1]}: expected one of them, not both")
    if (modes or v["SLURM"] == "1") and re.search(r"[\n\r]", v["WORK"]):
        raise RowError(f"--work-dir: {v['WORK']!r} has a line break; SLURM's job scripts take one line per option: "
                       "expected a directory without one")
    if modes:  # the submitted command with --status or --cancel appended: its --slurm and resources left aside
        v["SLURM"] = "0"
        if v["DRY_RUN"] == "1":
            raise RowError(f"{modes[0]} and --dry-run: expected one of them, not both")
        return []
    if v["SLURM"] != "1":
        if slurm_opts:
            raise RowError(f"{slurm_opts[0]}: only with --slurm (submit the rows as SLURM jobs)")
        return []
    if v["TABLE_ONLY"] == "1" or v["LIST_ONLY"] == "1":
        raise RowError("--slurm and %s: expected one of them, not both" % ("--table" if v["TABLE_ONLY"] == "1"
                                                                          else "--list"))
    out = []
    nodes = v["S_NODES"] or "1"
    require_int("--nodes", nodes, 1)
    nodes = int(nodes)
    if v["S_GPN"]:
        require_int("--gpus-per-node", v["S_GPN"], 1)
        gpn = int(v["S_GPN"])
        if "--gpus" in given and int(v["GPUS"]) != nodes * gpn:
            raise RowError(f"--gpus {v['GPUS']} and --nodes {nodes} --gpus-per-node {gpn}: conflicting GPU counts; "
                           f"expected --gpus = nodes x GPUs per node ({nodes * gpn}), or only one of them")
    elif "--gpus" in given:
        if int(v["GPUS"]) % nodes:
            raise RowError(f"--gpus {v['GPUS']} and --nodes {nodes}: conflicting GPU counts; expected --gpus to be "
                           f"a multiple of --nodes (the same number of GPUs on every node), or --gpus-per-node")
        gpn = int(v["GPUS"]) // nodes
    else:
        gpn = 1
    v["S_NODES"], v["S_GPN"], v["GPUS"] = str(nodes), str(gpn), str(nodes * gpn)
    out += ["--nodes", str(nodes), "--gpus-per-node", str(gpn)]
    if v["S_CPUS"]:
        require_int("--cpus-per-task", v["S_CPUS"], 1)
        out += ["--cpus-per-task", str(int(v["S_CPUS"]))]
    if v["S_MEM"]:
        if not _MEM.fullmatch(v["S_MEM"]):
            raise RowError(f"--mem: expected a size in megabytes or with a unit K, M, G or T (e.g. 32G), "
                           f"got '{v['S_MEM']}'")
        out += ["--mem", v["S_MEM"]]
    for o, k in (("--partition", "S_PARTITION"), ("--account", "S_ACCOUNT"), ("--qos", "S_QOS"),
                 ("--constraint", "S_CONSTRAINT")):
        if v[k]:
            if not re.fullmatch(r"[A-Za-z0-9_.,:|&*\[\]()!-]+", v[k]):
                raise RowError(f"{o}: expected a SLURM name (letters, digits, _ . - and the constraint operators), "
                               f"got '{v[k]}'")
            out += [o, v[k]]
    require_int("--max-requeues", v["S_MAX_REQUEUES"], 0)
    require_int("--signal-delay", v["S_SIGNAL_DELAY"], 10)
    out += ["--max-requeues", str(int(v["S_MAX_REQUEUES"])), "--signal-delay", str(int(v["S_SIGNAL_DELAY"]))]
    if v["S_TIME"]:
        try:
            minutes = slurm_times().time_minutes(v["S_TIME"], int(v["S_SIGNAL_DELAY"]))
        except ValueError as e:
            raise RowError(str(e)) from None
        out += ["--time", str(minutes)]
    if v["S_MAX_RUNNING"]:
        require_int("--max-running", v["S_MAX_RUNNING"], 1)
        out += ["--max-running", str(int(v["S_MAX_RUNNING"]))]
    require_int("--max-jobs", v["S_MAX_JOBS"], 1)
    out += ["--max-jobs", str(int(v["S_MAX_JOBS"]))]
    for a in slurm_args:  # (checked with the cluster's options: fairseq_localness.slurm check)
        out += ["--slurm-arg", a]
    return out


# ------------------------------------------------------------------ configurations
_LANG = re.compile(r"[A-Za-z0-9_]+")


def require_float(opt, value):
    """scripts/lib.sh's require_float."""
    if not _FLOAT.fullmatch(value):
        raise RowError(f"{opt}: expected a number, got '{value}'")


def check_config(values, path, datasets):
    """Check the values a configuration (configs/papers/NAME.sh at `path`) sets, in the
    order common.sh checked them: `values` maps each variable to its list of values (one
    for a scalar). Returns the per-process --max-tokens and the --save-interval-updates of
    its TRAIN_ARGS (CFG_MAX_TOKENS, CFG_SAVE_INTERVAL)."""
    def one(name):
        return (values.get(name) or [""])[0]

    def die(message):
        raise RowError(f"configuration {path}: {message}")

    require_choice(f"{path}: BPE", one("BPE"), ("subword-nmt", "sentencepiece"))
    require_choice(f"{path}: BPE_JOINT", one("BPE_JOINT"), ("yes", "no"))
    require_choice(f"{path}: TRAINING", one("TRAINING"), TRAININGS)
    require_choice(f"{path}: PAPER_EMBEDDINGS", one("PAPER_EMBEDDINGS"), ("shared", "separate"))
    if not one("ARCH"):
        die("ARCH is empty")
    if not one("PAPER_BLEU"):
        die("PAPER_BLEU is empty; expected the paper's words on its BLEU")
    for name in ("MAX_UPDATE", "EFFECTIVE_TOKENS", "AVERAGE_LAST", "PATIENCE", "BEAM"):
        require_int(f"{path}: {name}", one(name), 1)
    require_float(f"{path}: LENPEN", one("LENPEN"))
    if not values.get("PAIRS"):
        die("PAIRS is empty; expected entries 'dataset|src|tgt|bpe size|bleu kind[+extra kind]'")
    directions = []
    for entry in values["PAIRS"]:
        dataset, src, tgt, size, kinds = bash_read(entry, 5)
        where = f"{path}: PAIRS entry '{entry}'"
        require_choice(f"{where}: dataset", dataset, datasets)
        for what, lang in (("source", src), ("target", tgt)):
            if not _LANG.fullmatch(lang):
                raise RowError(f"{where}: {what} language: expected a language code (letters, digits, '_'), "
                               f"got '{lang}'")
        require_int(f"{where}: bpe size", size, 1)
        kind, plus, extra = kinds.partition("+")
        require_choice(f"{where}: bleu kind", kind, BLEU_KINDS)
        if plus and extra:
            require_choice(f"{where}: extra bleu kind", extra, BLEU_KINDS)
        if f"{src}-{tgt}" in directions:
            die(f"PAIRS lists the direction {src}-{tgt} twice")
        directions.append(f"{src}-{tgt}")
    for name in ("MODEL_ARGS", "METHOD_ARGS", "TRAIN_ARGS"):
        reserved_in(f"{path}: {name}", values.get(name, []))
    train = values.get("TRAIN_ARGS", [])
    last = {}  # the value after each option (the last one wins)
    for prev, w in zip(train, train[1:]):
        last[prev] = w
    max_tokens, save, keep = (last.get(o, "") for o in
                              ("--max-tokens", "--save-interval-updates", "--keep-interval-updates"))
    if not max_tokens:
        die("TRAIN_ARGS has no --max-tokens (the most tokens per process and batch; EFFECTIVE_TOKENS is split "
            "within it)")
    require_int(f"{path}: --max-tokens in TRAIN_ARGS", max_tokens, 1)
    if not save:
        die("TRAIN_ARGS has no --save-interval-updates (the last AVERAGE_LAST update checkpoints are averaged)")
    require_int(f"{path}: --keep-interval-updates in TRAIN_ARGS", keep or "0", one("AVERAGE_LAST"))
    return {"CFG_MAX_TOKENS": max_tokens, "CFG_SAVE_INTERVAL": save,
            "CFG_EVAL_BLEU_ARGS": eval_bleu_args(one("BEAM"), one("LENPEN"), values.get("GENERATE_ARGS", []))}


def eval_bleu_args(beam, lenpen, generate_args):
    """fairseq-train's --eval-bleu-args for early stopping on development BLEU: the
    paper's beam, length penalty and maximum length (--max-len-a/-b of GENERATE_ARGS),
    the values as the configuration writes them."""
    gen = f'{{"beam": {beam}, "lenpen": {lenpen}'
    for prev, w in zip(generate_args, generate_args[1:]):
        if prev in ("--max-len-a", "--max-len-b"):
            gen += f', "{prev[2:].replace("-", "_")}": {w}'
    return gen + "}"


def read_values(data):
    """The variables config_values (config.sh) writes: NUL-separated name, number of
    values, values."""
    fields, values, k = data.split("\0"), {}, 0
    while k + 1 < len(fields):
        name, n = fields[k], int(fields[k + 1])
        values[name] = fields[k + 2:k + 2 + n]
        k += 2 + n
    return values


def shell_assignments(v):
    """The variables of parse_options as lines for bash's eval (RAW_DIRS: an associative
    array the caller has declared)."""
    lines = []
    for name, value in v.items():
        if name == "SEEDS":
            lines.append("SEEDS=(%s)" % " ".join(str(s) for s in value))
        elif name in ("SLURM_SUBMIT_ARGS", "TABLE_ARGS"):
            lines.append("%s=(%s)" % (name, " ".join(shlex.quote(a) for a in value)))
        elif name == "RAW_DIRS":
            lines += ["RAW_DIRS[%s]=%s" % (shlex.quote(k), shlex.quote(d)) for k, d in value.items()]
        else:
            lines.append(f"{name}={shlex.quote(value)}")
    return lines


def reserved_in(where, words):
    """Raise RowError at the first of `words` that the driver or train.sh sets itself."""
    for w in words:
        if w in RESERVED_OPTS:
            raise RowError(
                f"{where}: '{w}' is set by the reproduce driver and train.sh (--max-update from MAX_UPDATE, "
                "--update-freq from EFFECTIVE_TOKENS, --seed/--cpu/--precision from the command line, the "
                "architecture from ARCH or a row's leading --arch, early stopping from TRAINING); remove it")


def bash_read(entry, nvars):
    """The nvars values bash's `IFS='|' read -r v1 ... vN` gives for the line `entry`:
    missing ones empty, the rest of the line (with its '|') in the last one, less a
    single trailing '|' after its only field."""
    parts = entry.split("|", nvars - 1)
    parts += [""] * (nvars - len(parts))
    last = parts[-1]
    if last.endswith("|") and "|" not in last[:-1]:
        parts[-1] = last[:-1]
    return parts


def parse_rows(entries):
    """Check TABLE_ROWS' entries, in order; a list of dicts (name, config, pair, arch,
    extra (list of words), bleu, base, params, speed)."""
    if not entries:
        raise RowError("TABLE_ROWS is empty")
    rows, names = [], []
    for entry in entries:
        name, cfgspec, extra, bleu, base, params, speed, more = bash_read(entry, len(FIELDS) + 1)
        if more:
            raise RowError(f"row '{entry}': expected 7 fields 'name|config|extra args|paper BLEU|baseline|params|speed'")
        if not _NAME.fullmatch(name):
            raise RowError(f"row '{entry}': name '{name}': expected letters, digits, _ . + -")
        if name in names:
            raise RowError(f"row name '{name}' appears twice")
        if bleu != "-" and not _FLOAT.fullmatch(bleu):
            raise RowError(f"row '{name}': paper BLEU: expected a number, got '{bleu}'")
        if base and base not in names:
            raise RowError(f"row '{name}': baseline '{base}' is not an earlier row")
        config, _, pair = cfgspec.partition(":")
        words, arch = extra.split(), ""
        if words[:1] == ["--arch"]:
            if len(words) < 2:
                raise RowError(f"row '{name}': '--arch' needs an architecture name")
            arch, words = words[1], words[2:]
        reserved_in(f"row '{name}' (extra args)", words)
        names.append(name)
        rows.append(dict(name=name, config=config, pair=pair, arch=arch, extra=words, bleu=bleu, base=base,
                         params=params, speed=speed))
    return rows


def select(rows, only, title):
    """The indices of the rows --only names (all rows when it is empty), in the table's order."""
    names = [r["name"] for r in rows]
    wanted = only.split()
    for want in wanted:
        if want not in names:
            raise RowError(f"--only: no row '{want}' in {title.split(':')[0]}; expected some of: {' '.join(names)}")
    return [i for i, n in enumerate(names) if not wanted or n in wanted]


def rows_lines(rows, selected):
    """The lines `plan.py rows` prints: one per row, fields joined by SEP."""
    return [SEP.join([r["name"], r["config"], r["pair"], r["arch"], " ".join(r["extra"]), r["bleu"], r["base"],
                      r["params"], r["speed"], "1" if i in selected else "0"])
            for i, r in enumerate(rows)]


def list_lines(entries, title):
    """The rows as --list prints them (name, configuration, paper BLEU, extra args)."""
    lines = [f"Rows of {title}:"]
    for entry in entries:
        name, cfg, extra, bleu, _ = bash_read(entry, 5)
        lines.append(f"  {name:<34} {cfg:<32} paper BLEU {bleu:<6} {extra}")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prog", default="reproduce", help="the script name for error messages")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("rows", help="check and select TABLE_ROWS (read from stdin, one per line)")
    p.add_argument("--title", required=True)
    p.add_argument("--only", default="")
    p = sub.add_parser("list", help="print TABLE_ROWS (read from stdin) as --list does")
    p.add_argument("--title", required=True)
    p = sub.add_parser("options", help="check a reproduce script's options; print them as shell assignments")
    p.add_argument("--datasets", required=True, help="the datasets (space-separated) --raw-dir DATASET=DIR names")
    p.add_argument("--paper-test", default="none", help="the script's TABLE_SIGNIFICANCE")
    p.add_argument("args", nargs=argparse.REMAINDER, help="after --: the script's arguments")
    p = sub.add_parser("config", help="check a configuration's values (stdin: config.sh's config_values)")
    p.add_argument("--file", required=True, help="the configuration file, for messages")
    p.add_argument("--datasets", required=True, help="the datasets (space-separated) PAIRS may name")
    args = ap.parse_args(argv)
    if args.cmd == "config":
        try:
            cfg = check_config(read_values(sys.stdin.read()), args.file, args.datasets.split())
        except RowError as e:
            print(f"{args.prog}: error: {e}", file=sys.stderr)
            return 2
        print("\n".join(shell_assignments(cfg)))
        return 0
    if args.cmd == "options":
        words = args.args[1:] if args.args[:1] == ["--"] else args.args
        try:
            v = parse_options(words, args.datasets.split(), args.prog, args.paper_test)
        except RowError as e:
            print(f"{args.prog}: error: {e}", file=sys.stderr)
            return 2
        print("\n".join(shell_assignments(v)))
        return 0
    entries = sys.stdin.read().splitlines()
    if args.cmd == "list":
        print("\n".join(list_lines(entries, args.title)))
        return 0
    try:
        rows = parse_rows(entries)
        selected = select(rows, args.only, args.title)
    except RowError as e:
        print(f"{args.prog}: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(rows_lines(rows, selected)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
