"""scripts/prepare_data.sh and fairseq_localness/data: every dataset prepared offline
from a small fake of its raw download (fairseq_localness/data/fakes.py), in the
original format (IWSLT .tgz with train.tags and XML test sets, WMT .tgz archives with SGML test sets,
ASPEC's ' ||| '-separated files).

Two datasets go through the whole script (extraction, cleaning, segmentation,
subword model, fairseq-preprocess), concurrently: iwslt14_de_en (fairseq's variant,
En->De, one subword-nmt model with Moses tokenization) and wmt17_zh_en (jieba
segmentation, one sentencepiece model and dictionary per language). The others are
checked at the level of their split files (prepare_raw), which is all that differs
between recipes; the later steps are the same scripts for every dataset. The
manifests (data/manifests) are checked against the paper configurations that use
them; downloads are checked against published checksums (on file:// URLs). Bad
inputs stop with exit status 2 before anything is written.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import SCRIPTS, run_script, tool_env


def load_data_package():
    spec = importlib.util.spec_from_file_location("prepare_data_shim", os.path.join(SCRIPTS, "prepare_data.py"))
    shim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shim)
    return shim.load_data_package()


DATA = load_data_package()
from fairseq_localness_data import prepare as P  # noqa: E402  (loaded above, without fairseq)


def commands(stderr):
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# The fake raw downloads (fairseq_localness/data/fakes.py, shared with the reproduce
# scripts' --rehearse).
from fairseq_localness_data.fakes import (  # noqa: E402
    make_dc_iwslt, make_iwslt14_de_en, make_wat17, make_wmt14, make_wmt17_zh_en, write_archive)


def split_lines(out, split, src, tgt, sub="raw"):
    return list(zip(lines(os.path.join(out, sub, f"{split}.{src}")), lines(os.path.join(out, sub, f"{split}.{tgt}"))))


def swap(pairs):
    return [(b, a) for a, b in pairs]


# --------------------------------------------------------------------------- full runs
def prepare(raw, out, dataset, *args, check=True):
    return run_script("prepare_data.sh", ["--dataset", dataset, "--raw-dir", raw, "--out", out,
                                          "--workers", "1", *args], check=check)


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory):
    """The full runs, started together (each is mostly process start-up)."""
    base = tmp_path_factory.mktemp("prepare_full")
    specs = {
        "iwslt14_de_en": (make_iwslt14_de_en, ["--src", "en", "--tgt", "de", "--bpe-size", "60",
                                               "--variant", "fairseq"]),
        "wmt17_zh_en": (make_wmt17_zh_en, ["--bpe", "sentencepiece", "--bpe-size", "120"]),
    }
    procs, results = {}, {}
    for name, (make, args) in specs.items():
        raw, out = base / name / "raw_download", base / name / "out"
        raw.mkdir(parents=True)
        expected = make(str(raw))
        cmd = ["bash", os.path.join(SCRIPTS, "prepare_data.sh"), "--dataset", name, "--raw-dir", str(raw),
               "--out", str(out), "--workers", "1", *args]
        procs[name] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=tool_env()), raw, out, expected, cmd)
    for name, (proc, raw, out, expected, cmd) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-4000:]}"
        results[name] = dict(raw=str(raw), out=str(out), expected=expected, stderr=stderr)
    return results


def check_layout(out, src, tgt, seg, bpe, tokenize):
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            assert os.path.isfile(os.path.join(out, "raw", f"{split}.{lang}"))
            assert os.path.isfile(os.path.join(out, "bpe", f"{split}.{lang}"))
            assert os.path.isfile(os.path.join(out, "bin", f"{split}.{src}-{tgt}.{lang}.idx"))
            assert os.path.isfile(os.path.join(out, "seg", f"{split}.{lang}")) == seg
    assert os.path.isfile(os.path.join(out, "bin", f"dict.{src}.txt"))
    assert lines(os.path.join(out, "bin", "SEGMENTATION")) == [bpe]
    assert lines(os.path.join(out, "bin", "TOKENIZATION")) == [tokenize]
    assert not os.path.exists(os.path.join(out, "extracted"))
    assert not [p for p in os.listdir(os.path.dirname(out)) if ".tmp." in p]
    record = json.load(open(os.path.join(out, "PREPARED"), encoding="utf-8"))
    for split in ("train", "valid", "test"):
        assert record["sizes"][split] == len(lines(os.path.join(out, "raw", f"{split}.{src}")))
    assert (record["src"], record["tgt"], record["bpe"], record["tokenize"]) == (src, tgt, bpe, tokenize)
    return record


def test_full_iwslt14_de_en_reversed(full_runs):
    """fairseq's variant: markup dropped, title/description kept, cleaning, every 23rd
    pair to valid, test = dev2010 + TEDX.dev2012 + tst2010-2012, lowercased; En->De."""
    r = full_runs["iwslt14_de_en"]
    out, exp = r["out"], r["expected"]
    record = check_layout(out, "en", "de", seg=False, bpe="subword-nmt", tokenize="moses")
    assert record["bpe_size"] == 60 and record["lowercase"] is True
    assert record["variant"] == "fairseq" and record["bpe_joint"] is True
    assert "TEDX.dev2012" in record["test_set"] and "lowercased" in record["test_set"]
    assert os.path.isfile(os.path.join(out, "bin", "code"))
    assert open(os.path.join(out, "bin", "dict.en.txt")).read() == open(os.path.join(out, "bin", "dict.de.txt")).read()
    cmds = commands(r["stderr"])
    assert any("subword-nmt learn-bpe -s 60" in c for c in cmds)
    assert any(c.startswith("fairseq-preprocess --source-lang en --target-lang de") for c in cmds)

    kept = [(b.lower(), a.lower()) for a, b in exp["train"]]  # en, de; the bad pairs are dropped
    assert split_lines(out, "train", "en", "de") == [p for i, p in enumerate(kept, 1) if i % 23]
    assert split_lines(out, "valid", "en", "de") == [p for i, p in enumerate(kept, 1) if i % 23 == 0]
    test = [(b.lower(), a.lower()) for name in ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011",
                                                "TED.tst2012") for a, b in exp[name]]
    assert split_lines(out, "test", "en", "de") == test
    assert record["parts"]["train"]["train.tags"] == {"read": len(kept) + 3, "kept": len(kept)}
    raw_text = open(os.path.join(out, "raw", "train.en"), encoding="utf-8").read()
    assert "<" not in raw_text and "talks, science" not in raw_text and "title 0 en" in raw_text
    assert "@@" in open(os.path.join(out, "bpe", "train.en"), encoding="utf-8").read()

    # the same request again: nothing to do; another one without --force: refused
    p = prepare(r["raw"], out, "iwslt14_de_en", "--src", "en", "--tgt", "de", "--bpe-size", "60",
                "--variant", "fairseq")
    assert "nothing to do" in p.stderr and commands(p.stderr) == []
    before = open(os.path.join(out, "PREPARED")).read()
    for other in ([], ["--src", "en", "--tgt", "de", "--bpe-size", "60"]):  # the paper's variant is another request
        p = prepare(r["raw"], out, "iwslt14_de_en", *other, check=False)
        assert p.returncode == 2 and "--out:" in p.stderr and "already exists" in p.stderr and "--force" in p.stderr
        assert "variant=fairseq, src=en, tgt=de" in p.stderr and commands(p.stderr) == []
    assert open(os.path.join(out, "PREPARED")).read() == before


def test_full_wmt17_zh_en(full_runs):
    """SGML test sets, three training sources in order, at most 50 words, jieba; a
    sentencepiece model and a dictionary per language (the dataset's default)."""
    r = full_runs["wmt17_zh_en"]
    out, exp = r["out"], r["expected"]
    record = check_layout(out, "zh", "en", seg=True, bpe="sentencepiece", tokenize="none")
    assert record["bpe_joint"] is False and record["variant"] is None
    assert record["segmentation"] == {"zh": "jieba (accurate mode, HMM for unknown words)"}
    assert record["parts"]["train"]["cwmt-casict2011-A"] is None  # optional, absent
    assert record["parts"]["train"]["news-commentary-v12"] == {"read": 4, "kept": 3}
    assert split_lines(out, "train", "zh", "en") == exp["nc12"] + exp["un"] + exp["cwmt"]
    assert split_lines(out, "valid", "zh", "en") == exp["valid"]
    assert split_lines(out, "test", "zh", "en") == exp["test"]
    seg = lines(os.path.join(out, "seg", "test.zh"))
    assert seg[0] == "newstest 我们 在 第 0 个 房子 里 研究 机器翻译 。"
    assert lines(os.path.join(out, "seg", "test.en")) == lines(os.path.join(out, "raw", "test.en"))
    # separate models: each learned on its own side; separate dictionaries
    import sentencepiece as spm

    assert not os.path.exists(os.path.join(out, "bin", "sentencepiece.bpe.model"))
    vocab = {}
    for lang in ("zh", "en"):
        model = spm.SentencePieceProcessor(model_file=os.path.join(out, "bin", f"sentencepiece.{lang}.model"))
        vocab[lang] = {model.id_to_piece(i) for i in range(model.get_piece_size())}
    assert any("房" in p for p in vocab["zh"]) and not any("房" in p for p in vocab["en"])
    assert any("house" in p for p in vocab["en"]) and not any("house" in p for p in vocab["zh"])
    dicts = {lang: lines(os.path.join(out, "bin", f"dict.{lang}.txt")) for lang in ("zh", "en")}
    assert dicts["zh"] != dicts["en"]
    assert not any("house" in w for w in dicts["zh"])
    assert any(c.startswith("fairseq-preprocess") and "--joined-dictionary" not in c for c in commands(r["stderr"]))


# --------------------------------------------------------------------------- split checks (Python level)
def run_raw(tmp_path, dataset, make, src=None, tgt=None):
    raw, out = tmp_path / "raw_download", tmp_path / "out"
    raw.mkdir()
    expected = make(str(raw))
    recipe, request = P.resolve(dataset, src, tgt)
    record = P.prepare_raw(recipe, request, str(raw), str(out))
    return str(out), expected, record


def test_wat17_splits_and_segmentation(tmp_path):
    """ASPEC: train-1 + train-2 (not train-3), dev, test; MeCab segmentation in seg/."""
    out, exp, record = run_raw(tmp_path, "wat17_ja_en", make_wat17)
    assert split_lines(out, "train", "ja", "en") == exp["train-1"] + exp["train-2"]
    assert split_lines(out, "valid", "ja", "en") == exp["dev"]
    assert split_lines(out, "test", "ja", "en") == exp["test"]
    assert record["sizes"] == {"train": 24, "valid": 3, "test": 3}
    assert split_lines(out, "train", "ja", "en", sub="seg")[1] == (
        "train - 1 私 たち は 新しい 翻訳 手法 を 提案 し た 。", exp["train-1"][1][1])
    assert " " not in lines(os.path.join(out, "raw", "train.ja"))[1]
    assert record["tokenize"] == "moses" and record["bpe_size"] == 32000
    assert "MeCab" in record["segmentation"]["ja"]
    # En->Ja: the same pairs swapped, Japanese still segmented
    out2 = P.prepare_raw(*P.resolve("wat17_ja_en", "en", "ja"), str(tmp_path / "raw_download"), str(tmp_path / "rev"))
    assert split_lines(str(tmp_path / "rev"), "test", "en", "ja", sub="seg") == swap(
        split_lines(out, "test", "ja", "en", sub="seg"))
    assert out2["sizes"] == record["sizes"]


def test_wmt14_splits(tmp_path):
    out, exp, record = run_raw(tmp_path, "wmt14_en_de", make_wmt14)
    assert split_lines(out, "train", "en", "de") == exp["europarl"] + exp["commoncrawl"] + exp["nc9"]
    assert split_lines(out, "valid", "en", "de") == exp["valid"]
    assert split_lines(out, "test", "en", "de") == exp["test"]  # verbatim: „quote“ and & kept
    assert record["parts"]["train"]["news-commentary-v9"] == {"read": 6, "kept": 5}
    assert record["bpe"] == "subword-nmt" and record["bpe_size"] == 32000 and record["tokenize"] == "moses"
    # two worker processes give the same files
    out2 = str(tmp_path / "out2")
    P.prepare_raw(*P.resolve("wmt14_en_de"), str(tmp_path / "raw_download"), out2, workers=2)
    for split in ("train", "valid", "test"):
        assert split_lines(out2, split, "en", "de") == split_lines(out, split, "en", "de")


@pytest.mark.parametrize("dataset,src,tgt", [("wmt14_en_de", "en", "de"), ("iwslt14_de_en", "de", "en")])
def test_cleaning_bounds_decide_as_the_tokenizer(dataset, src, tgt):
    """The length cleaning tokenizes only pairs whose token-count bounds leave the
    decision open; on sentences full of punctuation, digits, non-Latin letters and
    control characters it decides exactly as counting every pair would."""
    import random

    rng = random.Random(3)
    chars = list("abcXYZ019éßñșțệđ²") + list(".,;:!?'\"-()[]@#%&*/<>=+~_’“”„…·€") + \
        ["\u0301", "中", "日", "\u00a0", "\x01", "\x7f", "ﬁ", "٣", "ـ", "\u200b"]
    proc = P.PairProcessor(DATA.RECIPES[dataset], src, tgt, train=True)
    decided_by_bounds = 0
    for _ in range(400):
        side = []
        for _ in range(2):
            n = rng.choice([1, 2, 5, 40, 120, 200])
            words = ["".join(rng.choice(chars) for _ in range(rng.randint(1, 5))) for _ in range(n)]
            side.append(" ".join(" ".join(words).split()))
        if not side[0] or not side[1]:
            continue
        assert proc.keep(*side) == proc.keep_exact(*side), side
        (ls, us), (lt, ut) = proc.bounds(src, side[0]), proc.bounds(tgt, side[1])
        assert ls <= proc.count[src](side[0]) <= us and lt <= proc.count[tgt](side[1]) <= ut, side
    # ordinary sentences need no tokenizer at all
    proc.count = None  # would fail if called
    assert proc.keep("The house is big .", "Das Haus ist groß .") is True
    assert proc.keep("Yes .", "Ja , das ist wirklich sehr sehr wahr und richtig .") is False


def test_download_from_url(tmp_path):
    """--download's fetching, on file:// URLs (tests never use the network): one
    file, and one whose download comes in parts that are concatenated; the published
    sizes and checksums (of the file, of each part) are checked."""
    import hashlib

    from fairseq_localness_data.sources import Remote, Source, download

    (tmp_path / "a.part0").write_bytes(b"first ")
    (tmp_path / "a.part1").write_bytes(b"second")
    first, second = (tmp_path / "a.part0").as_uri(), (tmp_path / "a.part1").as_uri()
    whole = Source("sub/whole.tgz", first, size=6, md5=hashlib.md5(b"first ").hexdigest(),
                   sha256=hashlib.sha256(b"first ").hexdigest())
    parts = Source("parts.tar.gz", "https://example.org/page",
                   parts=(Remote(first, size=6, sha1=hashlib.sha1(b"first ").hexdigest()), Remote(second)),
                   sha1=hashlib.sha1(b"first second").hexdigest())
    raw = tmp_path / "raw"
    download([whole, parts], str(raw))
    assert (raw / "sub" / "whole.tgz").read_bytes() == b"first "
    assert (raw / "parts.tar.gz").read_bytes() == b"first second"
    assert sorted(os.listdir(raw)) == ["parts.tar.gz", "sub"]


@pytest.mark.parametrize("bad", ["size", "md5", "part_sha1", "whole_sha1"])
def test_download_refuses_a_file_that_differs_from_the_published_one(tmp_path, bad):
    """A size or checksum that does not match: PrepareError naming both values; the
    file is not created (the bytes stay in NAME.part for inspection)."""
    import hashlib

    from fairseq_localness_data.sources import PrepareError, Remote, Source, download

    (tmp_path / "a").write_bytes(b"content")
    url, good_md5 = (tmp_path / "a").as_uri(), hashlib.md5(b"content").hexdigest()
    source = {
        "size": Source("f.tgz", url, size=8, md5=good_md5, checksum_from="a test"),
        "md5": Source("f.tgz", url, size=7, md5="0" * 32, checksum_from="a test"),
        "part_sha1": Source("f.tgz", "https://example.org", parts=(Remote(url, sha1="1" * 40),)),
        "whole_sha1": Source("f.tgz", "https://example.org", parts=(Remote(url, size=7),), sha1="2" * 40),
    }[bad]
    with pytest.raises(PrepareError) as e:
        download([source], str(tmp_path / "raw"))
    expected = {"size": "7 bytes, expected 8", "md5": f"md5 {good_md5}, expected {'0' * 32}",
                "part_sha1": "expected " + "1" * 40, "whole_sha1": "expected " + "2" * 40}[bad]
    assert expected in str(e.value) and "does not match what is published for f.tgz" in str(e.value)
    assert os.listdir(tmp_path / "raw") == ["f.tgz.part"]


def test_verify_and_size_warning(tmp_path):
    """`verify` checks present files against the manifest's checksums (exit 2 on a
    difference); `check` warns about a file whose size differs from the published one."""
    raw = tmp_path / "raw"
    raw.mkdir()
    make_wmt14(str(raw))  # fakes: the commoncrawl archive is far from its published size
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, "prepare_data.py"), "verify", "--dataset",
                        "wmt14_en_de", "--raw-dir", str(raw)], capture_output=True, text=True, env=tool_env())
    assert p.returncode == 2, p.stderr
    assert "training-parallel-commoncrawl.tgz: differs from what is published" in p.stderr
    assert "expected 918,311,367" in p.stderr and "dev.tgz: nothing published" in p.stderr
    p = prepare(str(raw), str(tmp_path / "out"), "wmt14_en_de", "--check")
    assert "warning: " in p.stderr and "the published size of training-parallel-commoncrawl.tgz is 918,311,367" \
        in p.stderr
    assert "STATUS=new" in p.stdout and not (tmp_path / "out").exists()


