"""What every analysis tool shares: loading a checkpoint, running it over a split
with the :class:`~fairseq_localness.modules.observe.AttentionRecorder`, cutting the
recorded tensors down to the real (non-padding) tokens of each sentence, encoding
raw text with the model's subword segmentation, aligning subwords with words, and
writing CSV / JSON / PNG outputs.

Shape notation: B = sentences in a batch, H = heads, Tq / Tk = (padded) query / key
length, n = real length of one sentence (including the end-of-sentence token fairseq
appends to every source and target).

fairseq and torch are imported inside the functions that need them, so that a
tool's ``--help`` and the tools that only read text files start quickly.
"""
import argparse
import csv
import json
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

logger = logging.getLogger("fairseq_localness.analysis")


class AnalysisError(Exception):
    """A problem with the user's inputs; the CLIs print it and exit with status 2."""


# --------------------------------------------------------------------------- CLI helpers
class _CurrentStderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is when a record comes (not as it was
    when the handler was made: a caller, e.g. a test harness, may have replaced it)."""

    def emit(self, record):
        self.stream = sys.stderr
        super().emit(record)


def setup_logging():
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO,
        handlers=[_CurrentStderr()],
        force=True,  # importing fairseq may already have configured the root logger
    )
    for noisy in ("matplotlib", "PIL", "fairseq.tasks.text_to_speech"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def run_cli(prog: str, main, argv=None, parser: Optional[argparse.ArgumentParser] = None):
    """Parse ``argv`` with ``parser`` and call ``main(args)`` (see :func:`run_main`)."""
    setup_logging()
    return run_main(prog, main, parser.parse_args(argv))


def run_main(prog: str, main, args):
    """``main(args)``; an :class:`AnalysisError` ends the program with its message
    (exit status 2), not a traceback."""
    setup_logging()
    try:
        return main(args)
    except AnalysisError as e:
        logger.error("%s: error: %s", prog, e)
        sys.exit(2)


def add_checkpoint_args(p: argparse.ArgumentParser, multiple: bool = False):
    """``DATA``, ``--path`` (repeatable with ``multiple``), ``--labels``, ``--cpu``."""
    p.add_argument("data", nargs="?", default=None,
                   help="binarized data directory (fairseq-preprocess output); default: the one "
                   "recorded in the checkpoint")
    if multiple:
        p.add_argument("--path", action="append", required=True, metavar="CHECKPOINT",
                       help="checkpoint file; repeat to compare several models")
        p.add_argument("--labels", nargs="+", default=None,
                       help="one name per --path for tables and legends (default: the file names' directories)")
    else:
        p.add_argument("--path", required=True, metavar="CHECKPOINT", help="checkpoint file")
    p.add_argument("--cpu", action="store_true", help="run on CPU even if a GPU is available")
    add_threads_arg(p)


def add_threads_arg(p: argparse.ArgumentParser):
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default: torch's choice); on a busy or shared machine --threads 1 "
                   "is often much faster for small models")


def set_threads(n: int):
    if n and n > 0:
        import torch

        torch.set_num_threads(n)


class single_thread:
    """Run a block with one torch CPU thread (tiny matrices: more threads only add
    synchronisation), restoring the previous setting."""

    def __enter__(self):
        import torch

        self.before = torch.get_num_threads()
        torch.set_num_threads(1)

    def __exit__(self, *exc):
        import torch

        torch.set_num_threads(self.before)
        return False


def add_split_args(p: argparse.ArgumentParser, default_split: str = "valid", default_max: Optional[int] = None):
    p.add_argument("--split", default=default_split, help=f"split of DATA to run over (default: {default_split})")
    p.add_argument("--max-sentences", type=int, default=default_max,
                   help="use at most this many sentences (default: %s)" % ("all" if default_max is None else default_max))
    p.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass (default: 32)")


def add_output_args(p: argparse.ArgumentParser):
    p.add_argument("--output-dir", required=True, help="directory for the CSV/JSON tables and PNG plots")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def labels_for(paths: Sequence[str], labels: Optional[Sequence[str]]) -> List[str]:
    """``--labels`` or, by default, each checkpoint's directory name (its file name
    when the directories coincide)."""
    if labels is not None:
        if len(labels) != len(paths):
            raise AnalysisError(f"--labels: got {len(labels)} labels for {len(paths)} --path checkpoints")
        return list(labels)
    names = [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]
    if len(set(names)) < len(names):
        names = [os.path.basename(p) for p in paths]
    if len(set(names)) < len(names):
        names = [f"model{i + 1}" for i in range(len(paths))]
    return names


def parse_named(values: Sequence[str], option: str, repeats: bool = False) -> List[Tuple[str, str]]:
    """``["name=path", ...]`` -> ``[(name, path), ...]``; a bare ``path`` is named after
    its file. With ``repeats``, a name may come several times (the runs of one system,
    e.g. its seeds); otherwise names must be unique."""
    out = []
    for v in values:
        if "=" in v and not os.path.exists(v):
            name, path = v.split("=", 1)
            if not name:
                raise AnalysisError(f"{option} {v!r}: empty name before '='; expected NAME=FILE")
        else:
            name, path = os.path.splitext(os.path.basename(v))[0], v
        out.append((name, path))
    names = [n for n, _ in out]
    if not repeats and len(set(names)) < len(names):
        raise AnalysisError(f"{option}: the names {names} are not unique; give NAME=FILE")
    if repeats:
        paths = [os.path.abspath(p) for _, p in out]
        dup = next((p for p in paths if paths.count(p) > 1), None)
        if dup is not None:
            raise AnalysisError(f"{option}: {dup!r} is given twice; expected each run once")
    return out


def group_named(named: Sequence[Tuple[str, str]]) -> List[Tuple[str, List[str]]]:
    """``[(name, path), ...]`` -> ``[(name, [path, ...]), ...]`` in first-seen order."""
    groups: Dict[str, List[str]] = {}
    for name, path in named:
        groups.setdefault(name, []).append(path)
    return list(groups.items())


def require_file(path: str, what: str):
    if not os.path.isfile(path):
        raise AnalysisError(f"{what} {path!r} does not exist")


# --------------------------------------------------------------------------- outputs
def ensure_dir(path: str) -> str:
    os.makedirs(path, exist_ok=True)
    return path


def write_csv(path: str, rows: Sequence[Dict[str, Any]], fieldnames: Optional[Sequence[str]] = None) -> str:
    """Write dict rows as CSV (columns: ``fieldnames`` or the keys in first-seen order);
    floats are written with 6 significant digits."""
    if fieldnames is None:
        fieldnames = []
        for r in rows:
            for k in r:
                if k not in fieldnames:
                    fieldnames.append(k)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(fieldnames), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    logger.info("wrote %s", path)
    return path


def read_csv(path: str) -> List[Dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def write_json(path: str, obj: Any) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")
    logger.info("wrote %s", path)
    return path


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> str:
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    logger.info("wrote %s", path)
    return path


def progress(iterable=None, total=None, desc=None, disable=False, unit="sent"):
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, disable=disable, unit=unit, file=sys.stderr,
                mininterval=1.0, dynamic_ncols=True)


# --------------------------------------------------------------------------- layers
_LAYER_RE = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)")


def layer_label(module_name: str) -> str:
    """``encoder.layers.0.self_attn...`` -> ``enc1``; decoder self-attention ->
    ``dec1_self``, encoder-decoder attention -> ``dec1_cross`` (1-based, the same
    names as the training metrics)."""
    m = _LAYER_RE.match(module_name)
    if not m:
        return module_name
    side, index, kind = m.group(1), int(m.group(2)) + 1, m.group(3)
    if side == "encoder":
        return f"enc{index}"
    return f"dec{index}_{'self' if kind == 'self_attn' else 'cross'}"


def layer_sort_key(label: str):
    m = re.match(r"^(enc|dec)(\d+)(?:_(self|cross))?$", label)
    if not m:
        return (2, 0, label)
    return (0 if m.group(1) == "enc" else 1, int(m.group(2)), m.group(3) or "")


def side_of(module_name: str) -> str:
    """``encoder`` (encoder self-attention), ``decoder`` (decoder self-attention) or
    ``cross`` (encoder-decoder attention)."""
    if module_name.startswith("encoder."):
        return "encoder"
    return "cross" if ".encoder_attn" in module_name else "decoder"


# --------------------------------------------------------------------------- checkpoints
def load_checkpoint(path: str, data: Optional[str] = None, cpu: bool = False, what: str = "--path checkpoint"):
    """Load one checkpoint with its task: ``(model, cfg, task, use_cuda)``.

    ``data`` overrides the data directory recorded in the checkpoint (needed when the
    checkpoint was trained elsewhere: the task reads its dictionaries from there).
    The model is in eval mode, on the GPU if one is available and ``cpu`` is False.
    """
    import torch

    import fairseq_localness  # noqa: F401  (registers the models, fixes torch.load)
    from fairseq import checkpoint_utils

    require_file(path, what)
    if data is not None and not os.path.isdir(data):
        raise AnalysisError(f"data directory {data!r} does not exist")
    overrides = {"data": data} if data is not None else {}
    if data is None:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        cfg = state.get("cfg")
        stored = getattr(getattr(cfg, "task", None), "data", None) if cfg is not None else None
        if stored is None and state.get("args") is not None:
            stored = getattr(state["args"], "data", None)
        if not stored or not os.path.isdir(str(stored).split(os.pathsep)[0]):
            raise AnalysisError(
                f"the data directory recorded in {path} ({stored!r}) does not exist here; "
                "pass the binarized data directory (DATA) as the first argument"
            )
        del state
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    model = models[0]
    model.eval()
    use_cuda = torch.cuda.is_available() and not cpu
    if use_cuda:
        model.cuda()
    return model, cfg, task, use_cuda


def count_parameters(model) -> int:
    """Parameters of a model, each shared tensor counted once (as fairseq-train's
    ``num. shared model params``)."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------- recorded stats
