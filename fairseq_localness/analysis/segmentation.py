"""Raw text to model input and subwords back to words: the model's subword
segmentation (sentencepiece, subword-nmt or none), encoding lines with the model's
dictionary, collating them as fairseq's translation task does, and aligning subwords
with the words of a tokenization."""
import argparse
from typing import List, Optional, Sequence

from fairseq_localness.analysis.cli_args import AnalysisError, require_file


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
