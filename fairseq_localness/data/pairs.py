"""From the raw files of a dataset to its sentence pairs: reading each part of each
split (:class:`PartReader`), turning each read pair into its raw and word-segmented
forms with the recipe's normalisation, lowercasing and length cleaning
(:class:`PairProcessor`, in forked worker processes for large training sets:
:func:`process`), and writing the splits (:class:`SplitWriter`).
:func:`fairseq_localness.data.prepare.prepare_raw` puts them together.
"""
import itertools
import multiprocessing
import os
import re
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Tuple

from .recipes import Part, Recipe
from .sources import PrepareError, RawFiles
from .text import make_segmenter, moses_counter, moses_normalizer, read_aspec, read_segs, read_tags_pairs, read_text_pairs

SPLITS = ("train", "valid", "test")


_CONTROL = re.compile(r"[\x00-\x1f]")


def _solid(ch: str) -> bool:
    """A character the Moses tokenizer never splits next to: ASCII letters and
    digits, letters of the Latin-1, Latin Extended-A/B and Latin Extended Additional
    blocks."""
    o = ord(ch)
    return (o < 128 and ch.isalnum()) or (ch.isalpha() and (0xC0 <= o < 0x250 or 0x1E00 <= o <= 0x1EFF))


class PairProcessor:
    """Turns a read (src, tgt) pair into (raw_src, raw_tgt, seg_src, seg_tgt), or
    None for a training pair removed by the length cleaning."""

    def __init__(self, recipe: Recipe, src: str, tgt: str, train: bool):
        self.langs = (src, tgt)
        self.train = train
        self.lowercase = recipe.lowercase
        self.apostrophe = recipe.eval_apostrophe and not train
        segs = recipe.segmenters
        self.seg: Dict[str, Callable[[str], str]] = {l: make_segmenter(segs[l]) for l in self.langs if l in segs}
        self.norm: Dict[str, Callable[[str], str]] = (
            {l: moses_normalizer(l) for l in self.langs} if recipe.normalize_train and train else {})
        clean = recipe.clean
        self.clean = clean if train else None
        self.count: Dict[str, Callable[[str], int]] = {}
        if train and (clean.max_len or clean.ratio or clean.min_len > 1):
            for l in self.langs:
                self.count[l] = ((lambda text: len(text.split())) if l in self.seg
                                 else moses_counter(l, clean.aggressive_dash))

    def bounds(self, lang: str, text: str) -> Tuple[int, int]:
        """Lower and upper bound of the token count without tokenizing: segmented
        text counts its words; the Moses tokenizer only ever splits, so a sentence has
        at least its whitespace tokens (control characters, which it deletes, aside)
        and at most two more per character outside ASCII letters and digits and the
        Latin letter blocks (each such character may be padded on both sides)."""
        if lang in self.seg:
            n = len(text.split())
            return n, n
        low = len(_CONTROL.sub("", text).split())
        return low, len(text.split()) + 2 * sum(1 for ch in text if not _solid(ch) and not ch.isspace())

    def keep(self, s: str, t: str) -> bool:
        """The cleaning decision; the tokenizer runs only when the bounds of the
        token counts leave it open (exactly the decision of counting every pair)."""
        c = self.clean
        (ls, us), (lt, ut) = self.bounds(self.langs[0], s), self.bounds(self.langs[1], t)
        if us < c.min_len or ut < c.min_len or (c.max_len and (ls > c.max_len or lt > c.max_len)):
            return False
        if c.ratio and us and ut and (ls / ut > c.ratio or lt / us > c.ratio):
            return False
        if (ls >= c.min_len and lt >= c.min_len and (not c.max_len or (us <= c.max_len and ut <= c.max_len))
                and (not c.ratio or (ls and lt and us / lt <= c.ratio and ut / ls <= c.ratio))):
            return True
        return self.keep_exact(s, t)

    def keep_exact(self, s: str, t: str) -> bool:
        c = self.clean
        ns, nt = self.count[self.langs[0]](s), self.count[self.langs[1]](t)
        if ns < c.min_len or nt < c.min_len:
            return False
        if c.max_len and (ns > c.max_len or nt > c.max_len):
            return False
        if c.ratio and (not ns or not nt or ns / nt > c.ratio or nt / ns > c.ratio):
            return False
        return True

    def __call__(self, pair: Tuple[str, str]) -> Optional[Tuple[str, str, str, str]]:
        out = []
        for lang, text in zip(self.langs, pair):
            if self.apostrophe:
                text = text.replace("\u2019", "'")
            if lang in self.norm:
                text = self.norm[lang](text)
            out.append(text)
        s, t = out
        seg_s = self.seg[self.langs[0]](s) if self.langs[0] in self.seg else s
        seg_t = self.seg[self.langs[1]](t) if self.langs[1] in self.seg else t
        if self.clean is not None:
            if not s or not t:
                return None
            if self.count and not self.keep(seg_s, seg_t):
                return None
        if self.lowercase:
            s, t, seg_s, seg_t = s.lower(), t.lower(), seg_s.lower(), seg_t.lower()
        return s, t, seg_s, seg_t


