"""``fairseq-localness-prepare``: the Python half of scripts/prepare_data.sh.

    fairseq-localness-prepare list
    fairseq-localness-prepare check    --dataset NAME --raw-dir DIR --out DIR [--src L --tgt L]
                                       [--bpe M] [--bpe-size N] [--download] [--force]
    fairseq-localness-prepare download --dataset NAME --raw-dir DIR
    fairseq-localness-prepare raw      --dataset NAME --raw-dir DIR --out DIR [--src L --tgt L]
                                       [--bpe M] [--bpe-size N] [--workers N]

``list`` prints every dataset with its files and URLs. ``check`` validates a request
without writing anything and prints the resolved settings as shell assignments
(``SRC=de``, ``BPE=subword-nmt``, ..., ``STATUS=new|replace|prepared``).
``download`` fetches the dataset's missing files into --raw-dir. ``raw`` writes
``OUT/raw/{train,valid,test}.{SRC,TGT}`` (cleaned, untokenized), ``OUT/seg/`` (word-
segmented, only for Japanese and Chinese) and ``OUT/PREPARED`` (JSON: the request,
the sizes of the splits and of every corpus in them); OUT must not exist or be
empty. scripts/prepare_data.sh runs check, download, raw, then the subword model
(prepare_bpe.sh) and binarization (preprocess.sh), and renames the result into place.

Bad options or inputs stop with exit status 2 and a message naming them.
"""
import argparse
import itertools
import json
import multiprocessing
import os
import re
import shlex
import shutil
import sys
from typing import Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .recipes import DATASETS, RECIPES, Part, Recipe
from .sources import PrepareError, RawFiles, download, missing_message, missing_sources
from .text import (SEGMENTERS, check_segmenter, make_segmenter, moses_counter, moses_normalizer,
                   read_aspec, read_segs, read_tags_pairs, read_text_pairs)

BPE_METHODS = ("subword-nmt", "sentencepiece")
SPLITS = ("train", "valid", "test")
RECORD_FORMAT = 1
REQUEST_KEYS = ("dataset", "src", "tgt", "bpe", "bpe_size")


# --------------------------------------------------------------------------- the request
def resolve(dataset: str, src: Optional[str] = None, tgt: Optional[str] = None,
            bpe: Optional[str] = None, bpe_size: Optional[int] = None) -> Tuple[Recipe, dict]:
    """The recipe and the complete request (defaults filled in); PrepareError for a
    bad value."""
    if dataset not in RECIPES:
        raise PrepareError(f"--dataset: expected one of: {' '.join(DATASETS)}; got '{dataset}'")
    recipe = RECIPES[dataset]
    allowed = " or ".join(f"--src {a} --tgt {b}" for a, b in recipe.pairs)
    if (src is None) != (tgt is None):
        raise PrepareError(f"--src/--tgt: give both or neither (default {recipe.langs[0]}->{recipe.langs[1]}); "
                           f"{dataset} allows {allowed}")
    if src is None:
        src, tgt = recipe.langs
    if (src, tgt) not in recipe.pairs:
        raise PrepareError(f"--src/--tgt: {dataset} has no {src}->{tgt} direction; expected {allowed}")
    bpe = bpe or recipe.bpe
    if bpe not in BPE_METHODS:
        raise PrepareError(f"--bpe: expected one of: {' '.join(BPE_METHODS)}; got '{bpe}'")
    if bpe_size is None:
        bpe_size = recipe.bpe_size
    minimum = 16 if bpe == "sentencepiece" else 1
    if not isinstance(bpe_size, int) or bpe_size < minimum:
        raise PrepareError(f"--bpe-size: expected a whole number >= {minimum} for {bpe}, got '{bpe_size}'")
    request = dict(dataset=dataset, src=src, tgt=tgt, bpe=bpe, bpe_size=bpe_size)
    return recipe, request


