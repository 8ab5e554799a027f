"""Dump per-token statistics of a trained model: Gaussian centres P and windows D,
gates, branch weights, ... for every head and layer (``fairseq-localness-dump``).

Runs the model teacher-forced over a split of a binarized data set inside an
:class:`~fairseq_localness.modules.observe.AttentionRecorder` and writes one JSON
line per (sentence, module) with the statistics of the real (non-padding) tokens::

    {"id": 3, "module": "encoder.layers.0.self_attn.branches.0", "side": "encoder",
     "stats": {"P": [[...per token...] per head], "D": [...], "q_pos": [...], "I": [...]}}

Attention distributions (``probs_*``, ``Tq x Tk`` per head) are large; they are
written only with ``--with-attention``.

A model without such modules (fairseq's transformer, or a locality model with every
layer list set to ``none``) has nothing to dump: that is an error (exit status 2)
and no file is written, as is a run that recorded nothing.

Example::

    fairseq-localness-dump data-bin/demo --path runs/demo/localness/checkpoint_best.pt \\
        --split valid --max-sentences 200 --output stats.jsonl
"""
import argparse
import json
import logging
import os
import sys

from fairseq_localness.atomic import replacing
from fairseq_localness.checkpoint import add_trust_argument, trusting

logger = logging.getLogger("fairseq_localness.dump")


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-dump", description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="binarized data directory (fairseq-preprocess output)")
    p.add_argument("--path", required=True, help="checkpoint file")
    p.add_argument("--split", default="valid", help="split to run over (default: valid)")
    p.add_argument("--output", required=True, help="JSON-lines file to write")
    p.add_argument("--max-sentences", type=int, default=100, help="stop after this many sentences")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--with-attention", action="store_true", help="also write branch attention weights")
    p.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is available")
    add_trust_argument(p)
    return p


def load(args):
    from fairseq_localness.analysis.checkpoint import load_checkpoint
    from fairseq_localness.analysis.cli_args import AnalysisError

    for path, what in ((args.path, "--path checkpoint"), (args.data, "data directory")):
        if not os.path.exists(path):
            sys.exit(f"fairseq-localness-dump: {what} {path!r} does not exist")
    try:
        with trusting(getattr(args, "trust_checkpoint", False)):
            model, cfg, task, use_cuda = load_checkpoint(args.path, args.data, cpu=args.cpu)
    except AnalysisError as e:
        sys.exit(f"fairseq-localness-dump: {e}")
    return model, cfg, task, use_cuda


def _arch(cfg) -> str:
    model_cfg = getattr(cfg, "model", None)
    return str(getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or "unknown")


def main(args):
    """Write the JSON lines; the per-sentence cutting to real tokens is
    :func:`fairseq_localness.analysis.batches.iter_sentence_stats`."""
    from fairseq_localness.analysis.batches import iter_sentence_stats
    from fairseq_localness.modules.observe import Observable

    model, cfg, task, use_cuda = load(args)
    if not any(isinstance(m, Observable) for m in model.modules()):
        sys.stderr.write(
            f"fairseq-localness-dump: error: the model of {args.path} (--arch {_arch(cfg)}) has no module that "
            "records statistics (Gaussian centres and windows, gates, branch weights): nothing to dump; "
            "expected a localness_transformer, hybrid_transformer, hysan_transformer or dc_transformer "
            "checkpoint with at least one locality layer\n")
        sys.exit(2)
    written = lines = 0
    with replacing(args.output) as tmp:  # (no file under the name unless it is whole)
        with open(tmp, "x", encoding="utf-8") as out:
            for sent in iter_sentence_stats(
                model, task, args.split, max_sentences=args.max_sentences, batch_size=args.batch_size,
                with_attention=args.with_attention, use_cuda=use_cuda, show_progress=False,
            ):
                for module_name, (side, values) in sent.modules.items():
                    stats = {name: value.tolist() for name, value in values.items()}
                    out.write(json.dumps({"id": sent.id, "module": module_name, "side": side, "stats": stats})
                              + "\n")
                    lines += 1
                written += 1
        if not lines:
            sys.stderr.write(
                f"fairseq-localness-dump: error: the model of {args.path} (--arch {_arch(cfg)}) recorded no "
                f"statistics over {written} sentence(s) of '{args.split}': nothing to dump\n")
            sys.exit(2)
    logger.info("wrote statistics of %d sentences to %s", written, args.output)
    return written


def cli_main(argv=None):
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    args = get_parser().parse_args(argv)
    if args.max_sentences < 1:
        sys.exit("fairseq-localness-dump: --max-sentences must be >= 1")
    main(args)


if __name__ == "__main__":
    cli_main()