def test_wmt14_reverse_direction(tmp_path):
    out, exp, record = run_raw(tmp_path, "wmt14_en_de", make_wmt14, "de", "en")
    assert split_lines(out, "test", "de", "en") == swap(exp["test"])  # newstest2014-deen-src.de / ref.en
    assert split_lines(out, "valid", "de", "en") == swap(exp["valid"])


DC = {  # dataset: (valid sets, test sets, default bpe size)
    "iwslt14_es_en": (["TED.tst2010", "TED.tst2011", "TED.tst2012", "TED.dev2010"], ["TED.tst2014"], 34000),
    "iwslt14_ro_en": (["TED.tst2010", "TED.tst2011", "TED.tst2012", "TED.dev2010"], ["TED.tst2014"], 32000),
    "iwslt15_en_vi": (["TED.tst2012"], ["TED.tst2013"], 21000),
    "iwslt15_fr_en": (["TED.tst2013"], ["TED.tst2014", "TED.tst2015"], 31000),
}


@pytest.mark.parametrize("dataset", list(DC))
def test_dc_iwslt_splits(dataset, tmp_path):
    """The DC paper's splits; train.tags markup dropped, case kept, both directions."""
    valid, test, size = DC[dataset]
    recipe = DATA.RECIPES[dataset]
    a, b = recipe.langs
    reverse = dataset in ("iwslt14_ro_en", "iwslt15_en_vi")  # vi->en, en->ro
    src, tgt = (b, a) if reverse else (a, b)
    out, exp, record = run_raw(tmp_path, dataset, lambda raw: make_dc_iwslt(raw, dataset),
                               *((src, tgt) if reverse else (None, None)))
    fix = swap if reverse else list
    assert split_lines(out, "train", src, tgt) == fix(exp["train"])
    assert split_lines(out, "valid", src, tgt) == fix([p for name in valid for p in exp[name]])
    assert split_lines(out, "test", src, tgt) == fix([p for name in test for p in exp[name]])
    assert "Title 0" in open(os.path.join(out, "raw", f"train.{src}"), encoding="utf-8").read()
    assert record["bpe_size"] == size and record["lowercase"] is False
    assert not os.path.exists(os.path.join(out, "seg"))


