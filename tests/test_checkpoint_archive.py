"""A model archive given to ``from_pretrained`` (fairseq's ``file_utils.load_archive_file``):
extracted into a folder of its own, left in place, and refused before anything is
written where a member would land outside that folder or is not a regular file or
folder (``checkpoint.files.extract_archive``)."""
import io
import os
import re
import tarfile

import pytest

from fairseq_localness.checkpoint import files
from fairseq_localness.checkpoint.errors import UntrustedCheckpointError
from fairseq_localness.compat.checkpoint_loading import patch_checkpoint_loading


def _archive(path, members):
    """A .tar.gz at ``path`` of ``(TarInfo fields, data)`` pairs."""
    with tarfile.open(path, "w:gz") as tar:
        for fields, data in members:
            info = tarfile.TarInfo(fields.pop("name"))
            for key, value in fields.items():
                setattr(info, key, value)
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return str(path)


def _good(tmp_path):
    return _archive(tmp_path / "model.tar.gz", [
        ({"name": "model", "type": tarfile.DIRTYPE}, None),
        ({"name": "model/model.pt"}, b"weights"),
        ({"name": "model/dict.src.txt"}, b"a 1\n"),
    ])


def test_an_archive_is_extracted_into_a_folder_of_its_own_and_left_in_place(tmp_path):
    path = _good(tmp_path)
    before = open(path, "rb").read()
    folder = files.extract_archive(path)
    assert sorted(os.listdir(folder)) == ["dict.src.txt", "model.pt"]
    assert open(os.path.join(folder, "model.pt"), "rb").read() == b"weights"
    assert os.path.isfile(path) and open(path, "rb").read() == before  # (fairseq's deletes it)
    assert not os.path.commonpath([folder, str(tmp_path)]) == str(tmp_path)


@pytest.mark.parametrize("names, folder", [
    (["model1.pt", "model2.pt", "dict.src.txt"], ""),  # (fairseq's common prefix of characters: 'model')
    (["./model1.pt", "./model2.pt"], ""),
    (["wmt/model1.pt", "wmt/model2.pt"], "wmt"),
    (["wmt/sub/model.pt"], "wmt/sub"),
])
def test_the_folder_is_the_members_common_folder(tmp_path, names, folder):
    top = files.extract_archive(_archive(tmp_path / "m.tar.gz", [({"name": n}, b"w") for n in names]))
    assert os.path.isdir(top) and sorted(os.listdir(top)) == sorted(
        {n.removeprefix("./").removeprefix(folder + "/").split("/")[0] for n in names})
    assert top.rstrip("/").endswith(folder) if folder else os.path.basename(top).startswith(
        "fairseq-localness-archive-")
    empty = _archive(tmp_path / "empty.tar.gz", [])
    with pytest.raises(UntrustedCheckpointError, match="holds no files"):
        files.extract_archive(empty)


@pytest.mark.parametrize("member, reason", [
    ({"name": "model/../../evil.pth"}, "names a file outside its folder"),
    ({"name": "/tmp/evil.pth"}, "names a file outside its folder"),
    ({"name": "model/link", "type": tarfile.SYMTYPE, "linkname": "/etc"}, "a link to '/etc' outside its folder"),
    ({"name": "model/up", "type": tarfile.SYMTYPE, "linkname": "../../etc"}, "a link to '../../etc' outside"),
    ({"name": "model/hard", "type": tarfile.LNKTYPE, "linkname": "../x"}, "a link to '../x' outside its folder"),
    ({"name": "model/fifo", "type": tarfile.FIFOTYPE}, "a device or FIFO"),
    ({"name": "model/dev", "type": tarfile.CHRTYPE, "devmajor": 1, "devminor": 5}, "a device or FIFO"),
])
def test_a_member_outside_the_folder_or_not_a_file_refuses_the_archive_before_anything_is_written(
        tmp_path, monkeypatch, member, reason):
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **k: pytest.fail("extracted"))
    data = b"x" if member.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else None
    path = _archive(tmp_path / "model.tar.gz", [({"name": "model/model.pt"}, b"w"), (dict(member), data)])
    with pytest.raises(UntrustedCheckpointError, match=reason) as e:
        files.extract_archive(path)
    assert "\n" not in str(e.value) and os.path.isfile(path)


@pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="tarfile without extraction filters")
def test_a_chain_of_links_that_leads_out_is_refused_and_nothing_is_left(tmp_path, monkeypatch):
    """Each link names a place inside the folder, but ``esc`` goes through ``sub/up``
    (a link to the folder's parent): tarfile's data filter refuses it; the refusal is
    the module's, and the folder is removed."""
    made = []
    mkdtemp = files.tempfile.mkdtemp
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **k: made.append(mkdtemp(**k)) or made[-1])
    path = _archive(tmp_path / "m.tar.gz", [
        ({"name": "sub", "type": tarfile.DIRTYPE}, None),
        ({"name": "sub/up", "type": tarfile.SYMTYPE, "linkname": ".."}, None),
        ({"name": "esc", "type": tarfile.SYMTYPE, "linkname": "sub/up/.."}, None),
    ])
    with pytest.raises(UntrustedCheckpointError, match="holds a member that tarfile's data filter refuses"):
        files.extract_archive(path)
    assert made and not os.path.exists(made[0])


@pytest.mark.parametrize("first", [True, False], ids=["first member", "second member"])
@pytest.mark.parametrize("kind", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE], ids=["gnu", "pax"])
def test_an_extended_header_past_its_bound_is_refused_before_it_is_read(tmp_path, monkeypatch, kind, first):
    """tarfile reads a GNU long name or a pax header whole, the first one while the
    archive is opened: a 765 KB .tar.gz claiming a name of 768 MB took 2.6 GB. The
    header's size is refused before it is read (here, with a bound of 64 KB, 128 KB)."""
    import gzip

    monkeypatch.setattr(files, "MAX_ARCHIVE_HEADER_BYTES", 64 << 10)
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **k: pytest.fail("extracted"))
    path = tmp_path / "long.tar.gz"
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = kind, 128 << 10
    with gzip.open(path, "wb") as f:
        if not first:
            f.write(tarfile.TarInfo("model").tobuf(tarfile.GNU_FORMAT))
        f.write(header.tobuf(tarfile.GNU_FORMAT) + b"a" * header.size)
        f.write(tarfile.TarInfo("model/model.pt").tobuf(tarfile.GNU_FORMAT) + b"\0" * 1024)
    with pytest.raises(UntrustedCheckpointError, match="holds a member's extended header of 131,072 bytes, more "
                                                       "than the 65,536 a long name needs"):
        files.extract_archive(str(path))


def test_a_global_pax_header_or_a_sparse_member_is_refused_as_it_is_met(tmp_path, monkeypatch):
    """tarfile copies a global pax header into every later member, and reads a sparse
    member's map for as many entries as it claims: neither is in a model archive."""
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **k: pytest.fail("extracted"))
    path = str(tmp_path / "global.tar.gz")
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT, pax_headers={"comment": "x"}) as tar:
        tar.addfile(tarfile.TarInfo("model"))
    with pytest.raises(UntrustedCheckpointError, match="holds a global pax header"):
        files.extract_archive(path)
    path = str(tmp_path / "sparse.tar.gz")
    member = tarfile.TarInfo("model/model.pt")
    member.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "model/model.pt",
                          "GNU.sparse.realsize": "10"}
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(member)
    with pytest.raises(UntrustedCheckpointError, match="holds a sparse member"):
        files.extract_archive(path)


def test_an_archive_past_its_bounds_or_not_an_archive_is_refused(tmp_path, monkeypatch):
    path = _good(tmp_path)
    monkeypatch.setattr(files, "MAX_ARCHIVE_BYTES", 10)
    with pytest.raises(UntrustedCheckpointError, match="holds more than 10 bytes"):
        files.extract_archive(path)
    monkeypatch.setattr(files, "MAX_ARCHIVE_BYTES", 1 << 30)
    monkeypatch.setattr(files, "MAX_ARCHIVE_MEMBERS", 2)
    with pytest.raises(UntrustedCheckpointError, match="holds more than 2 files"):
        files.extract_archive(path)
    (tmp_path / "plain.tar.gz").write_bytes(b"not an archive")
    with pytest.raises(UntrustedCheckpointError, match="is not a tar archive"):
        files.extract_archive(str(tmp_path / "plain.tar.gz"))
    os.mkfifo(tmp_path / "fifo.tar.gz")
    with pytest.raises(UntrustedCheckpointError, match="is not a regular file"):
        files.extract_archive(str(tmp_path / "fifo.tar.gz"))


