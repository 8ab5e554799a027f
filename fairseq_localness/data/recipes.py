"""One recipe per dataset: its files with URLs, its splits, cleaning, segmentation
and subword defaults. docs/data.md explains each and where the choices come from.

Member path patterns may use ``{lang}`` (the language of that side, renamed through
the part's ``lang_names``), ``{src}`` and ``{tgt}`` (the direction being prepared):
``newstest2017-{src}{tgt}-src.{src}.sgm`` is ``newstest2017-zhen-src.zh.sgm`` for
Zh->En and ``newstest2017-enzh-src.en.sgm`` for En->Zh.
"""
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from .sources import Member, Source

Pattern = Union[str, Tuple[str, ...]]  # alternatives, tried in order


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
    bpe_from: str = ""
    clean: Clean = Clean()
    valid_every: Optional[int] = None  # every N-th cleaned training pair is moved to valid
    lowercase: bool = False
    normalize_train: bool = False  # Moses punctuation normalization of the training data
    eval_apostrophe: bool = False  # U+2019 -> ' in valid/test (fairseq's recipes)
    segment: Tuple[Tuple[str, str], ...] = ()  # (language, segmenter)
    notes: Tuple[str, ...] = field(default=())

    @property
    def pairs(self) -> Tuple[Tuple[str, str], Tuple[str, str]]:
        a, b = self.langs
        return (a, b), (b, a)

    @property
    def segmenters(self) -> Dict[str, str]:
        return dict(self.segment)

    def parts(self, split: str) -> Tuple[Part, ...]:
        return getattr(self, split)


# --------------------------------------------------------------------------- WMT14 En-De
_EUROPARL = Source("training-parallel-europarl-v7.tgz", "http://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz")
_COMMONCRAWL = Source("training-parallel-commoncrawl.tgz", "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz")
_NC9 = Source("training-parallel-nc-v9.tgz", "http://www.statmt.org/wmt14/training-parallel-nc-v9.tgz")
_WMT14_DEV = Source("dev.tgz", "http://www.statmt.org/wmt14/dev.tgz")
_WMT14_TEST = Source("test-full.tgz", "http://www.statmt.org/wmt14/test-full.tgz")

WMT14_EN_DE = Recipe(
    name="wmt14_en_de",
    langs=("en", "de"),
    title="WMT14 English-German",
    sources=(_EUROPARL, _COMMONCRAWL, _NC9, _WMT14_DEV, _WMT14_TEST),
    train=(
        Part("europarl-v7", "text", (_EUROPARL,), "europarl-v7.de-en.{lang}"),
        Part("commoncrawl", "text", (_COMMONCRAWL,), "commoncrawl.de-en.{lang}"),
        Part("news-commentary-v9", "text", (_NC9,), "news-commentary-v9.de-en.{lang}"),
    ),
    valid=(Part("newstest2013", "sgm", (_WMT14_DEV,),
                ("newstest2013-src.{src}.sgm", "newstest2013-ref.{src}.sgm"),
                ("newstest2013-ref.{tgt}.sgm", "newstest2013-src.{tgt}.sgm")),),
    test=(Part("newstest2014", "sgm", (_WMT14_TEST,),
               "newstest2014-deen-src.{src}.sgm", "newstest2014-deen-ref.{tgt}.sgm"),),
    splits_from="training corpora of fairseq's prepare-wmt14en2de.sh --icml17 (Europarl v7, "
    "Common Crawl, News Commentary v9); newstest2013 valid and newstest2014 (full) test as in "
    "Vaswani et al. 2017, Yang et al. 2018, Xu et al. 2019 and the DC paper",
    bpe_size=32000,
    bpe_from="32K joint BPE merges (Yang et al. 2018; Xu et al. 2019; DC paper's 32k vocabulary)",
    clean=Clean(1, 250, 1.5),
    normalize_train=True,
    notes=("Training data: Moses punctuation normalization and removal of non-printing "
           "characters, then clean-corpus-n 1..250 tokens with ratio 1.5, as fairseq's recipe "
           "(which counts BPE tokens; counted here on Moses tokens, before BPE).",
           "valid and test are kept verbatim (no normalization), so raw/test.* are the "
           "references sacrebleu's wmt14/full uses."),
)

