"""Window-size sweep of the hybrid model (Xu et al. 2019, Fig. 2): for each local
window ``m`` (window size ``2m + 1``), train ``hybrid_transformer`` with
``--hybrid-window-m m``, translate the validation set, and report its BLEU next to
the mean gate (the weight of the local pattern, eq. 4-5) over the gated layers.

For every ``m`` of ``--window-m`` the driver:

1. trains into ``--save-root/m<m>/`` with ``fairseq-train DATA --user-dir
   <installed package directory> --arch <--arch> --hybrid-window-m <m> --save-dir ...`` plus
   every argument after ``--`` (the training recipe, the same for every ``m``),
   logging to ``m<m>/train.log``; a directory whose ``--checkpoint`` file already
   exists is not trained again (so an interrupted sweep resumes, and checkpoints
   trained elsewhere, e.g. averaged ones, can be dropped in);
2. translates ``--subset`` with fairseq-generate (run in this process; ``--beam``,
   ``--lenpen``, ``--post-process``, ``--generate-args``) into
   ``m<m>/generate-<subset>.txt`` and
   scores the ``D-`` lines against the ``T-`` lines with sacrebleu (corpus BLEU,
   13a tokenization: both sides are the data's own text after the subword marks are
   removed, so this is a validation score, not a publishable test score);
3. runs the model over ``--subset`` and averages the gates per layer (as the
   ``gates`` tool).

The paper averages the 5 best checkpoints of each setting; average them first
(``fairseq-localness-average``) and point ``--checkpoint`` at the result.

Outputs in ``--output-dir``: ``sweep.csv`` (window_m, window_size, bleu, gate_mean,
one ``gate_<layer>`` column per gated layer, checkpoint), ``sweep.json`` and
``sweep.png`` (Fig. 2: bars = BLEU on the left axis, line = mean gate on the right
axis, x = window size).

Example::

    python -m fairseq_localness.analysis.window_sweep data-bin/wmt14_en_de --save-root ckpt/sweep \\
        --window-m 0 1 2 3 4 --arch hybrid_transformer_wmt_en_de --post-process subword_nmt \\
        --output-dir analysis/sweep -- --share-all-embeddings --optimizer adam --lr 7e-4 ...
"""
import argparse
import os
import shlex
import subprocess
import sys
from typing import Dict, List, Optional

from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_output_args, add_threads_arg, logger, run_main, setup_logging, start_tool,
)
from fairseq_localness.analysis.layers import layer_sort_key
from fairseq_localness.analysis.outputs import ensure_dir, progress, write_csv, write_json
from fairseq_localness.analysis.plotting import finish_figure, pyplot
from fairseq_localness.analysis.bleu_breakdown import corpus_bleu


def get_parser():
    p = argparse.ArgumentParser(
        prog="fairseq-localness-analysis window_sweep", description=__doc__.split("\n\n")[0],
        usage="%(prog)s DATA --save-root DIR --window-m M [M ...] --output-dir DIR [options] [-- fairseq-train args]",
    )
    p.add_argument("data", help="binarized data directory (fairseq-preprocess output)")
    p.add_argument("--save-root", required=True, help="one checkpoint directory m<m>/ per window goes here")
    p.add_argument("--window-m", type=int, nargs="+", required=True, help="values of m (window size 2m+1)")
    p.add_argument("--arch", default="hybrid_transformer", help="architecture (default: hybrid_transformer)")
    p.add_argument("--checkpoint", default="checkpoint_best.pt",
                   help="checkpoint file in each m<m>/ to evaluate (default: checkpoint_best.pt)")
    p.add_argument("--skip-train", action="store_true", help="never train; every checkpoint must exist")
    p.add_argument("--subset", default="valid", help="split to translate and to read the gates on (default: valid)")
    p.add_argument("--beam", type=int, default=4, help="default: 4")
    p.add_argument("--lenpen", type=float, default=1.0, help="default: 1.0")
    p.add_argument("--post-process", default=None,
                   help="fairseq-generate's --post-process (sentencepiece, subword_nmt, ...) so that BLEU is "
                   "computed on words")
    p.add_argument("--generate-args", default="", help="more fairseq-generate arguments, as one quoted string")
    p.add_argument("--max-sentences", type=int, default=None, help="sentences for the gate statistics (default: all)")
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass for the gates")
    p.add_argument("--cpu", action="store_true", help="run the gate statistics on CPU")
    add_threads_arg(p)
    add_output_args(p)
    return p