def test_default_directions_and_bpe():
    for name, recipe in DATA.RECIPES.items():
        _, request = P.resolve(name)
        assert (request["src"], request["tgt"]) == recipe.langs == tuple(name.split("_")[1:])
    assert P.resolve("iwslt15_en_vi", "vi", "en")[1]["src"] == "vi"
    assert P.resolve("wmt14_en_de")[1]["bpe_size"] == 32000
    assert P.resolve("iwslt14_de_en")[1]["bpe_size"] == 10000
    assert P.resolve("iwslt14_de_en", bpe="sentencepiece", bpe_size=8000)[1]["bpe_size"] == 8000


def test_iwslt14_de_en_paper_variant(tmp_path):
    """The default variant: Song et al.'s test set (dev2010, tst2010, tst2011, tst2012;
    no TEDX.dev2012), case and U+2019 kept; train and valid as in fairseq's recipe."""
    out, exp, record = run_raw(tmp_path, "iwslt14_de_en", make_iwslt14_de_en)
    assert record["variant"] == "paper" and record["lowercase"] is False
    test = [p for name in ("TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012") for p in exp[name]]
    test = [(s, t.replace("isn't", "isn\u2019t")) for s, t in test]
    assert split_lines(out, "test", "de", "en") == test
    kept = exp["train"]
    assert split_lines(out, "train", "de", "en") == [p for i, p in enumerate(kept, 1) if i % 23]
    assert split_lines(out, "valid", "de", "en") == [p for i, p in enumerate(kept, 1) if i % 23 == 0]
    assert record["test_set"] == "dev2010 + tst2010 + tst2011 + tst2012 (Song et al. 2019), cased"
    # the fairseq variant of the same files: one more test set, lowercased
    fairseq = P.prepare_raw(*P.resolve("iwslt14_de_en", variant="fairseq"), str(tmp_path / "raw_download"),
                            str(tmp_path / "fairseq"))
    assert fairseq["sizes"]["test"] == record["sizes"]["test"] + len(exp["TEDX.dev2012"])
    assert fairseq["lowercase"] is True and fairseq["variant"] == "fairseq"
    assert P.prepared_name(P.resolve("iwslt14_de_en", "de", "en", "sentencepiece", 32000)[1]) == \
        "iwslt14_de_en-paper.de-en.sentencepiece32000"
    assert P.prepared_name(P.resolve("wmt17_zh_en")[1]) == "wmt17_zh_en.zh-en.subword-nmt32000.separate"
    assert P.prepared_name(P.resolve("wmt14_en_de", bpe_joint=False)[1]) == "wmt14_en_de.en-de.subword-nmt32000.separate"