def test_fairseqs_load_archive_file_goes_through_it(tmp_path):
    """The route ``from_pretrained`` takes: a path to an archive is extracted safely (the
    archive left), a folder is returned as it is, a traversal refused."""
    from fairseq import file_utils

    patch_checkpoint_loading()
    path = _good(tmp_path)
    folder = file_utils.load_archive_file(path)
    assert os.path.isfile(path) and sorted(os.listdir(folder)) == ["dict.src.txt", "model.pt"]
    assert file_utils.load_archive_file(folder) == folder
    bad = _archive(tmp_path / "bad.tar.gz", [({"name": "m/../../../evil.pth"}, b"import os")])
    with pytest.raises(UntrustedCheckpointError, match="outside its folder"):
        file_utils.load_archive_file(bad)
    assert not (tmp_path.parent / "evil.pth").exists()


def test_a_data_directory_outside_the_task_is_unset(tmp_path):
    """``data`` is the command line's (``cfg.task``, legacy ``args``): anywhere else in a
    checkpoint's settings it names a directory a nested task would read its
    dictionaries from (wav2vec 2.0's CTC model sets its pretraining task's from
    ``cfg.model.data``), and is unset."""
    import argparse

    settings = {"cfg": {"task": {"data": "/data/bin"}, "model": {"data": "/tmp/evil",
                                                                  "w2v_args": {"task": {"data": "/tmp/evil2"}}}},
                "args": argparse.Namespace(data="/data/bin")}
    files.drop_file_settings(settings, "ckpt.pt")
    assert settings["cfg"]["task"]["data"] == "/data/bin" and settings["args"].data == "/data/bin"
    assert settings["cfg"]["model"]["data"] is None and settings["cfg"]["model"]["w2v_args"]["task"]["data"] is None
    # without a data directory of its own, such a model takes the task's (fairseq's default
    # II("task.data")), the checkpoint's cfg.task.data: unset too, for the models whose
    # settings have that default (a checkpoint of wav2vec_ctc with /tmp/evil2 as its task's
    # data had fairseq-generate read /tmp/evil2/dict.txt); another model's are left as they are
    for name, unset in (("wav2vec_ctc", True), ("hubert_ctc", True), ("transformer", False)):
        settings = {"cfg": {"task": {"data": "/tmp/evil2"}, "model": {"_name": name}}}
        files.drop_file_settings(settings, "ckpt.pt")
        assert settings["cfg"]["model"] == ({"_name": name, "data": None} if unset else {"_name": name}), name
    # the model named as fairseq's build_model names it: by arch, and as the one key of a section
    for model in ({"arch": "wav2vec_ctc"}, {"_name": None, "arch": "hubert_ctc"}):
        settings = {"cfg": {"task": {"data": "/tmp/evil2"}, "model": dict(model)}}
        files.drop_file_settings(settings, "ckpt.pt")
        assert settings["cfg"]["model"] == dict(model, data=None), model
    settings = {"cfg": {"task": {"data": "/tmp/evil2"}, "model": {"wav2vec_ctc": {"normalize": False}}}}
    files.drop_file_settings(settings, "ckpt.pt")
    assert settings["cfg"]["model"]["wav2vec_ctc"] == {"normalize": False, "data": None}


