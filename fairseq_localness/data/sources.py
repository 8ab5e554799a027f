"""The raw files of a dataset: where they come from, finding them in ``--raw-dir``,
reading members out of their archives, downloading the missing ones.

A :class:`Source` is one file as it is downloaded (an archive, or a plain file such
as ASPEC's ``train-1.txt``), named by its path relative to ``--raw-dir``. Recipes
refer to the texts inside archives by member path patterns (:class:`Member`): a
pattern matches a member whose path is the pattern or ends with ``/`` + the pattern
(``fnmatch`` wildcards allowed), so the archive's top-level directory does not
matter.
"""
import fnmatch
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


class PrepareError(Exception):
    """A bad option or input: the message names it and says what was expected.
    The command line tool prints it and exits with status 2."""


ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip")


@dataclass(frozen=True)
class Source:
    """One downloaded file.

    ``name``: its path relative to ``--raw-dir`` (the download's own file name; a
    subdirectory only where two releases use the same file name).
    ``url``: where it is downloaded from; ``parts``: URLs whose concatenation is the
    file (a download split in pieces). ``manual``: how to obtain it when it cannot
    be downloaded by a script (registration or application); ``--download`` then
    stops and says so. ``alternatives``: other accepted paths relative to
    ``--raw-dir`` (e.g. with the distribution's top-level directory).
    """

    name: str
    url: str
    parts: Tuple[str, ...] = ()
    manual: str = ""
    alternatives: Tuple[str, ...] = ()
    description: str = ""

    @property
    def is_archive(self) -> bool:
        return self.name.endswith(ARCHIVE_SUFFIXES)

    @property
    def downloadable(self) -> bool:
        return not self.manual

    def find(self, raw_dir: str) -> Optional[str]:
        """The path of this file under raw_dir, or None."""
        for rel in (self.name,) + self.alternatives:
            path = os.path.join(raw_dir, rel)
            if os.path.isfile(path):
                return path
        return None

    def describe(self) -> str:
        where = self.url if self.downloadable else f"{self.url} ({self.manual})"
        if self.parts:
            where += " (download the parts " + ", ".join(self.parts) + " and concatenate them)"
        alt = "".join(f" or {a}" for a in self.alternatives)
        return f"{self.name}{alt}  <-  {where}"


@dataclass(frozen=True)
class Member:
    """A text inside the raw files: ``pattern`` (see the module doc) looked up in
    each of ``sources`` in turn (the first that has it wins). For a plain-file
    source, the pattern is ignored and the file itself is the text."""

    sources: Tuple[Source, ...]
    pattern: str = ""

    def label(self) -> str:
        return self.pattern or self.sources[0].name


def missing_sources(sources: Iterable[Source], raw_dir: str) -> List[Source]:
    return [s for s in sources if s.find(raw_dir) is None]


def missing_message(recipe_name: str, raw_dir: str, missing: Sequence[Source], download: bool) -> str:
    lines = [f"--raw-dir: '{raw_dir}' lacks {len(missing)} file(s) of dataset {recipe_name}. "
             "Expected (path under --raw-dir  <-  where to get it):"]
    lines += [f"  {s.describe()}" for s in missing]
    if download:
        manual = [s.name for s in missing if not s.downloadable]
        lines.append("--download cannot fetch " + ", ".join(manual) + ": obtain it as described and put it there.")
    else:
        lines.append("Put them there under these names, or pass --download to fetch the downloadable ones.")
    return "\n".join(lines)


def _matches(name: str, pattern: str) -> bool:
    name = name.lstrip("./")
    return fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, "*/" + pattern)


def _archive_names(path: str) -> List[str]:
    if path.endswith(".zip"):
        with zipfile.ZipFile(path) as z:
            return [i.filename for i in z.infolist() if not i.is_dir()]
    with tarfile.open(path, "r:*") as t:
        return [m.name for m in t.getmembers() if m.isfile()]


class RawFiles:
    """The raw files of one dataset in ``raw_dir``; members are extracted (once,
    one pass per archive) into ``work_dir`` and read from there."""

    def __init__(self, raw_dir: str, work_dir: str):
        self.raw_dir = raw_dir
        self.work_dir = work_dir
        self._names: Dict[str, List[str]] = {}
        self._extracted: Dict[Tuple[str, str], str] = {}

    def _path(self, source: Source) -> str:
        path = source.find(self.raw_dir)
        if path is None:
            raise PrepareError(missing_message("?", self.raw_dir, [source], False))
        return path

    def names(self, source: Source) -> List[str]:
        if source.name not in self._names:
            path = self._path(source)
            try:
                self._names[source.name] = _archive_names(path)
            except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as e:
                raise PrepareError(f"--raw-dir: '{path}' is not a readable archive ({e}); expected "
                                   f"the file downloaded from {source.url}")
        return self._names[source.name]

    def locate(self, member: Member) -> Optional[Tuple[Source, str]]:
        """(source, member name) of the first source that has it, else None."""
        for source in member.sources:
            if source.find(self.raw_dir) is None:
                continue
            if not source.is_archive:
                return source, ""
            for name in self.names(source):
                if _matches(name, member.pattern):
                    return source, name
        return None

    def extract(self, located: Sequence[Tuple[Source, str]]) -> Dict[Tuple[str, str], str]:
        """Plain-file paths of located members ((source, member name) pairs from
        :meth:`locate`), keyed by (source name, member name): members of archives are
        extracted into work_dir, one pass per archive; plain files are used in place."""
        wanted: Dict[str, set] = {}
        sources: Dict[str, Source] = {}
        for source, name in located:
            sources[source.name] = source
            if source.is_archive and (source.name, name) not in self._extracted:
                wanted.setdefault(source.name, set()).add(name)
        for source_name, names in wanted.items():
            self._extract_from(sources[source_name], names)
        out: Dict[Tuple[str, str], str] = {}
        for source, name in located:
            out[(source.name, name)] = self._extracted[(source.name, name)] if source.is_archive else self._path(source)
        return out

    def _extract_from(self, source: Source, names: set) -> None:
        path = self._path(source)
        dest_root = os.path.join(self.work_dir, source.name.replace("/", "__"))
        print(f"+ extract {len(names)} file(s) from {path}", file=sys.stderr)

        def target(name: str) -> str:
            dest = os.path.normpath(os.path.join(dest_root, name.lstrip("./")))
            if not dest.startswith(dest_root + os.sep):
                raise PrepareError(f"--raw-dir: '{path}' has a member outside the archive: '{name}'")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            return dest

        if source.name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                for name in names:
                    dest = target(name)
                    with z.open(name) as src, open(dest, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    self._extracted[(source.name, name)] = dest
            return
        with tarfile.open(path, "r:*") as t:
            for m in t:
                if m.isfile() and m.name in names:
                    dest = target(m.name)
                    with t.extractfile(m) as src, open(dest, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                    self._extracted[(source.name, m.name)] = dest


def download(sources: Sequence[Source], raw_dir: str) -> None:
    """Download the given sources into raw_dir (each under a temporary name first)."""
    for s in sources:
        dest = os.path.join(raw_dir, s.name)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        tmp = dest + ".part"
        urls = s.parts or (s.url,)
        with open(tmp, "wb") as out:
            for url in urls:
                print(f"+ download {url} -> {dest}", file=sys.stderr)
                with urllib.request.urlopen(url) as r:  # noqa: S310 (URLs are the recipes' own)
                    shutil.copyfileobj(r, out, 1 << 20)
        os.replace(tmp, dest)