def _config_datasets():
    """{dataset: {reproduce script}} from configs/papers and the scripts' rows."""
    import re

    repo = os.path.dirname(SCRIPTS)
    code = ('for f in "$1"/*.sh; do unset PAIRS; . "$f"; for p in "${PAIRS[@]}"; do '
            'echo "$(basename "$f" .sh) ${p%%|*}"; done; done')
    out = subprocess.run(["bash", "-c", code, "-", os.path.join(repo, "configs", "papers")], capture_output=True,
                         text=True, check=True).stdout
    datasets = {}
    for line in out.splitlines():
        config, dataset = line.split()
        datasets.setdefault(config, set()).add(dataset)
    used = {}
    for script in sorted(os.listdir(os.path.join(SCRIPTS, "reproduce"))):
        text = open(os.path.join(SCRIPTS, "reproduce", script)).read()
        for config in set(re.findall(r'^\s*"[^|"]*\|([A-Za-z0-9_]+)', text, re.M)):
            for dataset in datasets[config]:
                used.setdefault(dataset, set()).add(script)
    return used


def test_manifests_describe_every_dataset_the_tables_use():
    """Every manifest loads; its used_by names exactly the reproduce scripts whose rows
    use the dataset; every source has a URL, and a manual step or something to check
    a download against is said where there is one; licences are stated."""
    used = _config_datasets()
    assert set(used) <= set(DATA.DATASETS)
    for name, recipe in DATA.RECIPES.items():
        assert recipe.licence and recipe.title and recipe.test_description, name
        assert {u.split()[0] for u in recipe.used_by} == used.get(name, set()), name
        for source in recipe.sources:
            assert source.url.startswith(("http://", "https://")), source
            if source.whole.published or any(p.published for p in source.parts):
                assert source.checksum_from, source
    # what the papers' data needs by hand, and what --download can fetch
    manual = {n: sorted(s.name for s in r.sources if not s.downloadable) for n, r in DATA.RECIPES.items()}
    assert manual["wmt14_en_de"] == [] and manual["iwslt14_de_en"] == []
    assert manual["wmt17_zh_en"] == ["cwmt.tgz"]
    assert len(manual["wat17_ja_en"]) == 4 and manual["iwslt15_en_vi"] == ["en-vi.tgz"]
    assert all("2020-21" in s.manual for s in DATA.RECIPES["iwslt14_es_en"].sources)
    # published checksums of the WMT files (from sacrebleu, gluon-nlp and others)
    wmt14 = {s.name: s for s in DATA.RECIPES["wmt14_en_de"].sources}
    assert wmt14["test-full.tgz"].md5 == "a8cd784e006feb32ac6f3d9ec7eb389a"
    un = next(s for s in DATA.RECIPES["wmt17_zh_en"].sources if s.parts)
    assert [p.size for p in un.parts] == [1073741824, 312943879]
    # variants
    assert DATA.RECIPES["iwslt14_de_en"].variants == ("paper", "fairseq")
    assert [p.name for p in DATA.recipe_for("iwslt14_de_en", "fairseq").test][1] == "TEDX.dev2012"
    assert DATA.RECIPES["wmt17_zh_en"].bpe_joint is False and DATA.RECIPES["wmt14_en_de"].bpe_joint is True