@dataclass
class SentenceStats:
    """The recorded statistics of one sentence, cut to its real tokens.

    ``modules`` maps a recording module's name to ``(side, {stat name: tensor})``; a
    per-token statistic has its query axis last and of length n (``n``, ``H x n``),
    an attention distribution (``probs_*``, only when asked for) is ``H x n_q x n_k``.
    ``src``/``tgt`` are the real source/target token ids (with the final EOS).
    """

    id: int
    src: Any
    tgt: Any
    modules: Dict[str, Tuple[str, Dict[str, Any]]] = field(default_factory=dict)


def _real_query_slice(side: str, src_len: int, src_width: int, tgt_len: int) -> slice:
    """Which query positions of a padded batch row are real tokens."""
    if side == "encoder":  # fairseq left-pads sources
        return slice(src_width - src_len, src_width)
    return slice(0, tgt_len)  # targets are right-padded


def _real_key_slice(side: str, src_len: int, src_width: int, tgt_len: int) -> slice:
    if side == "decoder":
        return slice(0, tgt_len)
    return slice(src_width - src_len, src_width)


def batch_iterator(task, split: str, batch_size: int):
    """fairseq's batches of ``split``, in the dataset's length order, no shuffling."""
    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        raise AnalysisError(f"split {split!r}: {e}") from None
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=False)
    return dataset, itr