_WORKER: Optional[PairProcessor] = None


def _process_chunk(chunk: List[Tuple[str, str]]) -> List[Optional[Tuple[str, str, str, str]]]:
    return [_WORKER(p) for p in chunk]


def _chunks(pairs: Iterable[Tuple[str, str]], n: int) -> Iterator[List[Tuple[str, str]]]:
    it = iter(pairs)
    while True:
        chunk = list(itertools.islice(it, n))
        if not chunk:
            return
        yield chunk


def process(processor: PairProcessor, pairs: Iterable[Tuple[str, str]], workers: int
            ) -> Iterator[Optional[Tuple[str, str, str, str]]]:
    """processor over pairs, in order; with workers > 1 in forked processes, fed a
    bounded window of chunks at a time (a corpus of millions of lines is never held
    in memory)."""
    global _WORKER
    if workers <= 1:
        yield from map(processor, pairs)
        return
    _WORKER = processor
    chunks = _chunks(pairs, 2000)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            while True:
                window = list(itertools.islice(chunks, 4 * workers))
                if not window:
                    break
                for results in pool.map(_process_chunk, window):
                    yield from results
    finally:
        _WORKER = None


# --------------------------------------------------------------------------- reading the parts
class PartReader:
    def __init__(self, recipe: Recipe, files: RawFiles, src: str, tgt: str):
        self.recipe, self.files, self.src, self.tgt = recipe, files, src, tgt
        self.paths: Dict[Tuple[str, str], str] = {}

    def locate_all(self) -> None:
        """Find every member of every split; extract them (one pass per archive)."""
        self.located: Dict[Tuple[str, int], Optional[Tuple]] = {}
        problems = []
        wanted = []
        for split in SPLITS:
            for part in self.recipe.parts(split):
                sides = part.members(self.src, self.tgt)
                locs = []
                for side, alternatives in zip((self.src, self.tgt), sides):
                    loc = next((l for l in map(self.files.locate, alternatives) if l is not None), None)
                    if loc is None and not part.optional:
                        where = ", ".join(s.name for s in part.sources)
                        pats = " or ".join(f"'{m.label()}'" for m in alternatives)
                        problems.append(f"{split} {part.name} ({side}): {pats} in {where}")
                    locs.append(loc)
                if part.optional and None in locs:
                    self.located[(split, id(part))] = None
                    continue
                self.located[(split, id(part))] = tuple(locs)
                wanted += [l for l in locs if l is not None]
        if problems:
            raise PrepareError("--raw-dir: expected files not found inside the raw files of "
                               f"{self.recipe.name}: " + "; ".join(problems)
                               + ". Check that they are the original downloads.")
        self.paths = self.files.extract(wanted)

    def pairs(self, split: str, part: Part) -> Optional[Iterator[Tuple[str, str]]]:
        locs = self.located[(split, id(part))]
        if locs is None:
            return None
        ps, pt = (self.paths[(s.name, n)] for s, n in locs)
        label = f"{part.name} ({ps}, {pt})"
        if part.fmt == "text":
            return read_text_pairs(ps, pt, label)
        if part.fmt == "tags":
            return read_tags_pairs(ps, pt, label)
        if part.fmt in ("xml", "sgm"):
            a, b = read_segs(ps, part.fmt == "xml"), read_segs(pt, part.fmt == "xml")
            if len(a) != len(b) or not a:
                raise PrepareError(f"--raw-dir: {part.name}: {ps} has {len(a)} <seg> lines and {pt} has "
                                   f"{len(b)}; expected the same non-zero number (source and reference "
                                   "of one test set)")
            return iter(zip(a, b))
        if part.fmt == "aspec":
            pairs = read_aspec(ps, label)
            if self.src == "ja":
                return pairs
            return ((en, ja) for ja, en in pairs)
        raise ValueError(part.fmt)


class SplitWriter:
    def __init__(self, out: str, split: str, langs: Tuple[str, str], with_seg: bool):
        self.n = 0
        self.files = [open(os.path.join(out, "raw", f"{split}.{l}"), "w", encoding="utf-8") for l in langs]
        if with_seg:
            self.files += [open(os.path.join(out, "seg", f"{split}.{l}"), "w", encoding="utf-8") for l in langs]

    def write(self, result: Tuple[str, str, str, str]) -> None:
        for f, text in zip(self.files, result):
            f.write(text + "\n")
        self.n += 1

    def close(self) -> None:
        for f in self.files:
            f.close()
