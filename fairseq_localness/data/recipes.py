"""One recipe per dataset, read from its manifest ``data/manifests/<name>.json``: its
files with URLs, sizes and checksums, its splits, cleaning, segmentation, subword
defaults, licence and the paper tables that use it. docs/data.md explains each
dataset and where the choices come from; data/README.md describes the manifest's
fields.

A dataset may have *variants* (``variants`` in the manifest): named sets of overrides
of its splits and casing, e.g. IWSLT14 De-En's ``paper`` (Song et al. 2019's test set,
case kept) and ``fairseq`` (fairseq's split, lowercased). :func:`recipe_for` gives the
recipe of one variant; :data:`RECIPES` holds each dataset's default variant.

Member path patterns may use ``{lang}`` (the language of that side, renamed through
the part's ``lang_names``), ``{src}`` and ``{tgt}`` (the direction being prepared):
``newstest2017-{src}{tgt}-src.{src}.sgm`` is ``newstest2017-zhen-src.zh.sgm`` for
Zh->En and ``newstest2017-enzh-src.en.sgm`` for En->Zh. A part with ``"repeat": [a,
b]`` stands for one part per number i = a..b, with ``{i}`` replaced in its name and
patterns.
"""
import copy
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from .sources import Member, PrepareError, Remote, Source

Pattern = Union[str, Tuple[str, ...]]  # alternatives, tried in order

#: Where the manifests are: ``data/manifests`` at the top of the repository (this
#: package is fairseq_localness/data), or $FAIRSEQ_LOCALNESS_MANIFESTS.
MANIFEST_DIR = os.environ.get("FAIRSEQ_LOCALNESS_MANIFESTS") or os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "data", "manifests")

FORMATS = ("text", "tags", "xml", "sgm", "aspec")
SPLIT_NAMES = ("train", "valid", "test")


@dataclass(frozen=True)
class Part:
    """One corpus or test set inside the raw files, read as (src, tgt) pairs."""

    name: str
    fmt: str  # text | tags | xml | sgm | aspec (see text.py)
    sources: Tuple[Source, ...]
    src: Pattern = ""  # member pattern of the source side ("" for a plain-file source)
    tgt: Optional[Pattern] = None  # default: the same pattern as src
    lang_names: Tuple[Tuple[str, str], ...] = ()  # language code -> name in file names
    optional: bool = False  # used if present in the archive, skipped otherwise

    def members(self, src: str, tgt: str) -> Tuple[Tuple[Member, ...], Tuple[Member, ...]]:
        """Alternative members for the source side and for the target side."""
        names = dict(self.lang_names)

        def fmt(patterns: Pattern, lang: str) -> Tuple[Member, ...]:
            patterns = (patterns,) if isinstance(patterns, str) else patterns
            return tuple(Member(self.sources, p.format(lang=names.get(lang, lang), src=src, tgt=tgt))
                         for p in patterns)

        return fmt(self.src, src), fmt(self.src if self.tgt is None else self.tgt, tgt)


@dataclass(frozen=True)
class Clean:
    """Length cleaning of training pairs, like Moses' clean-corpus-n.perl: a pair is
    kept if both sides have min_len..max_len tokens and neither side is more than
    ``ratio`` times longer than the other. Tokens: Moses tokens (sacremoses, with or
    without aggressive dash splitting), or words of the segmentation for
    Japanese/Chinese."""

    min_len: int = 1
    max_len: Optional[int] = None
    ratio: Optional[float] = None
    aggressive_dash: bool = True  # Moses tokens as with -a (prepare_bpe.sh's) or without it

    def describe(self) -> str:
        out = f"{self.min_len}..{self.max_len if self.max_len else 'any'} tokens per side"
        if self.ratio:
            out += f", length ratio <= {self.ratio}"
        return out