# --------------------------------------------------------------------------- IWSLT14 De-En (fairseq)
_IWSLT14_DE_EN = Source("de-en.tgz", "http://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",
                        description="IWSLT 2014 (WIT3 2014-01) German-English, as mirrored for "
                        "fairseq's prepare-iwslt14.sh")

IWSLT14_DE_EN = Recipe(
    name="iwslt14_de_en",
    langs=("de", "en"),
    title="IWSLT14 German-English (fairseq recipe)",
    sources=(_IWSLT14_DE_EN,),
    train=(Part("train.tags", "tags", (_IWSLT14_DE_EN,), "train.tags.de-en.{lang}"),),
    valid=(),
    test=tuple(Part(name, "xml", (_IWSLT14_DE_EN,), f"IWSLT14.{name}.de-en.{{lang}}.xml")
               for name in ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")),
    splits_from="fairseq examples/translation/prepare-iwslt14.sh: train.tags cleaned, every "
    "23rd pair to valid, test = dev2010 + TEDX.dev2012 + tst2010 + tst2011 + tst2012 "
    "(Song et al. 2019 use this split: 160K train, 7K valid)",
    bpe_size=10000,
    bpe_from="fairseq's prepare-iwslt14.sh (BPE_TOKENS=10000)",
    clean=Clean(1, 175, 1.5, aggressive_dash=False),  # the recipe's tokenizer.perl runs without -a
    valid_every=23,
    lowercase=True,
    eval_apostrophe=True,
    notes=("Lowercased, as fairseq's recipe (so raw/test.* references are lowercase too).",
           "Training pairs are cleaned to 1..175 Moses tokens with ratio 1.5 before the "
           "valid split, as clean-corpus-n in the recipe; U+2019 becomes ' in the test sets."),
)


# --------------------------------------------------------------------------- the DC paper's IWSLT tasks
def _wit3(release: str, a: str, b: str, subdir: bool) -> Source:
    name = f"{a}-{b}.tgz"
    return Source(f"{release}/{name}" if subdir else name,
                  f"https://wit3.fbk.eu/archive/{release}/texts/{a}/{b}/{name}",
                  description=f"WIT3 release {release}, {a}-{b}")


def _iwslt(name, lang, release, train_src, test_src, valid_sets, test_sets, bpe_size, size_note, year):
    pair = f"{lang}-en" if lang != "vi" else "en-vi"
    sources = (train_src,) + ((test_src,) if test_src else ())

    def xml(tst):
        return Part(tst, "xml", sources, f"IWSLT*.TED.{tst}.{pair}.{{lang}}.xml")

    langs = ("en", "vi") if lang == "vi" else (lang, "en")
    return Recipe(
        name=name,
        langs=langs,
        title=f"IWSLT{year} {'English-Vietnamese' if lang == 'vi' else {'es': 'Spanish', 'ro': 'Romanian', 'fr': 'French'}[lang] + '-English'} (DC paper)",
        sources=sources,
        train=(Part("train.tags", "tags", sources, f"train.tags.{pair}.{{lang}}"),),
        valid=tuple(xml(t) for t in valid_sets),
        test=tuple(xml(t) for t in test_sets),
        splits_from=f"DC paper section 5.1: valid = {' + '.join(valid_sets)}, test = {' + '.join(test_sets)}"
        f" ({size_note})",
        bpe_size=bpe_size,
        bpe_from=f"DC paper section 5.1: {bpe_size // 1000}k joint subword vocabulary (subword-nmt); "
        "used here as the number of merges",
        clean=Clean(1, None, None),
        notes=("No length cleaning (pairs with an empty side are dropped): the paper states none, "
               "and its training sizes are those of the full train.tags files.",),
    )


_ES_2014 = _wit3("2014-01", "es", "en", False)
_ES_2014_TEST = _wit3("2014-01-test", "es", "en", True)
_RO_2014 = _wit3("2014-01", "ro", "en", False)
_RO_2014_TEST = _wit3("2014-01-test", "ro", "en", True)
_VI_2015 = _wit3("2015-01", "en", "vi", False)
_FR_2015 = _wit3("2015-01", "fr", "en", False)
_FR_2015_TEST = _wit3("2015-01-test", "fr", "en", True)

IWSLT14_ES_EN = _iwslt("iwslt14_es_en", "es", "2014-01", _ES_2014, _ES_2014_TEST,
                       ("tst2010", "tst2011", "tst2012", "dev2010"), ("tst2014",), 34000, "183k training pairs", 14)
IWSLT14_RO_EN = _iwslt("iwslt14_ro_en", "ro", "2014-01", _RO_2014, _RO_2014_TEST,
                       ("tst2010", "tst2011", "tst2012", "dev2010"), ("tst2014",), 32000, "182k training pairs", 14)
IWSLT15_EN_VI = _iwslt("iwslt15_en_vi", "vi", "2015-01", _VI_2015, None,
                       ("tst2012",), ("tst2013",), 21000, "133k training pairs, tst2012 1553, tst2013 ~1.2k", 15)
IWSLT15_FR_EN = _iwslt("iwslt15_fr_en", "fr", "2015-01", _FR_2015, _FR_2015_TEST,
                       ("tst2013",), ("tst2014", "tst2015"), 31000, "207k training pairs", 15)

# --------------------------------------------------------------------------- WAT17 Ja-En (ASPEC)
_ASPEC_MANUAL = "ASPEC is distributed on application, not by download; unpack ASPEC-JE here"


def _aspec(rel: str) -> Source:
    return Source(f"ASPEC-JE/{rel}", "https://jipsti.jst.go.jp/aspec/", manual=_ASPEC_MANUAL,
                  alternatives=(f"ASPEC/ASPEC-JE/{rel}",))


_ASPEC_TRAIN1, _ASPEC_TRAIN2 = _aspec("train/train-1.txt"), _aspec("train/train-2.txt")
_ASPEC_DEV, _ASPEC_TEST = _aspec("dev/dev.txt"), _aspec("test/test.txt")

WAT17_JA_EN = Recipe(
    name="wat17_ja_en",
    langs=("ja", "en"),
    title="WAT17 Japanese-English (ASPEC-JE)",
    sources=(_ASPEC_TRAIN1, _ASPEC_TRAIN2, _ASPEC_DEV, _ASPEC_TEST),
    train=(Part("train-1", "aspec", (_ASPEC_TRAIN1,)), Part("train-2", "aspec", (_ASPEC_TRAIN2,))),
    valid=(Part("dev", "aspec", (_ASPEC_DEV,)),),
    test=(Part("test", "aspec", (_ASPEC_TEST,)),),
    splits_from="Xu et al. 2019 (after Morishita et al. 2017): the first two sections of the "
    "ASPEC-JE training data (train-1.txt, train-2.txt: 2M pairs); WAT's dev and test sets",
    bpe_size=32000,
    bpe_from="32K BPE merges (Xu et al. 2019)",
    clean=Clean(1, None, None),
    segment=(("ja", "mecab"),),
    notes=("Japanese is word-segmented with MeCab (fugashi + UniDic-lite from PyPI); the paper "
           "used KyTea, which PyPI does not ship with a model.",
           "No length cleaning (pairs with an empty side are dropped): the paper states none."),
)

# --------------------------------------------------------------------------- WMT17 Zh-En
_NC12 = Source("training-parallel-nc-v12.tgz", "http://data.statmt.org/wmt17/translation-task/training-parallel-nc-v12.tgz")
_UN = Source("UNv1.0.en-zh.tar.gz", "https://conferences.unite.un.org/uncorpus",
             parts=("https://stuncorpusprod.blob.core.windows.net/corpusfiles/UNv1.0.en-zh.tar.gz.00",
                    "https://stuncorpusprod.blob.core.windows.net/corpusfiles/UNv1.0.en-zh.tar.gz.01"),
             description="United Nations Parallel Corpus v1.0, English-Chinese")
_CWMT = Source("cwmt.tgz", "http://nlp.nju.edu.cn/cwmt-wmt/",
               manual="the CWMT corpora are distributed on registration; pack them as cwmt.tgz "
               "(cwmt/casia2015/..., cwmt/datum2017/..., as WMT17 lists them)")
_WMT17_DEV = Source("dev.tgz", "http://data.statmt.org/wmt17/translation-task/dev.tgz")
_WMT17_TEST = Source("test.tgz", "http://data.statmt.org/wmt17/translation-task/test.tgz")

_CWMT_PARTS = (
    Part("cwmt-casia2015", "text", (_CWMT,), "casia2015/casia2015_{lang}.txt", lang_names=(("zh", "ch"),)),
    Part("cwmt-casict2011-A", "text", (_CWMT,), "casict2011/casict-A_{lang}.txt", lang_names=(("zh", "ch"),),
         optional=True),
    Part("cwmt-casict2011-B", "text", (_CWMT,), "casict2011/casict-B_{lang}.txt", lang_names=(("zh", "ch"),),
         optional=True),
    Part("cwmt-casict2015", "text", (_CWMT,), "casict2015/casict2015_{lang}.txt", lang_names=(("zh", "ch"),)),
    Part("cwmt-datum2015", "text", (_CWMT,), "datum2015/datum_{lang}.txt", lang_names=(("zh", "ch"),)),
) + tuple(
    Part(f"cwmt-datum2017-Book{i}", "text", (_CWMT,), f"datum2017/Book{i}_{{lang}}.txt", lang_names=(("zh", "cn"),))
    for i in range(1, 21)
) + (
    Part("cwmt-neu2017", "text", (_CWMT,), "neu2017/NEU_{lang}.txt", lang_names=(("zh", "cn"),)),
)

WMT17_ZH_EN = Recipe(
    name="wmt17_zh_en",
    langs=("zh", "en"),
    title="WMT17 Chinese-English",
    sources=(_NC12, _UN, _CWMT, _WMT17_DEV, _WMT17_TEST),
    train=(Part("news-commentary-v12", "text", (_NC12,), "news-commentary-v12.zh-en.{lang}"),
           Part("UNv1.0", "text", (_UN,), "en-zh/UNv1.0.en-zh.{lang}")) + _CWMT_PARTS,
    valid=(Part("newsdev2017", "sgm", (_WMT17_DEV,),
                "newsdev2017-{src}{tgt}-src.{src}.sgm", "newsdev2017-{src}{tgt}-ref.{tgt}.sgm"),),
    test=(Part("newstest2017", "sgm", (_WMT17_TEST,),
               "newstest2017-{src}{tgt}-src.{src}.sgm", "newstest2017-{src}{tgt}-ref.{tgt}.sgm"),),
    splits_from="Yang et al. 2018: all WMT17 parallel data (News Commentary v12, UN v1.0, CWMT), "
    "sentences of at most 50 words, newsdev2017 valid, newstest2017 test",
    bpe_size=32000,
    bpe_from="32K BPE merges (Yang et al. 2018)",
    clean=Clean(1, 50, None),
    segment=(("zh", "jieba"),),
    notes=("Chinese is word-segmented with jieba (Yang et al. 2018); English gets Moses "
           "tokenization in prepare_bpe.sh. The 50-word limit counts segmented words and "
           "Moses tokens.",
           "Song et al. 2019 select data after Hassan et al. 2018 (18M pairs); that selection "
           "is not reproduced."),
)

RECIPES: Dict[str, Recipe] = {r.name: r for r in (
    WMT14_EN_DE, IWSLT14_DE_EN, IWSLT14_ES_EN, IWSLT14_RO_EN, IWSLT15_EN_VI, IWSLT15_FR_EN,
    WAT17_JA_EN, WMT17_ZH_EN,
)}
DATASETS = tuple(RECIPES)
