"""fairseq_localness.atomic: files written whole or not at all."""
import os
import stat

import pytest

from fairseq_localness.atomic import replacing, write_text


def test_a_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("old\n")
    write_text(str(path), "new\nlines\n")
    assert path.read_text() == "new\nlines\n"
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary_file(tmp_path):
    path = tmp_path / "report.html"
    path.write_text("old")
    for error in (RuntimeError("disk full"), SystemExit(2), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with replacing(str(path)) as tmp:
                with open(tmp, "x") as f:
                    f.write("half a page")
                raise error
        assert path.read_text() == "old"
        assert os.listdir(tmp_path) == ["report.html"]
    with pytest.raises(RuntimeError):  # a block that fails before writing anything
        with replacing(str(tmp_path / "never.json")):
            raise RuntimeError("no")
    assert os.listdir(tmp_path) == ["report.html"]


def test_two_writers_of_one_file_have_temporary_files_of_their_own(tmp_path):
    """Two writes of the same file at once (two tasks of one SLURM job): each its own
    temporary file, named beside the file (hidden, ending in the suffix asked for);
    the last rename wins, and neither fails."""
    path = str(tmp_path / "job.json")
    with replacing(path, ".png") as first, replacing(path, ".png") as second:
        assert first != second
        assert os.path.dirname(first) == str(tmp_path) and os.path.basename(first).startswith(".job.json.")
        assert first.endswith(".png") and second.endswith(".png")
        with open(first, "x") as f:
            f.write("first")
        with open(second, "x") as f:
            f.write("second")
    assert open(path).read() == "first"  # the outer block ends last
    assert sorted(os.listdir(tmp_path)) == ["job.json"]


def test_the_file_gets_the_permissions_of_any_new_file(tmp_path):
    """The umask's permissions (a temporary file made private would stay private after
    the rename: a results page others on the cluster could not read)."""
    old = os.umask(0o022)
    try:
        write_text(str(tmp_path / "results.md"), "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "results.md").st_mode) == 0o644
