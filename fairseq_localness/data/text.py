"""Reading the raw formats, and the per-sentence steps: normalization, word
segmentation, Moses token counts for length cleaning.

Formats (``fmt`` of a recipe part):

``text``  two line-aligned plain files (WMT training corpora, CWMT, UN).
``tags``  IWSLT ``train.tags.*``: lines that are one markup element (``<url>``,
          ``<talkid>``, ``<keywords>``, ``<speaker>``, ``<doc ...>``, ...) are
          dropped; ``<title>`` and ``<description>`` lose their tags and keep their
          text, as fairseq's ``prepare-iwslt14.sh`` does.
``xml``   IWSLT dev/test sets: the text of each ``<seg id="N">`` in document order,
          XML entities (``&amp;`` ...) unescaped.
``sgm``   WMT test sets (the "fake SGML" of WMT before 2021): the text of each
          ``<seg>``, as sacrebleu reads it (no entity unescaping; WMT's files
          hold the characters themselves).
``aspec`` ASPEC ``|||``-separated lines: ``score ||| doc-id ||| sent-id ||| ja ||| en``
          in ``train-N.txt``, ``doc-id ||| sent-id ||| ja ||| en`` in ``dev.txt``,
          ``test.txt``: the last two fields.

Every line read is whitespace-normalized (stripped, inner runs of whitespace,
including Unicode line separators, collapsed to one space), which also keeps a
stray carriage return from splitting a line in later tools.

Line-breaking characters. Only ``\n`` ends a line in this package and in the
scripts, but other tools split lines elsewhere: Python's text files and the CLIs
built on them (sacremoses, fairseq-preprocess, sentencepiece's Python reader) on
``\r``, ``str.splitlines`` also on ``\v``, ``\f``, ``\x1c``-``\x1e``, ``\x85``,
U+2028 and U+2029; and ``grep`` treats a file with a NUL byte as binary. One such
character in one line shifts every later line of a parallel corpus by one.
:func:`normalize_line` replaces them (:data:`LINE_BREAKING`, with NUL) by a space; it
is the one place that does so (:func:`clean_ws` applies it, ``scripts/lines.py``
applies it in ``prepare_bpe.sh`` and checks for it in ``preprocess.sh``).
"""
import html
import re
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from .sources import PrepareError

_SEG = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)
_TAG_LINE = re.compile(r"^\s*<(/?)([A-Za-z_][\w.-]*)([^>]*)>(.*)$")
_KEEP_TEXT_TAGS = ("title", "description")


