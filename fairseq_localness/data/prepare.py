"""``fairseq-localness-prepare``: the Python half of scripts/prepare_data.sh.

    fairseq-localness-prepare list     [--dataset NAME]
    fairseq-localness-prepare check    --dataset NAME [--raw-dir DIR] [--out DIR] [--variant V]
                                       [--src L --tgt L] [--bpe M] [--bpe-size N] [--bpe-joint yes|no]
                                       [--download] [--force]
    fairseq-localness-prepare plan     (the options of check)
    fairseq-localness-prepare download --dataset NAME [--raw-dir DIR]
    fairseq-localness-prepare verify   --dataset NAME [--raw-dir DIR]
    fairseq-localness-prepare raw      --dataset NAME [--raw-dir DIR] --out DIR [--variant V]
                                       [--src L --tgt L] [--bpe M] [--bpe-size N] [--bpe-joint yes|no]
                                       [--workers N]

The datasets are described by their manifests, ``data/manifests/<NAME>.json``
(:mod:`.recipes`). ``list`` prints every dataset (or one) with its files, URLs,
published sizes and checksums, variants, licence and the tables that use it.
``check`` validates a request without writing anything and prints the resolved
settings as shell assignments (``SRC=de``, ``BPE=subword-nmt``, ``RAW=...``,
``OUT=...``, ..., ``STATUS=new|replace|prepared``); ``plan`` prints what a
reproduce script needs to know without looking at any file (the prepared
directory's NAME, the VARIANT, the test set, which files need a manual step).
``download`` fetches the dataset's missing files into the raw directory (with
progress bars, checked against the published sizes and checksums); ``verify``
checks the files that are there against them. ``raw`` writes
``OUT/raw/{train,valid,test}.{SRC,TGT}`` (cleaned, untokenized), ``OUT/seg/`` (word-
segmented, only for Japanese and Chinese) and ``OUT/PREPARED`` (JSON: the request,
the sizes of the splits and of every corpus in them); OUT must not exist or be
empty. scripts/prepare_data.sh runs check, download, raw, then the subword model
(prepare_bpe.sh) and binarization (preprocess.sh), and renames the result into place.

Defaults: the raw files of dataset NAME in ``data/downloads/NAME/`` and the prepared
dataset in ``data/prepared/<name of the request>/`` (:func:`prepared_name`), both
under the repository's ``data/`` (git-ignored; see data/README.md).

Bad options or inputs stop with exit status 2 and a message naming them.
"""
import argparse
import json
import logging
import os
import shlex
import shutil
import sys
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from .pairs import SPLITS, PairProcessor, PartReader, SplitWriter, process
from .recipes import ALL, DATASETS, MANIFEST_DIR, RECIPES, Recipe, recipe_for
from .sources import PrepareError, RawFiles, download, missing_message, missing_sources, progress, verify
from .text import SEGMENTERS, check_segmenter

logger = logging.getLogger(__name__)

BPE_METHODS = ("subword-nmt", "sentencepiece")
RECORD_FORMAT = 2
REQUEST_KEYS = ("dataset", "variant", "src", "tgt", "bpe", "bpe_size", "bpe_joint")
#: The repository's data/ folder: manifests/, and (git-ignored) downloads/ and prepared/.
DATA_ROOT = os.path.dirname(MANIFEST_DIR)


def default_raw_dir(dataset: str) -> str:
    return os.path.join(DATA_ROOT, "downloads", dataset)


def prepared_name(request: dict) -> str:
    """The directory name of a prepared dataset:
    ``<dataset>[-<variant>].<src>-<tgt>.<bpe><size>[.separate]`` (the variant only
    for datasets that have variants; ``.separate`` for separate subword models and
    dictionaries per language)."""
    variant = f"-{request['variant']}" if request.get("variant") else ""
    joint = "" if request.get("bpe_joint", True) else ".separate"
    return (f"{request['dataset']}{variant}.{request['src']}-{request['tgt']}."
            f"{request['bpe']}{request['bpe_size']}{joint}")


def default_out(request: dict) -> str:
    return os.path.join(DATA_ROOT, "prepared", prepared_name(request))


def yes_no(option: str, value: Optional[str]) -> Optional[bool]:
    if value is None:
        return None
    if value not in ("yes", "no"):
        raise PrepareError(f"{option}: expected yes or no, got '{value}'")
    return value == "yes"