def iter_samples(
    task,
    split: str,
    *,
    batch_size: int = 32,
    max_sentences: Optional[int] = None,
    use_cuda: bool = False,
    show_progress: bool = True,
    desc: str = "forward",
) -> Iterator[dict]:
    """fairseq's samples of ``split`` in the dataset's order (moved to the GPU with
    ``use_cuda``), with a progress bar over sentences; stops after the batch that
    reaches ``max_sentences`` (whole batches: the caller cuts the last one if needed)."""
    dataset, itr = batch_iterator(task, split, batch_size)
    total = len(dataset) if max_sentences is None else min(max_sentences, len(dataset))
    bar = progress(total=total, desc=desc, disable=not show_progress)
    done = 0
    try:
        for sample in itr:
            if done >= total:
                break
            if use_cuda:
                from fairseq import utils

                sample = utils.move_to_cuda(sample)
            n = min(sample["id"].numel(), total - done)
            done += n
            bar.update(n)
            yield sample
    finally:
        bar.close()


def iter_sentence_stats(
    model,
    task,
    split: str,
    *,
    max_sentences: Optional[int] = None,
    batch_size: int = 32,
    with_attention: bool = False,
    use_cuda: bool = False,
    show_progress: bool = True,
    desc: str = "forward",
) -> Iterator[SentenceStats]:
    """Run ``model`` teacher-forced over ``split`` of ``task`` inside an
    :class:`AttentionRecorder` and yield one :class:`SentenceStats` per sentence.

    ``with_attention`` keeps the ``probs_*`` distributions (large).
    """
    import torch

    from fairseq_localness.modules.observe import PROBS_PREFIX, AttentionRecorder

    pad = task.source_dictionary.pad()
    tgt_pad = task.target_dictionary.pad()
    done = 0
    for sample in iter_samples(task, split, batch_size=batch_size, max_sentences=max_sentences,
                               use_cuda=use_cuda, show_progress=show_progress, desc=desc):
        net_input = sample["net_input"]
        with AttentionRecorder(model) as rec, torch.no_grad():
            model(**net_input)
        src_tokens = net_input["src_tokens"].cpu()
        src_width = src_tokens.size(1)
        src_lens = src_tokens.ne(pad).sum(1).tolist()
        target = sample["target"].cpu() if sample.get("target") is not None else None
        tgt_lens = target.ne(tgt_pad).sum(1).tolist() if target is not None else [0] * len(src_lens)
        for b, sent_id in enumerate(sample["id"].tolist()):
            if max_sentences is not None and done >= max_sentences:
                return
            stats = SentenceStats(
                id=sent_id,
                src=src_tokens[b, src_width - src_lens[b]:],
                tgt=target[b, : tgt_lens[b]] if target is not None else None,
            )
            for module_name, calls in rec.records.items():
                side = side_of(module_name)
                rows = _real_query_slice(side, src_lens[b], src_width, tgt_lens[b])
                values = {}
                for name, value in calls[0].items():
                    if name.startswith(PROBS_PREFIX):
                        if not with_attention:
                            continue
                        cols = _real_key_slice(side, src_lens[b], src_width, tgt_lens[b])
                        values[name] = value[b][..., rows, cols]
                    else:
                        values[name] = value[b][..., rows]
                if values:
                    stats.modules[module_name] = (side, values)
            done += 1
            yield stats