def test_list_and_plan(tmp_path):
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, "prepare_data.py"), "list", "--dataset",
                        "wmt17_zh_en"], capture_output=True, text=True, env=tool_env())
    assert p.returncode == 0, p.stderr
    assert "used by: yang2018_table4.sh (zh-en.*), song2019_table4.sh" in p.stdout
    assert "part UNv1.0.en-zh.tar.gz.00: 1,073,741,824 bytes, sha1 1bec5f10297512183e483fdd4984d207700657d1" in p.stdout
    assert "cwmt.tgz  <-  http://nlp.nju.edu.cn/cwmt-wmt/ (the CWMT corpora are distributed on registration" \
        in p.stdout
    p = subprocess.run([sys.executable, os.path.join(SCRIPTS, "prepare_data.py"), "plan", "--dataset",
                        "iwslt14_de_en", "--bpe", "sentencepiece", "--bpe-size", "32000"],
                       capture_output=True, text=True, env=tool_env())
    assert p.returncode == 0, p.stderr
    assert "NAME=iwslt14_de_en-paper.de-en.sentencepiece32000" in p.stdout and "DOWNLOAD=all" in p.stdout
    assert "VARIANTS='paper fairseq'" in p.stdout


def test_defaults_under_data(tmp_path):
    """Without --raw-dir and --out: data/downloads/<dataset>/ and data/prepared/<name>
    next to the manifests (here a copy of them, so the repository stays untouched)."""
    import shutil

    root = tmp_path / "data"
    shutil.copytree(os.path.join(os.path.dirname(SCRIPTS), "data", "manifests"), root / "manifests")
    make_wmt14(str(root / "downloads" / "wmt14_en_de"))
    env = {"FAIRSEQ_LOCALNESS_MANIFESTS": str(root / "manifests")}
    p = run_script("prepare_data.sh", ["--dataset", "wmt14_en_de", "--check"], env=env)
    assert f"RAW={root}/downloads/wmt14_en_de" in p.stdout
    assert f"OUT={root}/prepared/wmt14_en_de.en-de.subword-nmt32000" in p.stdout
    assert "STATUS=new" in p.stdout and sorted(os.listdir(root)) == ["downloads", "manifests"]