@dataclass(frozen=True)
class Recipe:
    name: str
    langs: Tuple[str, str]  # the name's order = the default direction
    title: str
    sources: Tuple[Source, ...]
    train: Tuple[Part, ...]
    valid: Tuple[Part, ...]
    test: Tuple[Part, ...]
    splits_from: str  # where the split definitions come from
    bpe: str = "subword-nmt"
    bpe_size: int = 32000
    bpe_joint: bool = True  # one subword model and dictionary for both languages
    bpe_from: str = ""
    clean: Clean = Clean()
    valid_every: Optional[int] = None  # every N-th cleaned training pair is moved to valid
    lowercase: bool = False
    normalize_train: bool = False  # Moses punctuation normalization of the training data
    eval_apostrophe: bool = False  # U+2019 -> ' in valid/test (fairseq's recipes)
    segment: Tuple[Tuple[str, str], ...] = ()  # (language, segmenter)
    notes: Tuple[str, ...] = field(default=())
    test_description: str = ""  # the test set in a few words (printed under results tables)
    licence: str = ""
    used_by: Tuple[str, ...] = ()  # reproduce scripts (and rows) that use the dataset
    variant: Optional[str] = None  # this recipe's variant (None: the dataset has none)
    variants: Tuple[str, ...] = ()  # every variant of the dataset, the default first
    variant_description: str = ""
    manifest: str = ""

    @property
    def pairs(self) -> Tuple[Tuple[str, str], Tuple[str, str]]:
        a, b = self.langs
        return (a, b), (b, a)

    @property
    def segmenters(self) -> Dict[str, str]:
        return dict(self.segment)

    @property
    def default_variant(self) -> Optional[str]:
        return self.variants[0] if self.variants else None

    def parts(self, split: str) -> Tuple[Part, ...]:
        return getattr(self, split)


# --------------------------------------------------------------------------- manifests
def _bad(path: str, msg: str) -> PrepareError:
    return PrepareError(f"manifest {path}: {msg}")


def _remote(path: str, d: dict, where: str) -> Remote:
    if not isinstance(d, dict) or not isinstance(d.get("url"), str):
        raise _bad(path, f"{where}: expected an object with a 'url'")
    return Remote(url=d["url"], size=d.get("size"), md5=d.get("md5", ""), sha1=d.get("sha1", ""),
                  sha256=d.get("sha256", ""))


def _sources(path: str, m: dict) -> Dict[str, Source]:
    out = {}
    for sid, d in (m.get("sources") or {}).items():
        where = f"sources.{sid}"
        if not isinstance(d, dict) or not isinstance(d.get("file"), str) or not isinstance(d.get("url"), str):
            raise _bad(path, f"{where}: expected an object with 'file' and 'url'")
        own = _remote(path, d, where)
        out[sid] = Source(
            name=d["file"], url=d["url"], manual=d.get("manual", ""),
            parts=tuple(_remote(path, p, f"{where}.parts[{i}]") for i, p in enumerate(d.get("parts") or [])),
            alternatives=tuple(d.get("alternatives") or ()), description=d.get("description", ""),
            size=own.size, md5=own.md5, sha1=own.sha1, sha256=own.sha256,
            checksum_from=d.get("checksum_from", ""))
    if not out:
        raise _bad(path, "'sources' is empty; expected the files of the dataset")
    return out


def _parts(path: str, split: str, items, sources: Dict[str, Source]) -> Tuple[Part, ...]:
    parts = []
    for k, d in enumerate(items or []):
        where = f"splits.{split}[{k}]"
        if not isinstance(d, dict) or "name" not in d or d.get("format") not in FORMATS:
            raise _bad(path, f"{where}: expected an object with 'name' and 'format' (one of {', '.join(FORMATS)})")
        unknown = [s for s in d.get("from", []) if s not in sources]
        if unknown or not d.get("from"):
            raise _bad(path, f"{where}: 'from' names {unknown or 'no source'}; expected some of: {', '.join(sources)}")
        first, last = d.get("repeat") or (None, None)
        numbers = range(first, last + 1) if first is not None else [None]
        for i in numbers:
            def sub(p):
                if p is None or i is None:
                    return p
                return p.replace("{i}", str(i)) if isinstance(p, str) else tuple(x.replace("{i}", str(i)) for x in p)

            def pat(p):
                return tuple(p) if isinstance(p, list) else p

            parts.append(Part(
                name=sub(d["name"]), fmt=d["format"], sources=tuple(sources[s] for s in d["from"]),
                src=sub(pat(d.get("src", ""))), tgt=sub(pat(d.get("tgt"))),
                lang_names=tuple(sorted((d.get("lang_names") or {}).items())),
                optional=bool(d.get("optional", False))))
    return tuple(parts)