# --------------------------------------------------------------------------- text -> model input
class Segmenter:
    """The model's subword segmentation of raw (tokenized) text: sentencepiece,
    subword-nmt codes, or none (text already segmented)."""

    METHODS = ("sentencepiece", "subword_nmt", "none")

    def __init__(self, method: str = "none", sentencepiece_model: Optional[str] = None,
                 bpe_codes: Optional[str] = None):
        method = method.replace("-", "_")
        if method not in self.METHODS:
            raise AnalysisError(f"--bpe {method!r}: allowed: {', '.join(self.METHODS)}")
        self.method = method
        self._sp = self._bpe = None
        if method == "sentencepiece":
            if not sentencepiece_model:
                raise AnalysisError("--bpe sentencepiece needs --sentencepiece-model")
            require_file(sentencepiece_model, "--sentencepiece-model")
            import sentencepiece as spm

            self._sp = spm.SentencePieceProcessor(model_file=sentencepiece_model)
        elif method == "subword_nmt":
            if not bpe_codes:
                raise AnalysisError("--bpe subword_nmt needs --bpe-codes")
            require_file(bpe_codes, "--bpe-codes")
            from subword_nmt.apply_bpe import BPE

            with open(bpe_codes, encoding="utf-8") as f:
                self._bpe = BPE(f)

    def __call__(self, line: str) -> str:
        line = line.strip()
        if self._sp is not None:
            return " ".join(self._sp.encode(line, out_type=str))
        if self._bpe is not None:
            return self._bpe.process_line(line)
        return line


