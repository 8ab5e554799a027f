"""Dump per-token statistics of a trained model: Gaussian centres P and windows D,
gates, branch weights, ... for every head and layer (``fairseq-localness-dump``).

Runs the model teacher-forced over a split of a binarized data set inside an
:class:`~fairseq_localness.modules.observe.AttentionRecorder` and writes one JSON
line per (sentence, module) with the statistics of the real (non-padding) tokens::

    {"id": 3, "module": "encoder.layers.0.self_attn.branches.0", "side": "encoder",
     "stats": {"P": [[...per token...] per head], "D": [...], "q_pos": [...], "I": [...]}}

Attention distributions (``probs_*``, ``Tq x Tk`` per head) are large; they are
written only with ``--with-attention``.

Example::

    fairseq-localness-dump data-bin/demo --path runs/demo/localness/checkpoint_best.pt \\
        --split valid --max-sentences 200 --output stats.jsonl
"""
import argparse
import json
import logging
import os
import sys

import torch

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
    return p


def _side(module_name: str) -> str:
    if module_name.startswith("encoder."):
        return "encoder"
    return "cross" if ".encoder_attn" in module_name else "decoder"


def _real_query_slice(side: str, src_len: int, src_width: int, tgt_len: int):
    """Which query positions of a padded batch row are real tokens."""
    if side == "encoder":  # fairseq left-pads sources
        return slice(src_width - src_len, src_width)
    return slice(0, tgt_len)  # targets are right-padded


def load(args):
    import fairseq_localness  # noqa: F401  (registers the models, fixes torch.load)
    from fairseq import checkpoint_utils

    for path, what in ((args.path, "--path checkpoint"), (args.data, "data directory")):
        if not os.path.exists(path):
            sys.exit(f"fairseq-localness-dump: {what} {path!r} does not exist")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [args.path], arg_overrides={"data": args.data}
    )
    return models[0], cfg, task


def main(args):
    from fairseq_localness.modules.observe import AttentionRecorder

    model, cfg, task = load(args)
    use_cuda = torch.cuda.is_available() and not args.cpu
    model.eval()
    if use_cuda:
        model.cuda()
    task.load_dataset(args.split)
    dataset = task.dataset(args.split)
    itr = task.get_batch_iterator(
        dataset=dataset, max_sentences=args.batch_size, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=False)

    written = 0
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for sample in itr:
            if written >= args.max_sentences:
                break
            if use_cuda:
                from fairseq import utils

                sample = utils.move_to_cuda(sample)
            net_input = sample["net_input"]
            with AttentionRecorder(model) as rec, torch.no_grad():
                model(**net_input)
            src_width = net_input["src_tokens"].size(1)
            src_lens = net_input["src_lengths"].tolist()
            tgt_lens = sample["target"].ne(task.target_dictionary.pad()).sum(1).tolist()
            for b, sent_id in enumerate(sample["id"].tolist()):
                if written >= args.max_sentences:
                    break
                for module_name, calls in rec.records.items():
                    side = _side(module_name)
                    rows = _real_query_slice(side, src_lens[b], src_width, tgt_lens[b])
                    stats = {}
                    for name, value in calls[0].items():
                        if name.startswith("probs_"):
                            if not args.with_attention:
                                continue
                            cols = (
                                slice(src_width - src_lens[b], src_width)
                                if side != "decoder"
                                else slice(0, tgt_lens[b])
                            )
                            stats[name] = value[b][..., rows, cols].tolist()
                        else:
                            stats[name] = value[b][..., rows].tolist()
                    if stats:
                        out.write(json.dumps({"id": sent_id, "module": module_name, "side": side, "stats": stats}) + "\n")
                written += 1
    os.replace(tmp, args.output)
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