# --------------------------------------------------------------------------- the request
def resolve(dataset: str, src: Optional[str] = None, tgt: Optional[str] = None,
            bpe: Optional[str] = None, bpe_size: Optional[int] = None, bpe_joint: Optional[bool] = None,
            variant: Optional[str] = None) -> Tuple[Recipe, dict]:
    """The recipe (of the variant) and the complete request (defaults filled in);
    PrepareError for a bad value."""
    recipe = recipe_for(dataset, variant)
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
    if bpe_joint is None:
        bpe_joint = recipe.bpe_joint
    request = dict(dataset=dataset, variant=recipe.variant, src=src, tgt=tgt, bpe=bpe, bpe_size=bpe_size,
                   bpe_joint=bool(bpe_joint))
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
        same = (record is not None and record.get("format") == RECORD_FORMAT
                and all(record.get(k) == request[k] for k in REQUEST_KEYS))
        if not force:
            if same:
                return dict(STATUS="prepared")
            if record is None:
                what = "not a prepared dataset"
            elif record.get("format") != RECORD_FORMAT:
                what = "prepared by an older version of this script"
            else:
                what = "prepared for " + ", ".join(f"{k}={record.get(k)}" for k in REQUEST_KEYS)
            raise PrepareError(f"--out: '{out}' already exists ({what}); expected a new directory, "
                               "or pass --force to replace it")
    if not os.path.isdir(raw_dir) and not do_download:
        raise PrepareError(f"--raw-dir: expected a directory at '{raw_dir}', which does not exist "
                           "(or pass --download to create it and download the data)")
    missing = missing_sources(recipe.sources, raw_dir)
    if missing and (not do_download or any(not s.downloadable for s in missing)):
        raise PrepareError(missing_message(recipe.name, raw_dir, missing, do_download))
    for source in recipe.sources:
        path = source.find(raw_dir)
        warning = source.check_size(path) if path else None
        if warning:
            logger.warning("warning: %s (fairseq-localness-prepare verify checks the checksums)", warning)
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
        BPE_JOINT="yes" if request["bpe_joint"] else "no", VARIANT=request["variant"] or "",
        TOKENIZE=tokenization(request["bpe"]), BPE_INPUT="seg" if segmented(recipe, request) else "raw",
        STATUS="replace" if os.path.exists(out) else "new", MISSING=str(len(missing)),
    )


def plan(recipe: Recipe, request: dict) -> dict:
    """What a reproduce script prints and needs for one request, from the manifest
    alone: the prepared directory's name, the variant and its description, the test
    set, and the files that --download cannot fetch."""
    manual = [s for s in recipe.sources if not s.downloadable]
    how: Dict[str, List[str]] = {}
    for s in manual:
        how.setdefault(s.manual, []).append(s.name)
    return dict(
        NAME=prepared_name(request), VARIANT=request["variant"] or "", VARIANTS=" ".join(recipe.variants),
        VARIANT_DESCRIPTION=recipe.variant_description, TEST=recipe.test_description,
        DOWNLOAD="none" if len(manual) == len(recipe.sources) else "some" if manual else "all",
        MANUAL="; ".join(f"{', '.join(names)} ({text})" for text, names in how.items()),
        BPE_JOINT="yes" if request["bpe_joint"] else "no",
    )


def segmented(recipe: Recipe, request: dict) -> bool:
    return any(lang in recipe.segmenters for lang in (request["src"], request["tgt"]))


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
                    logger.info("%s: %s: not in the raw files (optional), skipped", split, part.name)
                    parts_record[split][part.name] = None
                    continue
                n_read = n_kept = 0
                counted = _count(pairs)
                bar = progress(process(processor, counted, workers if split == "train" else 1),
                               desc=f"{split} {part.name}", unit=" pairs", unit_scale=True)
                for result in bar:
                    if result is None:
                        continue
                    n_kept += 1
                    if split == "train" and recipe.valid_every and n_kept % recipe.valid_every == 0:
                        writers["valid"].write(result)
                    else:
                        writers[split].write(result)
                bar.close()
                n_read = counted.n
                parts_record[split][part.name] = {"read": n_read, "kept": n_kept}
                logger.info("%s: %s: %d pairs read, %d kept", split, part.name, n_read, n_kept)
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
        cleaning=recipe.clean.describe(), splits_from=recipe.splits_from, test_set=recipe.test_description,
        variant_description=recipe.variant_description,
        bpe_default=f"{recipe.bpe} {recipe.bpe_size} ({recipe.bpe_from})",
        raw_dir=os.path.abspath(raw_dir),
    )
    with open(os.path.join(out, "PREPARED"), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, ensure_ascii=False)
        f.write("\n")
    logger.info("%s %s->%s: train %d, valid %d, test %d pairs", recipe.name, src, tgt,
                sizes["train"], sizes["valid"], sizes["test"])
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
def describe_source(s) -> List[str]:
    out = [f"  {s.describe()}"]
    published = []
    if s.size:
        published.append(f"{s.size:,} bytes")
    published += [f"{a} {h}" for a, h in s.whole.checksums.items()]
    for p in s.parts:
        published.append(f"part {os.path.basename(p.url)}: " + ", ".join(
            ([f"{p.size:,} bytes"] if p.size else []) + [f"{a} {h}" for a, h in p.checksums.items()]))
    if published:
        out.append(f"      published: {'; '.join(published)} ({s.checksum_from})")
    return out