def test_embedded_corpus_goes_to_data_corpus_by_default(tmp_path, monkeypatch, capsys):
    """fairseq-localness-corpus without --out writes data/corpus/ (under the repository's
    git-ignored data/ when run from its top), and --stats reads it from there."""
    from fairseq_localness.corpus import cli_main

    monkeypatch.chdir(tmp_path)
    assert cli_main(["--train-size", "40", "--valid-size", "5", "--test-size", "5"]) in (0, None)
    assert {"train.src", "train.tgt", "test.src"} <= set(os.listdir(tmp_path / "data" / "corpus"))
    capsys.readouterr()
    assert cli_main(["--stats"]) in (0, None)
    assert "train" in capsys.readouterr().out
    ignored = subprocess.run(["git", "check-ignore", "data/corpus/train.src", "data/downloads/x/a.tgz",
                              "data/prepared/x/bin/dict.en.txt"], cwd=os.path.dirname(SCRIPTS),
                             capture_output=True, text=True)
    assert len(ignored.stdout.split()) == 3, ignored
    tracked = subprocess.run(["git", "check-ignore", "data/README.md", "data/manifests/wmt14_en_de.json"],
                             cwd=os.path.dirname(SCRIPTS), capture_output=True, text=True)
    assert tracked.stdout == ""