def test_what_a_task_reads_in_a_subfolder_of_the_hubs_folder_is_checked(tmp_path):
    """``input0/dict.txt`` and ``label/dict.txt`` (sentence classification), a YAML
    configuration (the speech tasks): a FIFO, or a link out of the folder, is refused;
    other files (the weights) are not read here."""
    folder = tmp_path / "hub"
    (folder / "input0").mkdir(parents=True)
    (folder / "model.pt").write_bytes(b"x" * 100)
    (folder / "input0" / "dict.txt").write_text("a 1\n")
    files.check_beside(str(folder))
    os.mkfifo(folder / "label")  # (not a folder: not listed)
    files.check_beside(str(folder))
    os.remove(folder / "label")
    (folder / "label").mkdir()
    os.mkfifo(folder / "label" / "dict.txt")
    with pytest.raises(UntrustedCheckpointError, match=r"its file 'label/dict.txt', which a task may read, is not a "
                                                         "regular file"):
        files.check_beside(str(folder))
    os.remove(folder / "label" / "dict.txt")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dict.txt").write_text("a 1\n")
    os.rmdir(folder / "label")
    os.symlink(outside, folder / "label")
    with pytest.raises(UntrustedCheckpointError, match="outside the checkpoint's folder"):
        files.check_beside(str(folder))
    os.remove(folder / "label")
    os.mkfifo(folder / "config.yaml")
    with pytest.raises(UntrustedCheckpointError, match="'config.yaml', which the hub reads, is not a regular file"):
        files.check_beside(str(folder))


def test_the_files_a_tasks_yaml_configuration_names_are_checked(tmp_path, monkeypatch):
    """The speech tasks open the files their YAML configuration names as they are set
    up (``speaker_set_filename`` read line by line: ``/dev/zero`` took 2.4 GB in 2 s, a
    FIFO hung). Where a checkpoint's task is set up, fairseq's reading of the
    configuration (whatever its name and folder) is checked first: each string naming
    an existing path that is not a folder, absolute or relative to the working
    directory or to the configuration's folder or one above it (the data directory),
    must be a regular file of bounded size (unless trusted); names of nothing, of
    folders, and plain words pass. A task set up from the command line reads the
    user's own configuration as it is."""
    from fairseq.data.audio import data_cfg

    from fairseq_localness.checkpoint import TRUST_ENV
    from fairseq_localness.checkpoint.model_size import loading_checkpoint

    monkeypatch.delenv(TRUST_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "hub"
    (folder / "fbank").mkdir(parents=True)
    (folder / "conf").mkdir()
    (folder / "spm.model").write_bytes(b"x" * 100)
    outside = tmp_path / "gcmvn.npz"
    outside.write_bytes(b"x" * 10)
    config = folder / "conf" / "settings.conf"  # (config_yaml names any file, in any folder of the data's)
    config.write_text(f"bpe_tokenizer:\n  bpe: sentencepiece\n  sentencepiece_model: spm.model\n"
                      f"audio_root: fbank\nglobal_cmvn: {{stats_npz_path: {outside}}}\nvocab_filename: missing.txt\n"
                      "transforms: &t [utterance_cmvn]\nagain: *t\n")
    with loading_checkpoint():
        assert data_cfg.get_config_from_yaml(config)["vocab_filename"] == "missing.txt"
    os.mkfifo(folder / "speakers.txt")
    for named, shown in (("/dev/zero", "/dev/zero"), ("speakers.txt", os.path.join(folder, "speakers.txt")),
                         ("x://y", os.path.join(folder, "x://y"))):  # (fairseq opens the folder's x:/y)
        if named == "x://y":
            os.makedirs(folder / "x:")
            os.mkfifo(folder / "x:" / "y")
        config.write_text(f"speaker_set_filename: '{named}'\n")
        with pytest.raises(UntrustedCheckpointError, match=f"the file '{re.escape(shown)}' named by the task's "
                                                           "configuration .* is not a regular file"):
            with loading_checkpoint():
                data_cfg.get_config_from_yaml(config)
    assert data_cfg.get_config_from_yaml(config)["speaker_set_filename"] == "x://y"  # (the user's own)
    config.write_text("vocoder: {type: hifigan, checkpoint: spm.model}\n")
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 50)
    with pytest.raises(UntrustedCheckpointError, match="the file '.*spm.model' named by the task's configuration .* "
                                                       "is 100 bytes, more than the 50"):
        files.check_configuration(config)
    monkeypatch.setattr(files, "MAX_CONFIG_BYTES", 10)
    with pytest.raises(UntrustedCheckpointError, match="is 48 bytes, more than the 10 a task's configuration takes"):
        files.check_configuration(config)
    monkeypatch.setenv(TRUST_ENV, "1")
    files.check_configuration(config)