LINE_BREAKING = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""The characters other than ``\\n`` at which ``str.splitlines`` (and, for ``\\r``,
Python's text files) end a line."""
_BREAKING_RUN = re.compile("[ \t]*[\x00" + LINE_BREAKING + "][ \t\x00" + LINE_BREAKING + "]*")


def has_line_breaking(line: str) -> bool:
    """Whether ``line`` holds a character of :data:`LINE_BREAKING` or NUL."""
    return _BREAKING_RUN.search(line) is not None


def normalize_line(line: str) -> str:
    """``line`` with each run of line-breaking characters (:data:`LINE_BREAKING`) and
    NUL bytes, with the spaces around it, replaced by one space, and without spaces at
    its ends; a line without any of them is returned unchanged."""
    if not has_line_breaking(line):
        return line
    return _BREAKING_RUN.sub(" ", line).strip(" \t")


def clean_ws(line: str) -> str:
    return " ".join(normalize_line(line).split())


def read_lines(path: str) -> Iterator[str]:
    # newline="\n": only \n ends a line, a \r inside a line stays there (and
    # clean_ws removes it) instead of shifting every later line of the corpus.
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        for line in f:
            yield line.rstrip("\n")


def tags_line(line: str) -> Optional[str]:
    """An IWSLT train.tags line as text, or None for a markup line to drop."""
    m = _TAG_LINE.match(line)
    if m is None:
        return clean_ws(line)
    tag = m.group(2).lower()
    if tag in _KEEP_TEXT_TAGS:
        text = re.sub(rf"</?{tag}\s*>", "", line, flags=re.IGNORECASE)
        return clean_ws(text)
    return None


def read_tags_pairs(src_path: str, tgt_path: str, name: str) -> Iterator[Tuple[str, str]]:
    for i, (s, t) in enumerate(_zip_strict(read_lines(src_path), read_lines(tgt_path), name), 1):
        s2, t2 = tags_line(s), tags_line(t)
        if s2 is None or t2 is None:
            if (s2 is None) != (t2 is None):
                raise PrepareError(f"--raw-dir: {name}: line {i} is markup on one side only "
                                   f"({s[:60]!r} / {t[:60]!r}); expected line-aligned train.tags files")
            continue
        yield s2, t2


def read_segs(path: str, unescape: bool) -> List[str]:
    out = []
    for line in read_lines(path):
        m = _SEG.search(line)
        if m:
            text = m.group(1)
            out.append(clean_ws(html.unescape(text) if unescape else text))
    return out


def read_aspec(path: str, name: str) -> Iterator[Tuple[str, str]]:
    """(ja, en) pairs of an ASPEC-JE file."""
    for i, line in enumerate(read_lines(path), 1):
        if not line.strip():
            continue
        fields = line.split("|||")
        if len(fields) < 4:
            raise PrepareError(f"--raw-dir: {name} line {i}: expected ' ||| '-separated fields "
                               f"(id ||| sent-id ||| ja ||| en), got {line[:80]!r}")
        yield clean_ws(fields[-2]), clean_ws(fields[-1])


def _zip_strict(a: Iterator[str], b: Iterator[str], name: str) -> Iterator[Tuple[str, str]]:
    sentinel = object()
    n = 0
    while True:
        x, y = next(a, sentinel), next(b, sentinel)
        if x is sentinel and y is sentinel:
            return
        if x is sentinel or y is sentinel:
            raise PrepareError(f"--raw-dir: {name}: the two languages have different numbers of lines "
                               f"(one ends after {n}); expected parallel files")
        n += 1
        yield x, y


def read_text_pairs(src_path: str, tgt_path: str, name: str) -> Iterator[Tuple[str, str]]:
    for s, t in _zip_strict(read_lines(src_path), read_lines(tgt_path), name):
        yield clean_ws(s), clean_ws(t)


# --------------------------------------------------------------------------- segmenters
SEGMENTERS = {
    # name: (languages, pip packages, description)
    "mecab": ("ja", "fugashi unidic-lite", "MeCab (fugashi) with the UniDic-lite dictionary"),
    "jieba": ("zh", "jieba", "jieba (accurate mode, HMM for unknown words)"),
}


def check_segmenter(name: str) -> None:
    """Raise PrepareError if the segmenter's packages are not importable."""
    try:
        if name == "mecab":
            import fugashi  # noqa: F401
            import unidic_lite  # noqa: F401
        elif name == "jieba":
            import jieba  # noqa: F401
    except ImportError as e:
        raise PrepareError(f"word segmentation with {SEGMENTERS[name][2]} needs the Python packages "
                           f"{SEGMENTERS[name][1]} ({e}); install them with "
                           f"pip install {SEGMENTERS[name][1]} (make install does)")


def make_segmenter(name: str) -> Callable[[str], str]:
    """A function: text -> space-separated words."""
    check_segmenter(name)
    if name == "mecab":
        import fugashi
        import unidic_lite

        dicdir = unidic_lite.DICDIR
        # this dictionary and its own mecabrc, whatever else is installed
        tagger = fugashi.GenericTagger(f'-Owakati -r "{dicdir}/mecabrc" -d "{dicdir}"')

        def mecab(text: str) -> str:
            return clean_ws(tagger.parse(text)) if text else ""

        return mecab
    if name == "jieba":
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()

        def seg_jieba(text: str) -> str:
            return " ".join(w for w in jieba.cut(text) if w.strip())

        return seg_jieba
    raise ValueError(name)


def moses_counter(lang: str, aggressive_dash: bool = True) -> Callable[[str], int]:
    """Number of Moses tokens (sacremoses, no escaping; with aggressive dash
    splitting, as prepare_bpe.sh tokenizes, unless told otherwise)."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)

    def count(text: str) -> int:
        return len(tok.tokenize(text, aggressive_dash_splits=aggressive_dash, escape=False)) if text else 0

    return count


def moses_normalizer(lang: str) -> Callable[[str], str]:
    """Moses punctuation normalization and removal of non-printing characters
    (normalize-punctuation.perl | remove-non-printing-char.perl, via sacremoses)."""
    from sacremoses import MosesPunctNormalizer

    norm = MosesPunctNormalizer(lang=lang, post_remove_control_chars=True)

    def normalize(text: str) -> str:
        return clean_ws(norm.normalize(text))

    return normalize


Counter = Dict[str, Callable[[str], int]]