def tool(name: str) -> str:
    """A console script installed next to this Python, else from PATH."""
    import shutil

    path = os.path.join(os.path.dirname(sys.executable), name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if not found:
        raise AnalysisError(f"{name} is not installed next to {sys.executable} nor on PATH")
    return found


def user_dir() -> str:
    import fairseq_localness

    return os.path.dirname(os.path.abspath(fairseq_localness.__file__))


def run_logged(cmd: List[str], log_path: str, threads: int = 0):
    """Run ``cmd`` (printed first), its output appended to ``log_path``; stop on failure.
    ``threads`` > 0 sets the subprocess's OpenMP/MKL threads."""
    logger.info("+ %s", " ".join(shlex.quote(c) for c in cmd))
    env = dict(os.environ)
    if threads and threads > 0:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log_path, "a", encoding="utf-8") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode != 0:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-2000:]
        raise AnalysisError(f"command failed (exit status {proc.returncode}), see {log_path}:\n{tail}")


def train(args, m: int, save_dir: str):
    cmd = [tool("fairseq-train"), args.data, "--user-dir", user_dir(), "--arch", args.arch,
           "--hybrid-window-m", str(m), "--save-dir", save_dir, *args.train_args]
    run_logged(cmd, os.path.join(save_dir, "train.log"), args.threads)