def test_a_configuration_of_aliases_is_counted_as_fairseq_copies_it(tmp_path):
    """fairseq rebuilds the dicts of some sections of a speech configuration
    (``_auto_convert_to_abs_path``), each alias again: 665 bytes of aliases took 10 s
    and 229 MB there, 1.3 KB never ended. The configuration is counted as a copy
    counts it, and refused past its bound."""
    lines = ["l0: &l0 {s: sentencepiece}"]
    for depth in range(1, 7):
        lines.append(f"l{depth}: &l{depth} {{" + ", ".join(f"k{i}: *l{depth - 1}" for i in range(10)) + "}")
    config = tmp_path / "config.yaml"
    config.write_text("\n".join(lines + ["bpe_tokenizer: *l6"]) + "\n")
    with pytest.raises(UntrustedCheckpointError, match="expands to more than 100000 values when copied"):
        files.check_configuration(config)


def test_a_chain_of_extended_headers_is_refused(tmp_path, monkeypatch):
    """tarfile reads the header after an extended header within it, keeping each: a
    chain of pax headers, each under the bound, took 300 MB for 40 and ended in a
    RecursionError for 400. More than four before one member are refused."""
    monkeypatch.setattr(files.tempfile, "mkdtemp", lambda **k: pytest.fail("extracted"))
    path = tmp_path / "chain.tar"
    with open(path, "wb") as f:
        for level in range(6):
            body = b" comment=x\n"
            data = str(len(body) + 2).encode() + body
            header = tarfile.TarInfo(f"pax{level}")
            header.type, header.size = tarfile.XHDTYPE, len(data)
            f.write(header.tobuf(format=tarfile.USTAR_FORMAT) + data + b"\0" * (-len(data) % 512))
        member = tarfile.TarInfo("model/model.pt")
        member.size = 1
        f.write(member.tobuf(format=tarfile.USTAR_FORMAT) + b"x" + b"\0" * 511 + b"\0" * 1024)
    with pytest.raises(UntrustedCheckpointError, match="holds more than 4 extended headers before one member"):
        files.extract_archive(str(path))
    two = tmp_path / "two.tar"  # (a long link and a long name: as GNU tar writes them)
    with tarfile.open(two, "w", format=tarfile.GNU_FORMAT) as tar:
        link = tarfile.TarInfo("model/" + "l" * 200)
        link.type, link.linkname = tarfile.SYMTYPE, "model/" + "t" * 200
        tar.addfile(tarfile.TarInfo("model/" + "t" * 200), io.BytesIO(b""))
        tar.addfile(link)
    monkeypatch.undo()
    assert os.path.isdir(files.extract_archive(str(two)))


def test_the_dictionaries_of_a_folder_are_bounded_together(tmp_path, monkeypatch):
    """Each dictionary is bounded, and so are their number (links to one file cost
    nothing: 3,000 of them, with multilingual_translation's language tokens, took 1.7
    GB) and, unless the checkpoint is trusted, their lines together."""
    from fairseq_localness.checkpoint import TRUST_ENV

    monkeypatch.delenv(TRUST_ENV, raising=False)
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "dict.en.txt").write_text("a 1\nb 1\nc 1\n")
    for lang in ("de", "fr", "es"):
        os.symlink("dict.en.txt", folder / f"dict.{lang}.txt")
    files.check_beside(str(folder))
    monkeypatch.setattr(files, "MAX_HUB_DICTIONARIES", 3)
    with pytest.raises(UntrustedCheckpointError, match="its folder holds 4 dictionaries, more than the 3 a model"):
        files.check_beside(str(folder))
    monkeypatch.setattr(files, "MAX_HUB_DICTIONARIES", 4)
    monkeypatch.setattr(files, "MAX_HUB_SYMBOLS", 10)
    with pytest.raises(UntrustedCheckpointError, match="its dictionaries hold more than 10 lines or "):
        files.check_beside(str(folder))
    monkeypatch.setattr(files, "MAX_HUB_SYMBOLS", 100)
    monkeypatch.setattr(files, "MAX_HUB_DICTIONARY_BYTES", 30)  # (4 x 12 bytes)
    with pytest.raises(UntrustedCheckpointError, match="its dictionaries hold more than 100 lines or 30 bytes"):
        files.check_beside(str(folder))
    monkeypatch.setenv(TRUST_ENV, "1")
    files.check_beside(str(folder))


