"""Small fakes of every dataset's raw download, in the original formats.

Each builder writes into a directory the files a dataset's recipe reads, under their
original names and in their original formats (IWSLT release .tgz with ``train.tags``
and XML test sets, WMT .tgz archives with SGML test sets, CWMT and UN archives, ASPEC's
`` ||| ``-separated files), a few sentences each, and returns the split contents the
recipe should extract from them. Used by the tests of the data preparation
(tests/test_prepare_data.py) and by the reproduce scripts' ``--rehearse``
(scripts/reproduce/), which prepare these fakes through the real pipeline.

Like the rest of this package, it imports nothing from ``fairseq_localness`` (so that it
loads without fairseq). Command line (``python fakes.py DATASET DIR``): write DATASET's
fake raw files into DIR.
"""
import argparse
import io
import os
import sys
import tarfile


def write_archive(path, files):
    """A .tgz / .tar.gz with the given {member name: text}."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tarfile.open(path, "w:gz") as t:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))


def text_file(lines_):
    return "".join(line + "\n" for line in lines_)


def train_tags(lang, docs):
    """IWSLT train.tags: per talk the markup lines, then one sentence per line.
    docs: [(title, description, [sentences])] in this language."""
    out = []
    for k, (title, desc, sents) in enumerate(docs, 1):
        out += [f'<doc docid="{k}" genre="lectures">', f"<url>http://www.ted.com/talks/talk{k}.html</url>",
                "<keywords>talks, science</keywords>", "<speaker>Some Speaker</speaker>",
                f"<talkid>{k}</talkid>", f"<title>{title}</title>", f"<description>{desc}</description>"]
        out += sents
        out += ["<reviewer></reviewer>", "<translator></translator>", "</doc>"]
    return text_file(out)


def iwslt_xml(setid, lang, segs, ref):
    kind = "refset" if ref else "srcset"
    out = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<{kind} setid="{setid}" srclang="x" tgtlang="{lang}">',
           '<doc docid="1" genre="lectures">', "<url>http://www.ted.com/talks/t.html</url>",
           "<description>TED talk</description>", "<keywords>talks</keywords>", "<talkid>1</talkid>",
           "<title>A title</title>"]
    out += [f'<seg id="{i}"> {s} </seg>' for i, s in enumerate(segs, 1)]
    out += ["</doc>", f"</{kind}>", "</mteval>"]
    return text_file(out)


def wmt_sgm(setid, lang, segs, ref):
    kind = "refset" if ref else "srcset"
    out = [f'<{kind} setid="{setid}" srclang="any" trglang="{lang}">',
           '<doc sysid="ref" docid="doc-1" genre="news" origlang="en">', "<p>"]
    out += [f'<seg id="{i}">{s}</seg>' for i, s in enumerate(segs, 1)]
    out += ["</p>", "</doc>", f"</{kind}>"]
    return text_file(out)


# Sentences: the tag says which corpus/set a line comes from.
WORDS = {
    "en": "The house {i} is big and the tree is green .",
    "de": "Das Haus {i} ist groß und der Baum ist grün .",
    "es": "La casa {i} es grande y el árbol es verde .",
    "ro": "Casa {i} este mare și copacul este verde .",
    "fr": "La maison {i} est grande et l'arbre est vert .",
    "vi": "Ngôi nhà {i} lớn và cái cây xanh .",
}


def sent(lang, tag, i):
    return f"{tag} " + WORDS[lang].format(i=i)


def iwslt_fake(raw, lang_a, lang_b, pair, year, archive, sets, test_archive=None, test_sets=(), n_train=30,
               scale=1):
    """IWSLT release .tgz: pair/train.tags.pair.{a,b} and IWSLT{year}.TED.<set>.pair.{a,b}.xml.
    Returns the expected {split-name: [(a, b)]} (train as the cleaned pairs)."""
    docs = {lang_a: [], lang_b: []}
    expected_train = []
    for d in range(2):
        sents = [(sent(lang_a, "train", d * 100 * scale + i), sent(lang_b, "train", d * 100 * scale + i))
                 for i in range(n_train * scale // 2)]
        ta, tb = f"Title {d} {lang_a}", f"Title {d} {lang_b}"
        da, db = f"Talk {d} about houses ({lang_a})", f"Talk {d} about houses ({lang_b})"
        docs[lang_a].append((ta, da, [s for s, _ in sents]))
        docs[lang_b].append((tb, db, [t for _, t in sents]))
        expected_train += [(ta, tb), (da, db)] + sents
    files = {f"{pair}/train.tags.{pair}.{lang_a}": train_tags(lang_a, docs[lang_a]),
             f"{pair}/train.tags.{pair}.{lang_b}": train_tags(lang_b, docs[lang_b])}
    expected = {"train": expected_train}

    def add(files_, name):
        segs = [(sent(lang_a, name, i), sent(lang_b, name, i)) for i in range(3)]
        for lang, k in ((lang_a, 0), (lang_b, 1)):
            files_[f"{pair}/IWSLT{year}.{name}.{pair}.{lang}.xml"] = iwslt_xml(name, lang, [s[k] for s in segs],
                                                                               ref=(k == 1))
        expected[name] = segs

    for name in sets:
        add(files, name)
    write_archive(os.path.join(raw, archive), files)
    if test_archive:
        tfiles = {}
        for name in test_sets:
            add(tfiles, name)
        write_archive(os.path.join(raw, test_archive), tfiles)
    return expected


def make_iwslt14_de_en(raw, scale=1):
    exp = iwslt_fake(raw, "de", "en", "de-en", 14, "de-en.tgz",
                     ["TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012"], n_train=60, scale=scale)
    # extra cases, appended to the last talk of the train.tags files: dropped by the
    # length cleaning (ratio > 1.5, more than 175 tokens, an empty side)
    path = os.path.join(raw, "de-en.tgz")
    with tarfile.open(path) as t:
        files = {m.name: t.extractfile(m).read().decode() for m in t.getmembers()}
    bad = [("Ja .", "Yes , that is really very much the truth ."), ("Wort " * 180, "word " * 180), ("", "Empty .")]
    for lang, k in (("de", 0), ("en", 1)):
        name = f"de-en/train.tags.de-en.{lang}"
        body = files[name].rsplit("<reviewer>", 1)
        files[name] = body[0] + "".join(b[k].strip() + "\n" for b in bad) + "<reviewer>" + body[1]
    # an apostrophe (U+2019) and an entity in a test set
    for lang in ("de", "en"):
        name = f"de-en/IWSLT14.TED.tst2011.de-en.{lang}.xml"
        files[name] = files[name].replace(" is big", " isn\u2019t small &amp; big").replace(" ist groß", " ist gro\u00df &amp; fein")
    exp["TED.tst2011"] = [(s.replace(" ist groß", " ist groß & fein"), t.replace(" is big", " isn't small & big"))
                          for s, t in exp["TED.tst2011"]]
    write_archive(path, files)
    return exp


def wmt_train(lang_a, lang_b, tag, n, text_a=None, text_b=None):
    pairs = [((text_a or sent)(lang_a, tag, i), (text_b or sent)(lang_b, tag, i)) for i in range(n)]
    return pairs


def make_wmt14(raw, scale=1):
    exp = {}
    corpora = {"europarl": ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en.{}"),
               "commoncrawl": ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.{}"),
               "nc9": ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en.{}")}
    for tag, (archive, member) in corpora.items():
        pairs = wmt_train("en", "de", tag, 4 * scale)
        exp[tag] = pairs
        if tag == "nc9":  # Moses punctuation normalization; a pair over the 1.5 ratio
            pairs = pairs + [("He said \u201ehello\u201c .", "Er sagte \u201ehallo\u201c ."),
                             ("Yes .", "Ja , das ist wirklich sehr sehr wahr und richtig .")]
            exp[tag] = exp[tag] + [('He said "hello" .', 'Er sagte "hallo" .')]
        write_archive(os.path.join(raw, archive), {member.format("en"): text_file(p[0] for p in pairs),
                                                   member.format("de"): text_file(p[1] for p in pairs)})
    dev = wmt_train("en", "de", "newstest2013", 3)
    test = wmt_train("en", "de", "newstest2014", 3) + [("A \u201equote\u201c & more .", "Ein \u201eZitat\u201c & mehr .")]
    exp["valid"], exp["test"] = dev, test
    write_archive(os.path.join(raw, "dev.tgz"), {
        "dev/newstest2013-src.en.sgm": wmt_sgm("newstest2013", "en", [p[0] for p in dev], False),
        "dev/newstest2013-ref.de.sgm": wmt_sgm("newstest2013", "de", [p[1] for p in dev], True),
        "dev/newstest2013-src.de.sgm": wmt_sgm("newstest2013", "de", [p[1] for p in dev], False),
        "dev/newstest2013-ref.en.sgm": wmt_sgm("newstest2013", "en", [p[0] for p in dev], True),
        "dev/newstest2012-src.en.sgm": wmt_sgm("newstest2012", "en", ["not this one"], False),
    })
    write_archive(os.path.join(raw, "test-full.tgz"), {
        "test-full/newstest2014-deen-src.en.sgm": wmt_sgm("newstest2014", "en", [p[0] for p in test], False),
        "test-full/newstest2014-deen-ref.de.sgm": wmt_sgm("newstest2014", "de", [p[1] for p in test], True),
        "test-full/newstest2014-deen-src.de.sgm": wmt_sgm("newstest2014", "de", [p[1] for p in test], False),
        "test-full/newstest2014-deen-ref.en.sgm": wmt_sgm("newstest2014", "en", [p[0] for p in test], True),
    })
    return exp


ZH = "我们在第{i}个房子里研究机器翻译。"
ZH_EN = "we study machine translation in house {i} ."


def zh_pairs(tag, n, start=0):
    return [(f"{tag}{ZH.format(i=i)}", f"{tag} " + ZH_EN.format(i=i)) for i in range(start, start + n)]


def make_wmt17_zh_en(raw, scale=1):
    exp = {"nc12": zh_pairs("nc", 3 * scale), "un": zh_pairs("un", 3 * scale)}
    long_pair = ("很长的句子。" * 30, " ".join(["word"] * 60) + " .")  # over 50 words: dropped
    write_archive(os.path.join(raw, "training-parallel-nc-v12.tgz"), {
        "training/news-commentary-v12.zh-en.zh": text_file([p[0] for p in exp["nc12"]] + [long_pair[0]]),
        "training/news-commentary-v12.zh-en.en": text_file([p[1] for p in exp["nc12"]] + [long_pair[1]]),
        "training/news-commentary-v12.de-en.en": "other pair\n",
    })
    write_archive(os.path.join(raw, "UNv1.0.en-zh.tar.gz"), {
        "en-zh/UNv1.0.en-zh.zh": text_file(p[0] for p in exp["un"]),
        "en-zh/UNv1.0.en-zh.en": text_file(p[1] for p in exp["un"]),
    })
    cwmt = {}
    exp["cwmt"] = []
    corpora = [("casia2015/casia2015_{}.txt", "ch"), ("casict2015/casict2015_{}.txt", "ch"),
               ("datum2015/datum_{}.txt", "ch")] + [(f"datum2017/Book{i}_{{}}.txt", "cn") for i in range(1, 21)] \
        + [("neu2017/NEU_{}.txt", "cn")]
    for k, (pattern, zh_name) in enumerate(corpora):
        pairs = zh_pairs(f"cwmt{k}", scale)
        exp["cwmt"] += pairs
        cwmt["cwmt/" + pattern.format(zh_name)] = text_file(p[0] for p in pairs)
        cwmt["cwmt/" + pattern.format("en")] = text_file(p[1] for p in pairs)
    write_archive(os.path.join(raw, "cwmt.tgz"), cwmt)
    dev, test = zh_pairs("newsdev", 3), zh_pairs("newstest", 3)
    exp["valid"], exp["test"] = dev, test
    write_archive(os.path.join(raw, "dev.tgz"), {
        "dev/newsdev2017-zhen-src.zh.sgm": wmt_sgm("newsdev2017", "zh", [p[0] for p in dev], False),
        "dev/newsdev2017-zhen-ref.en.sgm": wmt_sgm("newsdev2017", "en", [p[1] for p in dev], True),
    })
    write_archive(os.path.join(raw, "test.tgz"), {
        "test/newstest2017-zhen-src.zh.sgm": wmt_sgm("newstest2017", "zh", [p[0] for p in test], False),
        "test/newstest2017-zhen-ref.en.sgm": wmt_sgm("newstest2017", "en", [p[1] for p in test], True),
    })
    return exp


JA = ["これは{i}番目の文です。", "私たちは新しい翻訳手法を提案した。", "東京の大学で研究しています。"]
JA_EN = ["this is sentence number {i} .", "we proposed a new translation method .", "we do research at a university in Tokyo ."]


def ja_pairs(tag, n):
    return [(f"{tag}{JA[i % 3].format(i=i)}", f"{tag} " + JA_EN[i % 3].format(i=i)) for i in range(n)]


def make_wat17(raw, scale=1):
    base = os.path.join(raw, "ASPEC", "ASPEC-JE")  # the distribution's own top directory
    exp = {}
    for name, n in (("train-1", 12), ("train-2", 12), ("train-3", 4)):
        pairs = ja_pairs(name, n * scale)
        exp[name] = pairs
        os.makedirs(os.path.join(base, "train"), exist_ok=True)
        with open(os.path.join(base, "train", f"{name}.txt"), "w", encoding="utf-8") as f:
            for i, (ja, en) in enumerate(pairs):
                f.write(f"0.{900 - i} ||| A-B-C{i:02d} ||| {i + 1} ||| {ja} ||| {en}\n")
    for name in ("dev", "devtest", "test"):
        pairs = ja_pairs(name, 3)
        exp[name] = pairs
        os.makedirs(os.path.join(base, name), exist_ok=True)
        with open(os.path.join(base, name, f"{name}.txt"), "w", encoding="utf-8") as f:
            for i, (ja, en) in enumerate(pairs):
                f.write(f"D-{name}{i} ||| {i + 1} ||| {ja} ||| {en}\n")
    return exp


def make_dc_iwslt(raw, dataset, scale=1):
    if dataset == "iwslt14_es_en":
        return iwslt_fake(raw, "es", "en", "es-en", 14, "es-en.tgz",
                          ["TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012"],
                          "2014-01-test/es-en.tgz", ["TED.tst2014"], scale=scale)
    if dataset == "iwslt14_ro_en":
        return iwslt_fake(raw, "ro", "en", "ro-en", 14, "ro-en.tgz",
                          ["TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012"],
                          "2014-01-test/ro-en.tgz", ["TED.tst2014"], scale=scale)
    if dataset == "iwslt15_en_vi":
        return iwslt_fake(raw, "en", "vi", "en-vi", 15, "en-vi.tgz",
                          ["TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012", "TED.tst2013"], scale=scale)
    if dataset == "iwslt15_fr_en":
        return iwslt_fake(raw, "fr", "en", "fr-en", 15, "fr-en.tgz",
                          ["TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012", "TED.tst2013", "TED.tst2014"],
                          "2015-01-test/fr-en.tgz", ["TED.tst2015"], scale=scale)
    raise ValueError(dataset)


FAKES = {
    "iwslt14_de_en": make_iwslt14_de_en,
    "wmt14_en_de": make_wmt14,
    "wmt17_zh_en": make_wmt17_zh_en,
    "wat17_ja_en": make_wat17,
    "iwslt14_es_en": lambda raw, scale: make_dc_iwslt(raw, "iwslt14_es_en", scale),
    "iwslt14_ro_en": lambda raw, scale: make_dc_iwslt(raw, "iwslt14_ro_en", scale),
    "iwslt15_en_vi": lambda raw, scale: make_dc_iwslt(raw, "iwslt15_en_vi", scale),
    "iwslt15_fr_en": lambda raw, scale: make_dc_iwslt(raw, "iwslt15_fr_en", scale),
}


def make_fake(dataset, raw, scale=1):
    """Write the fake raw download of ``dataset`` into ``raw``, with ``scale`` times the
    training sentences of the tests' fakes (the development and test sets keep their
    few sentences); returns the expected splits."""
    if dataset not in FAKES:
        raise ValueError(f"no fake for dataset '{dataset}'; expected one of: {', '.join(sorted(FAKES))}")
    os.makedirs(raw, exist_ok=True)
    if scale < 1:
        raise ValueError(f"scale: expected an integer >= 1, got {scale}")
    return FAKES[dataset](raw, scale=scale)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Write a small fake of a dataset's raw download.")
    parser.add_argument("dataset", choices=sorted(FAKES))
    parser.add_argument("raw_dir", help="the directory to write the raw files into (created)")
    parser.add_argument("--scale", type=int, default=1,
                        help="this many times the training sentences of the tests' fakes (default 1)")
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error(f"--scale: expected an integer >= 1, got {args.scale}")
    make_fake(args.dataset, args.raw_dir, args.scale)
    return 0


if __name__ == "__main__":
    sys.exit(main())