def tokenization(bpe: str) -> str:
    """prepare_bpe.sh's --tokenize: Moses tokens under subword-nmt (the papers'
    pipeline), none under sentencepiece (which needs no pre-tokenization)."""
    return "moses" if bpe == "subword-nmt" else "none"


def read_record(out: str) -> Optional[dict]:
    try:
        with open(os.path.join(out, "PREPARED"), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def check(recipe: Recipe, request: dict, raw_dir: str, out: str, do_download: bool, force: bool) -> dict:
    """Validate everything a run needs before it writes anything; the settings the
    wrapper needs, with STATUS new / replace (existing --out, --force) / prepared
    (--out already holds this request)."""
    if os.path.exists(out):
        record = read_record(out)
        same = record is not None and all(record.get(k) == request[k] for k in REQUEST_KEYS)
        if not force:
            if same:
                return dict(STATUS="prepared")
            what = ("prepared for " + ", ".join(f"{k}={record.get(k)}" for k in REQUEST_KEYS)
                    if record else "not a prepared dataset")
            raise PrepareError(f"--out: '{out}' already exists ({what}); expected a new directory, "
                               "or pass --force to replace it")
    if not os.path.isdir(raw_dir) and not do_download:
        raise PrepareError(f"--raw-dir: expected a directory at '{raw_dir}', which does not exist "
                           "(or pass --download to create it and download the data)")
    missing = missing_sources(recipe.sources, raw_dir)
    if missing and (not do_download or any(not s.downloadable for s in missing)):
        raise PrepareError(missing_message(recipe.name, raw_dir, missing, do_download))
    for lang in (request["src"], request["tgt"]):
        if lang in recipe.segmenters:
            check_segmenter(recipe.segmenters[lang])
    if request["bpe"] == "subword-nmt" or tokenization(request["bpe"]) == "moses":
        try:
            import sacremoses  # noqa: F401
        except ImportError:
            raise PrepareError("Moses tokenization needs the sacremoses package (make install)")
    return dict(
        SRC=request["src"], TGT=request["tgt"], BPE=request["bpe"], BPE_SIZE=str(request["bpe_size"]),
        TOKENIZE=tokenization(request["bpe"]), BPE_INPUT="seg" if segmented(recipe, request) else "raw",
        STATUS="replace" if os.path.exists(out) else "new", MISSING=str(len(missing)),
    )


def segmented(recipe: Recipe, request: dict) -> bool:
    return any(lang in recipe.segmenters for lang in (request["src"], request["tgt"]))


# --------------------------------------------------------------------------- per sentence pair
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


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prepare_raw(recipe: Recipe, request: dict, raw_dir: str, out: str, workers: int = 1) -> dict:
    """Write out/raw, out/seg (Japanese/Chinese) and out/PREPARED; return the record."""
    src, tgt = request["src"], request["tgt"]
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise PrepareError(f"--out: '{out}' exists and is not an empty directory; expected a new directory")
    missing = missing_sources(recipe.sources, raw_dir)
    if missing:
        raise PrepareError(missing_message(recipe.name, raw_dir, missing, False))
    with_seg = segmented(recipe, request)
    os.makedirs(os.path.join(out, "raw"), exist_ok=True)
    if with_seg:
        os.makedirs(os.path.join(out, "seg"))
    work = os.path.join(out, "extracted")
    files = RawFiles(raw_dir, work)
    reader = PartReader(recipe, files, src, tgt)
    reader.locate_all()

    parts_record: Dict[str, Dict[str, dict]] = {s: {} for s in SPLITS}
    writers = {s: SplitWriter(out, s, (src, tgt), with_seg) for s in SPLITS}
    try:
        for split in SPLITS:
            processor = PairProcessor(recipe, src, tgt, train=(split == "train"))
            for part in recipe.parts(split):
                pairs = reader.pairs(split, part)
                if pairs is None:
                    log(f"{split}: {part.name}: not in the raw files (optional), skipped")
                    parts_record[split][part.name] = None
                    continue
                n_read = n_kept = 0
                counted = _count(pairs)
                for result in process(processor, counted, workers if split == "train" else 1):
                    if result is None:
                        continue
                    n_kept += 1
                    if split == "train" and recipe.valid_every and n_kept % recipe.valid_every == 0:
                        writers["valid"].write(result)
                    else:
                        writers[split].write(result)
                n_read = counted.n
                parts_record[split][part.name] = {"read": n_read, "kept": n_kept}
                log(f"{split}: {part.name}: {n_read} pairs read, {n_kept} kept")
    finally:
        for w in writers.values():
            w.close()
        shutil.rmtree(work, ignore_errors=True)
    sizes = {s: writers[s].n for s in SPLITS}
    for split, n in sizes.items():
        if n == 0:
            raise PrepareError(f"--raw-dir: the {split} split of {recipe.name} came out empty; "
                               "expected the original files (see docs/data.md)")
    record = dict(
        format=RECORD_FORMAT, **request, title=recipe.title,
        tokenize=tokenization(request["bpe"]),
        segmentation={l: SEGMENTERS[recipe.segmenters[l]][2] for l in (src, tgt) if l in recipe.segmenters},
        lowercase=recipe.lowercase, sizes=sizes, parts=parts_record,
        cleaning=recipe.clean.describe(), splits_from=recipe.splits_from,
        bpe_default=f"{recipe.bpe} {recipe.bpe_size} ({recipe.bpe_from})",
        raw_dir=os.path.abspath(raw_dir),
    )
    with open(os.path.join(out, "PREPARED"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    log(f"{recipe.name} {src}->{tgt}: train {sizes['train']}, valid {sizes['valid']}, test {sizes['test']} pairs")
    return record


class _count:
    """Iterate and count."""

    def __init__(self, it: Iterable):
        self.it, self.n = iter(it), 0

    def __iter__(self):
        for x in self.it:
            self.n += 1
            yield x


# --------------------------------------------------------------------------- command line
def describe_datasets() -> str:
    out = []
    for r in RECIPES.values():
        out.append(f"{r.name}: {r.title}; directions {', '.join(a + '->' + b for a, b in r.pairs)}; "
                   f"default {r.bpe} {r.bpe_size}")
        out += [f"  {s.describe()}" for s in r.sources]
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fairseq-localness-prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prog", default=None, help="program name in error messages")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="datasets, their files and URLs")
    for name in ("check", "download", "raw"):
        s = sub.add_parser(name)
        s.add_argument("--dataset", required=True)
        s.add_argument("--raw-dir", required=True)
        if name != "download":
            s.add_argument("--out", required=True)
            s.add_argument("--src")
            s.add_argument("--tgt")
            s.add_argument("--bpe")
            s.add_argument("--bpe-size", type=int)
        if name == "check":
            s.add_argument("--download", action="store_true")
            s.add_argument("--force", action="store_true")
        if name == "raw":
            s.add_argument("--workers", type=int, default=1)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    prog = args.prog or "fairseq-localness-prepare"
    try:
        if args.cmd == "list":
            print(describe_datasets())
            return 0
        if args.cmd == "download":
            recipe, _ = resolve(args.dataset)
            os.makedirs(args.raw_dir, exist_ok=True)
            missing = missing_sources(recipe.sources, args.raw_dir)
            manual = [s for s in missing if not s.downloadable]
            if manual:
                raise PrepareError(missing_message(recipe.name, args.raw_dir, missing, True))
            download(missing, args.raw_dir)
            return 0
        recipe, request = resolve(args.dataset, args.src, args.tgt, args.bpe, args.bpe_size)
        if args.cmd == "check":
            settings = check(recipe, request, args.raw_dir, args.out, args.download, args.force)
            for k, v in settings.items():
                print(f"{k}={shlex.quote(v)}")
            return 0
        if args.workers < 1:
            raise PrepareError(f"--workers: expected a whole number >= 1, got '{args.workers}'")
        prepare_raw(recipe, request, args.raw_dir, args.out, workers=args.workers)
        return 0
    except PrepareError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def cli_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