# --------------------------------------------------------------------------- bad inputs
BAD = {  # args (RAW: the wmt14 fake download, EMPTY: an empty directory), message fragments
    "unknown_dataset": ("--dataset wmt15_en_de --raw-dir RAW --out NEW",
                        ["--dataset: expected one of: iwslt14_de_en iwslt14_es_en", "wmt14_en_de wmt17_zh_en", "got 'wmt15_en_de'"]),
    "wrong_pair": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --src en --tgt fr",
                   ["--src/--tgt: wmt14_en_de has no en->fr direction",
                    "expected --src en --tgt de or --src de --tgt en"]),
    "half_pair": ("--dataset iwslt15_en_vi --raw-dir RAW --out NEW --src vi",
                  ["--src/--tgt: give both or neither"]),
    "missing_raw_files": ("--dataset iwslt14_es_en --raw-dir EMPTY --out NEW",
                          ["lacks 2 file(s) of dataset iwslt14_es_en",
                           "es-en.tgz  <-  https://wit3.fbk.eu/archive/2014-01/texts/es/en/es-en.tgz",
                           "2014-01-test/es-en.tgz  <-  https://wit3.fbk.eu/archive/2014-01-test/texts/es/en/es-en.tgz",
                           "--download"]),
    "missing_one_file": ("--dataset wmt17_zh_en --raw-dir RAW --out NEW",
                         ["lacks 4 file(s)", "cwmt.tgz", "training-parallel-nc-v12.tgz  <-  https://data.statmt.org"]),
    "manual_download": ("--dataset wat17_ja_en --raw-dir EMPTY --out NEW --download",
                        ["ASPEC-JE/train/train-1.txt", "--download cannot fetch", "on application"]),
    "missing_raw_dir": ("--dataset wmt14_en_de --raw-dir /nonexistent --out NEW",
                        ["--raw-dir: expected a directory at '/nonexistent'"]),
    "bad_bpe": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --bpe wordpiece",
                ["--bpe: expected one of: subword-nmt sentencepiece; got 'wordpiece'"]),
    "bad_bpe_size": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --bpe-size 0",
                     ["--bpe-size: expected a whole number >= 1, got '0'"]),
    "small_vocab": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --bpe sentencepiece --bpe-size 8",
                    ["--bpe-size: expected a whole number >= 16 for sentencepiece"]),
    "missing_dataset": ("--raw-dir RAW --out NEW", ["missing required option --dataset"]),
    "out_exists": ("--dataset wmt14_en_de --raw-dir RAW --out EMPTY",
                   ["--out: '", "already exists (not a prepared dataset)", "--force"]),
    "unknown_option": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --lang en",
                       ["unknown option '--lang'"]),
    "download_wit3": ("--dataset iwslt15_fr_en --raw-dir EMPTY --out NEW --download",
                      ["--download cannot fetch fr-en.tgz, 2015-01-test/fr-en.tgz", "gone since 2020-21"]),
    "bad_variant": ("--dataset iwslt14_de_en --raw-dir RAW --out NEW --variant moses",
                    ["--variant: iwslt14_de_en has the variants paper, fairseq; got 'moses'"]),
    "variant_of_another_dataset": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --variant fairseq",
                                   ["--variant: wmt14_en_de has no variants; got 'fairseq'"]),
    "bad_bpe_joint": ("--dataset wmt14_en_de --raw-dir RAW --out NEW --bpe-joint separate",
                      ["--bpe-joint: expected one of: yes no; got 'separate'"]),
}