def _recipe(path: str, m: dict, variant: Optional[str], variants: Tuple[str, ...], description: str) -> Recipe:
    try:
        sources = _sources(path, m)
        splits = m.get("splits") or {}
        parts = {s: _parts(path, s, splits.get(s), sources) for s in SPLIT_NAMES}
        bpe = m.get("bpe") or {}
        clean = m.get("clean") or {}
        langs = tuple(m["langs"])
        if len(langs) != 2:
            raise _bad(path, f"'langs': expected two language codes, got {m['langs']}")
        return Recipe(
            name=m["name"], langs=langs, title=m["title"], sources=tuple(sources.values()),
            train=parts["train"], valid=parts["valid"], test=parts["test"], splits_from=m["splits_from"],
            bpe=bpe.get("method", "subword-nmt"), bpe_size=int(bpe.get("size", 32000)),
            bpe_joint=bool(bpe.get("joint", True)), bpe_from=bpe.get("from", ""),
            clean=Clean(clean.get("min_len", 1), clean.get("max_len"), clean.get("ratio"),
                        clean.get("aggressive_dash", True)),
            valid_every=m.get("valid_every"), lowercase=bool(m.get("lowercase", False)),
            normalize_train=bool(m.get("normalize_train", False)),
            eval_apostrophe=bool(m.get("eval_apostrophe", False)),
            segment=tuple(sorted((m.get("segment") or {}).items())), notes=tuple(m.get("notes") or ()),
            test_description=m.get("test_description", ""), licence=m.get("licence", ""),
            used_by=tuple(m.get("used_by") or ()), variant=variant, variants=variants,
            variant_description=description, manifest=path)
    except KeyError as e:
        raise _bad(path, f"missing field {e}")


def load_manifest(path: str) -> Dict[Optional[str], Recipe]:
    """The recipes of one manifest, by variant (the key None holds the default)."""
    try:
        with open(path, encoding="utf-8") as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise PrepareError(f"manifest {path}: cannot be read ({e})")
    variants = m.get("variants") or {}
    if not variants:
        r = _recipe(path, m, None, (), "")
        return {None: r}
    default = m.get("default_variant")
    if default not in variants:
        raise _bad(path, f"'default_variant' is '{default}'; expected one of: {', '.join(variants)}")
    order = (default,) + tuple(v for v in variants if v != default)
    out = {}
    for name, over in variants.items():
        merged = copy.deepcopy(m)
        for key, value in over.items():
            if key == "description":
                continue
            if key == "splits":
                merged["splits"] = dict(merged.get("splits") or {}, **value)
            else:
                merged[key] = value
        out[name] = _recipe(path, merged, name, order, over.get("description", ""))
    out[None] = out[default]
    return out


def load_all(directory: str = MANIFEST_DIR) -> Dict[str, Dict[Optional[str], Recipe]]:
    paths = sorted(glob.glob(os.path.join(directory, "*.json")))
    if not paths:
        raise PrepareError(f"no dataset manifests in {directory} (expected data/manifests/<dataset>.json "
                           "of the repository, or $FAIRSEQ_LOCALNESS_MANIFESTS)")
    out = {}
    for p in paths:
        recipes = load_manifest(p)
        name = recipes[None].name
        if name != os.path.basename(p)[:-5]:
            raise _bad(p, f"'name' is '{name}'; expected the file's name")
        out[name] = recipes
    return out


ALL: Dict[str, Dict[Optional[str], Recipe]] = load_all()
#: Each dataset's recipe (its default variant).
RECIPES: Dict[str, Recipe] = {name: variants[None] for name, variants in ALL.items()}
DATASETS = tuple(RECIPES)


def recipe_for(dataset: str, variant: Optional[str] = None) -> Recipe:
    """The recipe of a dataset's variant (None: the default); PrepareError names the
    datasets or variants that exist."""
    if dataset not in ALL:
        raise PrepareError(f"--dataset: expected one of: {' '.join(DATASETS)}; got '{dataset}'")
    recipes = ALL[dataset]
    if variant is None:
        return recipes[None]
    if variant not in recipes:
        have = recipes[None].variants
        raise PrepareError(f"--variant: {dataset} " + (f"has the variants {', '.join(have)}" if have else
                                                        "has no variants") + f"; got '{variant}'")
    return recipes[variant]