def add_segmenter_args(p: argparse.ArgumentParser):
    p.add_argument("--bpe", default="none", choices=["sentencepiece", "subword_nmt", "subword-nmt", "none"],
                   help="segmentation applied to raw sentences before looking them up in the model's "
                   "dictionary (default: none, i.e. already segmented)")
    p.add_argument("--sentencepiece-model", default=None, help="the model's sentencepiece model (--bpe sentencepiece)")
    p.add_argument("--bpe-codes", default=None, help="the model's subword-nmt codes (--bpe subword_nmt)")


def segmenter_from_args(args) -> Segmenter:
    return Segmenter(args.bpe, args.sentencepiece_model, args.bpe_codes)


def encode_lines(lines: Sequence[str], dictionary, segmenter: Segmenter, max_positions: Optional[int] = None):
    """Raw lines -> token id tensors (with EOS) of ``dictionary``; also returns the
    share of subwords that were unknown to the dictionary."""
    encoded, unk, total = [], 0, 0
    for line in lines:
        ids = dictionary.encode_line(segmenter(line), add_if_not_exist=False, append_eos=True).long()
        if max_positions is not None and ids.numel() > max_positions:
            ids = ids[: max_positions - 1].tolist() + [dictionary.eos()]
            import torch

            ids = torch.tensor(ids, dtype=torch.long)
        unk += int((ids == dictionary.unk()).sum())
        total += ids.numel() - 1
        encoded.append(ids)
    return encoded, unk / max(total, 1)


def collate_source(tokens: Sequence, dictionary, use_cuda: bool = False):
    """Left-padded ``src_tokens`` (B x T) and ``src_lengths`` (B), as fairseq's
    translation task builds them."""
    import torch
    from fairseq.data import data_utils

    src = data_utils.collate_tokens(list(tokens), dictionary.pad(), dictionary.eos(), left_pad=True)
    lengths = torch.tensor([t.numel() for t in tokens], dtype=torch.long)
    if use_cuda:
        src, lengths = src.cuda(), lengths.cuda()
    return src, lengths


# --------------------------------------------------------------------------- subwords -> words
def piece_surface(piece: str) -> str:
    """A subword's characters without segmentation marks (sentencepiece's ``▁``,
    subword-nmt's trailing ``@@``)."""
    if piece.endswith("@@"):
        piece = piece[:-2]
    return piece.replace("\u2581", "")


def words_from_pieces(pieces: Sequence[str]) -> List[int]:
    """Word index of each subword from the segmentation marks alone: sentencepiece
    (a piece starting with ``▁`` starts a word) or subword-nmt (a piece ending in
    ``@@`` continues into the next)."""
    if any(p.startswith("\u2581") for p in pieces):
        out, w = [], -1
        for p in pieces:
            if p.startswith("\u2581") or w < 0:
                w += 1
            out.append(w)
        return out
    out, w, cont = [], 0, False
    for i, p in enumerate(pieces):
        if i > 0 and not cont:
            w += 1
        out.append(w)
        cont = p.endswith("@@")
    return out


def align_pieces_to_words(pieces: Sequence[str], words: Sequence[str]) -> Optional[List[int]]:
    """Word index of each subword, aligning by characters (whitespace ignored): a
    subword belongs to the word in which its first character lies. Works whatever
    tokenization produced ``words`` as long as both spell the same characters;
    returns None when they do not (e.g. unknown pieces, escaped characters)."""
    chars = "".join(piece_surface(p) for p in pieces)
    if chars != "".join(words):
        return None
    owner = []
    for i, w in enumerate(words):
        owner.extend([i] * len(w))
    out, pos = [], 0
    for p in pieces:
        s = piece_surface(p)
        if not s:  # a bare "▁" piece: attach to the next word
            out.append(owner[pos] if pos < len(owner) else len(words) - 1)
            continue
        out.append(owner[pos])
        pos += len(s)
    return out


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()