@pytest.fixture(scope="module")
def bad_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("prepare_bad")
    raw, empty = base / "raw", base / "empty"
    raw.mkdir()
    empty.mkdir()
    make_wmt14(str(raw))
    return {"RAW": str(raw), "EMPTY": str(empty)}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_fails_cleanly(case, bad_env, tmp_path):
    args, fragments = BAD[case]
    new = tmp_path / "new"
    env = dict(bad_env, NEW=str(new))
    before = {d: sorted(os.listdir(d)) for d in (tmp_path, bad_env["RAW"], bad_env["EMPTY"])}
    p = run_script("prepare_data.sh", [env.get(a, a) for a in args.split()], check=False)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("prepare_data.sh: error: "), p.stderr
    for fragment in fragments:
        assert fragment in p.stderr, (fragment, p.stderr)
    assert commands(p.stderr) == []
    assert not new.exists()
    assert {d: sorted(os.listdir(d)) for d in before} == before


def test_member_missing_inside_archive(tmp_path):
    """An archive that lacks an expected file stops the run (status 2) naming it;
    --out is not created and no temporary directory is left."""
    raw = tmp_path / "raw"
    raw.mkdir()
    make_wmt14(str(raw))
    write_archive(str(raw / "test-full.tgz"), {"test-full/newstest2014-fren-src.en.sgm": "x\n"})
    p = prepare(str(raw), str(tmp_path / "out"), "wmt14_en_de", check=False)
    assert p.returncode == 2, p.stderr
    assert "newstest2014-deen-src.en.sgm" in p.stderr and "test-full.tgz" in p.stderr
    assert sorted(os.listdir(tmp_path)) == ["raw"]