def test_an_analysis_tool_splits_the_recorded_data_directory_as_fairseq_does(tmp_path, monkeypatch):
    """fairseq splits a data setting holding '://' on '|', not ':': the folder the tool
    checks for a FIFO is the one fairseq's task then reads (``<D>::/`` here)."""
    import argparse

    from fairseq import checkpoint_utils

    from fairseq_localness.analysis.checkpoint import load_checkpoint
    from fairseq_localness.checkpoint import CheckpointError

    folder = tmp_path / "d::"
    folder.mkdir()
    os.mkfifo(folder / "dict.src.txt")
    ckpt = tmp_path / "model.pt"
    ckpt.write_bytes(b"x")
    state = {"cfg": argparse.Namespace(task=argparse.Namespace(data=f"{tmp_path}/d:://|x"))}
    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", lambda path: state)
    monkeypatch.setattr(checkpoint_utils, "load_model_ensemble_and_task", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(CheckpointError, match="the dictionary 'dict.src.txt' in the data directory it records"):
        load_checkpoint(str(ckpt), None, True)


def test_a_dictionary_of_more_symbols_than_any_vocabulary_is_refused(tmp_path, monkeypatch):
    """Within the size bound a dictionary of one-letter symbols costs fairseq about 30
    times its size in memory: more lines than :data:`MAX_DICTIONARY_SYMBOLS` are refused
    (beside a checkpoint, and in a subfolder)."""
    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "dict.src.txt").write_text("".join(f"{i} 1\n" for i in range(50)))
    monkeypatch.setattr(files, "MAX_DICTIONARY_SYMBOLS", 50)
    files.check_beside(str(folder))
    (folder / "dict.src.txt").write_text("".join(f"{i} 1\n" for i in range(51)))
    with pytest.raises(UntrustedCheckpointError, match="'dict.src.txt', which the hub reads, holds 51 lines, more "
                                                         "than the 50 symbols a dictionary takes"):
        files.check_beside(str(folder))


def test_links_inside_the_archives_folder_are_extracted(tmp_path):
    """GNU tar stores a file it meets twice as a hard link, and a joined dictionary is
    often a symbolic link to the other: both inside the folder load."""
    path = _archive(tmp_path / "model.tar.gz", [
        ({"name": "model", "type": tarfile.DIRTYPE}, None),
        ({"name": "model/model.pt"}, b"weights"),
        ({"name": "model/dict.src.txt"}, b"a 1\n"),
        ({"name": "model/dict.tgt.txt", "type": tarfile.SYMTYPE, "linkname": "dict.src.txt"}, None),
        ({"name": "model/copy.pt", "type": tarfile.LNKTYPE, "linkname": "model/model.pt"}, None),
    ])
    folder = files.extract_archive(path)
    assert open(os.path.join(folder, "dict.tgt.txt")).read() == "a 1\n"
    assert open(os.path.join(folder, "copy.pt"), "rb").read() == b"weights"
    files.check_beside(folder)


def test_a_large_dictionary_loads_where_the_file_is_trusted(tmp_path, monkeypatch):
    from fairseq_localness.checkpoint import TRUST_ENV

    folder = tmp_path / "hub"
    folder.mkdir()
    (folder / "dict.src.txt").write_text("".join(f"{i} 1\n" for i in range(51)))
    monkeypatch.setattr(files, "MAX_DICTIONARY_SYMBOLS", 50)
    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(UntrustedCheckpointError, match=f"holds 51 lines.*set {TRUST_ENV}=1"):
        files.check_beside(str(folder))
    monkeypatch.setenv(TRUST_ENV, "1")
    files.check_beside(str(folder))