def generate(argv: List[str], out_path: str):
    """fairseq-generate with ``argv``, run in this process (no second start-up of
    fairseq), its output written to ``out_path``; the equivalent command is logged."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli import generate as fairseq_generate

    logger.info("+ fairseq-generate %s > %s", " ".join(shlex.quote(a) for a in argv), out_path)
    parser = options.get_generation_parser()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=argv))
    with open(out_path, "w", encoding="utf-8") as f:
        fairseq_generate._main(cfg, f)


def validation_bleu(args, checkpoint: str, save_dir: str) -> float:
    out_path = os.path.join(save_dir, f"generate-{args.subset}.txt")
    argv = [args.data, "--user-dir", user_dir(), "--path", checkpoint,
            "--gen-subset", args.subset, "--beam", str(args.beam), "--lenpen", str(args.lenpen),
            "--batch-size", "64"]
    if args.post_process:
        argv += ["--post-process", args.post_process]
    if args.cpu:
        argv += ["--cpu"]
    argv += shlex.split(args.generate_args)
    generate(argv, out_path)
    hyps: Dict[int, str] = {}
    refs: Dict[int, str] = {}
    with open(out_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            for prefix, store, col in (("D-", hyps, 2), ("T-", refs, 1)):
                if line.startswith(prefix):
                    parts = line.rstrip("\n")[2:].split("\t")
                    if parts[0].isdigit() and len(parts) > col:
                        store[int(parts[0])] = parts[col]
    ids = sorted(refs)
    if not ids or any(i not in hyps for i in ids):
        raise AnalysisError(f"{out_path}: fairseq-generate output lacks hypotheses for some references")
    return corpus_bleu([hyps[i] for i in ids], [refs[i] for i in ids]).score


def mean_gates(args, checkpoint: str) -> Dict[str, float]:
    from fairseq_localness.analysis.gates import collect

    model, cfg, task, use_cuda = load_checkpoint(checkpoint, args.data, args.cpu)
    per_layer, _, _ = collect(model, task, args.subset, max_sentences=args.max_sentences,
                              batch_size=args.batch_size, use_cuda=use_cuda, show_progress=not args.no_progress)
    gates = {label: acc.mean for (label, series, module), acc in per_layer.items() if series == "gate"}
    return dict(sorted(gates.items(), key=lambda kv: layer_sort_key(kv[0])))


def plot(rows: List[Dict], path: str, title: str):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(4.5, 0.8 * len(rows) + 2), 3.6))
    xs = list(range(len(rows)))
    ax.bar(xs, [r["bleu"] for r in rows], color="C0", alpha=0.8, label="BLEU")
    lo, hi = min(r["bleu"] for r in rows), max(r["bleu"] for r in rows)
    ax.set_ylim(max(0.0, lo - max(1.0, 0.5 * (hi - lo))), hi + max(0.5, 0.3 * (hi - lo)))
    for x, r in zip(xs, rows):
        ax.text(x, r["bleu"], f"{r['bleu']:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(xs)
    ax.set_xticklabels([str(r["window_size"]) for r in rows])
    ax.set_xlabel("window size (2m + 1)")
    ax.set_ylabel("BLEU (bars)")
    gates = [(x, r["gate_mean"]) for x, r in zip(xs, rows) if r["gate_mean"] == r["gate_mean"]]
    if gates:
        ax2 = ax.twinx()
        ax2.plot([g[0] for g in gates], [g[1] for g in gates], "-o", color="C3", label="mean gate")
        ax2.set_ylabel("mean gate (line)")
        ax2.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    return finish_figure(fig, path)


def main(args):
    out_dir = start_tool(args)
    if not os.path.isdir(args.data):
        raise AnalysisError(f"data directory {args.data!r} does not exist")
    if any(m < 0 for m in args.window_m) or len(set(args.window_m)) < len(args.window_m):
        raise AnalysisError(f"--window-m {args.window_m}: expected distinct whole numbers >= 0")
    rows = []
    for m in progress(args.window_m, desc="window sweep", disable=args.no_progress, unit="setting"):
        save_dir = ensure_dir(os.path.join(args.save_root, f"m{m}"))
        checkpoint = os.path.join(save_dir, args.checkpoint)
        if os.path.isfile(checkpoint):
            logger.info("m=%d: %s exists, not training", m, checkpoint)
        elif args.skip_train:
            raise AnalysisError(f"--skip-train: m={m} has no {checkpoint}")
        else:
            train(args, m, save_dir)
            if not os.path.isfile(checkpoint):
                raise AnalysisError(f"m={m}: training wrote no {checkpoint} (see {save_dir}/train.log)")
        bleu = validation_bleu(args, checkpoint, save_dir)
        gates = mean_gates(args, checkpoint)
        gate_mean = sum(gates.values()) / len(gates) if gates else float("nan")
        logger.info("m=%d (window %d): BLEU %.2f, mean gate %.3f", m, 2 * m + 1, bleu, gate_mean)
        row = {"window_m": m, "window_size": 2 * m + 1, "bleu": bleu, "gate_mean": gate_mean}
        row.update({f"gate_{k}": v for k, v in gates.items()})
        row["checkpoint"] = checkpoint
        rows.append(row)
    write_csv(f"{out_dir}/sweep.csv", rows)
    plot(rows, f"{out_dir}/sweep.png", f"BLEU ({args.subset}) and mean gate per window size")
    summary = {"data": args.data, "arch": args.arch, "subset": args.subset, "train_args": args.train_args,
               "rows": rows}
    write_json(f"{out_dir}/sweep.json", summary)
    return summary


def parse_args(argv: Optional[List[str]] = None):
    """The tool's options; everything after ``--`` becomes ``args.train_args``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: List[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, train_args = argv[:i], argv[i + 1:]
    args = get_parser().parse_args(argv)
    args.train_args = train_args
    return args


def cli_main(argv=None):
    setup_logging()
    return run_main("window_sweep", main, parse_args(argv))


if __name__ == "__main__":
    cli_main()