def describe_datasets(names: Sequence[str] = DATASETS) -> str:
    out = []
    for name in names:
        r = RECIPES[name]
        out.append(f"{r.name}: {r.title}; directions {', '.join(a + '->' + b for a, b in r.pairs)}; "
                   f"default {r.bpe} {r.bpe_size} ({'joint' if r.bpe_joint else 'one model per language'})")
        for v in r.variants:
            out.append(f"  variant {v}{' (default)' if v == r.default_variant else ''}: "
                       f"{ALL[name][v].variant_description}")
        out.append(f"  test set: {r.test_description}")
        out.append(f"  used by: {', '.join(r.used_by) or '-'}")
        out.append(f"  licence: {r.licence}")
        out.append(f"  files (under data/downloads/{r.name}/ by default):")
        for s in r.sources:
            out += describe_source(s)
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fairseq-localness-prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prog", default=None, help="program name in messages")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list", help="datasets, their files, URLs, checksums, variants and licences")
    ls.add_argument("--dataset", help="only this one")
    for name in ("check", "plan", "download", "verify", "raw"):
        s = sub.add_parser(name)
        s.add_argument("--dataset", required=True)
        if name != "plan":
            s.add_argument("--raw-dir", help="default: data/downloads/DATASET")
        if name in ("check", "plan", "raw"):
            s.add_argument("--out", required=(name == "raw"), help="default: data/prepared/<name of the request>")
            s.add_argument("--variant")
            s.add_argument("--src")
            s.add_argument("--tgt")
            s.add_argument("--bpe")
            s.add_argument("--bpe-size", type=int)
            s.add_argument("--bpe-joint", help="yes (one subword model and dictionary) or no (one per language)")
        if name == "plan":
            s.add_argument("--more", action="store_true", help="more requests on standard input, one per line")
            s.add_argument("--prefer-variant", help="this variant for the datasets that have it")
        if name == "check":
            s.add_argument("--download", action="store_true")
            s.add_argument("--force", action="store_true")
        if name == "raw":
            s.add_argument("--workers", type=int, default=1)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    prog = args.prog or "fairseq-localness-prepare"
    logging.basicConfig(level=logging.INFO, format=f"{prog}: %(message)s", stream=sys.stderr, force=True)
    try:
        if args.cmd == "list":
            if args.dataset:
                recipe_for(args.dataset)
            print(describe_datasets([args.dataset] if args.dataset else DATASETS))
            return 0
        raw_dir = getattr(args, "raw_dir", None) or default_raw_dir(args.dataset)
        if args.cmd in ("download", "verify"):
            recipe, _ = resolve(args.dataset)
            if args.cmd == "verify":
                return _verify_files(recipe, raw_dir)
            os.makedirs(raw_dir, exist_ok=True)
            missing = missing_sources(recipe.sources, raw_dir)
            manual = [s for s in missing if not s.downloadable]
            if manual:
                raise PrepareError(missing_message(recipe.name, raw_dir, missing, True))
            download(missing, raw_dir)
            return 0
        recipe, request = resolve(args.dataset, args.src, args.tgt, args.bpe, args.bpe_size,
                                  yes_no("--bpe-joint", args.bpe_joint), args.variant)
        out = args.out or default_out(request)
        if args.cmd == "plan":
            # with --more, more requests on standard input, one per line (the options of
            # plan), and one block of assignments each, separated by a line '--' (for the
            # reproduce drivers, which plan every row in one call)
            requests = [args] + [_parser().parse_args(["plan"] + shlex.split(line))
                                 for line in (sys.stdin if args.more else []) if line.strip()]
            blocks = []
            for r in requests:
                variant = r.variant
                if args.prefer_variant and args.prefer_variant in recipe_for(r.dataset).variants:
                    variant = variant or args.prefer_variant
                blocks.append(plan(*resolve(r.dataset, r.src, r.tgt, r.bpe, r.bpe_size,
                                            yes_no("--bpe-joint", r.bpe_joint), variant)))
            print("\n--\n".join("\n".join(f"{k}={shlex.quote(v)}" for k, v in b.items()) for b in blocks))
            return 0
        if args.cmd == "check":
            settings = dict(check(recipe, request, raw_dir, out, args.download, args.force), RAW=raw_dir, OUT=out)
            for k, v in settings.items():
                print(f"{k}={shlex.quote(v)}")
            return 0
        if args.workers < 1:
            raise PrepareError(f"--workers: expected a whole number >= 1, got '{args.workers}'")
        prepare_raw(recipe, request, raw_dir, out, workers=args.workers)
        return 0
    except PrepareError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def _verify_files(recipe: Recipe, raw_dir: str) -> int:
    """verify: each file that is there against its published size and checksums."""
    bad = 0
    for source in recipe.sources:
        path = source.find(raw_dir)
        if path is None:
            logger.info("%s: not in %s", source.name, raw_dir)
        elif not source.whole.published:
            logger.info("%s: nothing published to check it against", path)
        else:
            problems = verify(source, path)
            if problems:
                bad += 1
                logger.error("%s: differs from what is published (%s): %s", path, source.checksum_from,
                             "; ".join(problems))
            else:
                logger.info("%s: matches what is published", path)
    if bad:
        raise PrepareError(f"{bad} file(s) of {recipe.name} in {raw_dir} differ from what is published (see above)")
    return 0


def cli_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli_main()
