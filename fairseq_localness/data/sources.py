"""The raw files of a dataset: where they come from, finding them in ``--raw-dir``,
reading members out of their archives, downloading the missing ones.

A :class:`Source` is one file as it is downloaded (an archive, or a plain file such
as ASPEC's ``train-1.txt``), named by its path relative to ``--raw-dir``. Recipes
refer to the texts inside archives by member path patterns (:class:`Member`): a
pattern matches a member whose path is the pattern or ends with ``/`` + the pattern
(``fnmatch`` wildcards allowed), so the archive's top-level directory does not
matter.

Downloads (:func:`download`) stream into ``NAME.part`` with a progress bar (tqdm),
compute the checksums the manifest publishes for the file (md5, sha1, sha256) and its
size on the way, and rename the file into place only when they match.
"""
import fnmatch
import hashlib
import logging
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from dataclasses import dataclass
from typing import BinaryIO, Dict, Iterable, List, Optional, Sequence, Tuple

logger = logging.getLogger(__name__)

CHECKSUMS = ("md5", "sha1", "sha256")


class PrepareError(Exception):
    """A bad option or input: the message names it and says what was expected.
    The command line tool prints it and exits with status 2."""


ARCHIVE_SUFFIXES = (".tgz", ".tar.gz", ".tar", ".zip")


def progress(iterable=None, **kwargs):
    """A tqdm progress bar on stderr: redrawn every second on a terminal, every 30
    seconds otherwise (a log file gets a line now and then, not thousands).
    ``TQDM_DISABLE=1`` turns the bars off (tqdm's own environment variable)."""
    from tqdm import tqdm

    interactive = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    kwargs.setdefault("mininterval", 1.0 if interactive else 30.0)
    kwargs.setdefault("file", sys.stderr)
    kwargs.setdefault("dynamic_ncols", interactive)
    return tqdm(iterable, **kwargs)


@dataclass(frozen=True)
class Remote:
    """One URL and what is published about the file behind it (size in bytes,
    checksums as lower-case hex; empty where nothing is published)."""

    url: str
    size: Optional[int] = None
    md5: str = ""
    sha1: str = ""
    sha256: str = ""

    @property
    def checksums(self) -> Dict[str, str]:
        return {a: getattr(self, a).lower() for a in CHECKSUMS if getattr(self, a)}

    @property
    def published(self) -> bool:
        return bool(self.size or self.checksums)


@dataclass(frozen=True)
class Source:
    """One downloaded file.

    ``name``: its path relative to ``--raw-dir`` (the download's own file name; a
    subdirectory only where two releases use the same file name).
    ``url``: where it is downloaded from; ``parts``: the pieces (:class:`Remote`,
    each with its own size and checksums) whose concatenation is the file.
    ``manual``: how to obtain it when it cannot be downloaded by a script
    (registration, application, or an address that no longer exists); ``--download``
    then stops and says so. ``alternatives``: other accepted paths relative to
    ``--raw-dir`` (e.g. with the distribution's top-level directory). ``size``,
    ``md5``, ``sha1``, ``sha256``: the published size and checksums of the whole
    file (where there are), ``checksum_from`` where they were published.
    """

    name: str
    url: str
    parts: Tuple[Remote, ...] = ()
    manual: str = ""
    alternatives: Tuple[str, ...] = ()
    description: str = ""
    size: Optional[int] = None
    md5: str = ""
    sha1: str = ""
    sha256: str = ""
    checksum_from: str = ""

    @property
    def whole(self) -> Remote:
        """The file as a whole (its URL is a download only when there are no parts)."""
        return Remote(self.url, self.size, self.md5, self.sha1, self.sha256)

    @property
    def remotes(self) -> Tuple[Remote, ...]:
        """What --download fetches, in order."""
        return self.parts or (self.whole,)

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
            where += " (download the parts " + ", ".join(p.url for p in self.parts) + " and concatenate them)"
        alt = "".join(f" or {a}" for a in self.alternatives)
        return f"{self.name}{alt}  <-  {where}"

    def check_size(self, path: str) -> Optional[str]:
        """A warning when the file's size differs from the published one (a truncated
        or different download), else None. Cheap: one stat."""
        size = self.size or (sum(p.size for p in self.parts) if self.parts and all(p.size for p in self.parts)
                             else None)
        if size is None:
            return None
        have = os.path.getsize(path)
        if have == size:
            return None
        return (f"{path} has {have:,} bytes; the published size of {self.name} is {size:,} "
                f"({self.checksum_from or 'see its manifest'}): a truncated or different download?")


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
        logger.info("extracting %d file(s) from %s", len(names), path)

        def target(name: str) -> str:
            dest = os.path.normpath(os.path.join(dest_root, name.lstrip("./")))
            if not dest.startswith(dest_root + os.sep):
                raise PrepareError(f"--raw-dir: '{path}' has a member outside the archive: '{name}'")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            return dest

        if source.name.endswith(".zip"):
            with zipfile.ZipFile(path) as z:
                total = sum(z.getinfo(n).file_size for n in names)
                with progress(total=total, unit="B", unit_scale=True, desc=f"extract {source.name}") as bar:
                    for name in names:
                        dest = target(name)
                        with z.open(name) as src, open(dest, "wb") as dst:
                            _copy(src, dst, bar)
                        self._extracted[(source.name, name)] = dest
            return
        # a compressed tar is read from the start: the bar counts the archive's bytes read
        with open(path, "rb") as raw, progress(total=os.path.getsize(path), unit="B", unit_scale=True,
                                               desc=f"extract {source.name}") as bar:
            counted = _CountingReader(raw, bar)
            with tarfile.open(fileobj=counted, mode="r:*") as t:
                for m in t:
                    if m.isfile() and m.name in names:
                        dest = target(m.name)
                        with t.extractfile(m) as src, open(dest, "wb") as dst:
                            shutil.copyfileobj(src, dst, 1 << 20)
                        self._extracted[(source.name, m.name)] = dest


class _CountingReader:
    """A binary file that reports its reads to a progress bar."""

    def __init__(self, f: BinaryIO, bar):
        self.f, self.bar = f, bar

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.bar.update(len(data))
        return data

    def readinto(self, b) -> int:
        n = self.f.readinto(b)
        self.bar.update(n or 0)
        return n

    def seek(self, *args):
        return self.f.seek(*args)

    def tell(self) -> int:
        return self.f.tell()

    def seekable(self) -> bool:
        return self.f.seekable()

    def readable(self) -> bool:
        return True


def _copy(src: BinaryIO, dst: BinaryIO, bar, hashes: Optional[Dict[str, "hashlib._Hash"]] = None) -> int:
    """Copy src to dst in 1 MiB blocks, updating the bar and the hashes; the bytes copied."""
    n = 0
    while True:
        block = src.read(1 << 20)
        if not block:
            return n
        dst.write(block)
        for h in (hashes or {}).values():
            h.update(block)
        n += len(block)
        bar.update(len(block))


def _problems(remote: Remote, size: int, hashes: Dict[str, "hashlib._Hash"]) -> List[str]:
    """How a file of `size` bytes with these hashes differs from what is published."""
    out = []
    if remote.size is not None and size != remote.size:
        out.append(f"{size:,} bytes, expected {remote.size:,}")
    for algo, want in remote.checksums.items():
        got = hashes[algo].hexdigest()
        if got != want:
            out.append(f"{algo} {got}, expected {want}")
    return out


def _check(what: str, remote: Remote, size: int, hashes: Dict[str, "hashlib._Hash"], source: Source,
           keep: str) -> None:
    problems = _problems(remote, size, hashes)
    if problems:
        raise PrepareError(f"--download: {what} does not match what is published for {source.name} "
                           f"({source.checksum_from or 'its manifest'}): {'; '.join(problems)}. "
                           f"The download is kept as {keep}; delete it and try again, or get the file another way.")
    if remote.published:
        checked = (["size"] if remote.size is not None else []) + sorted(remote.checksums)
        logger.info("%s: %s as published", what, ", ".join(checked))


class _Sink:
    def write(self, block: bytes) -> None:
        pass


def download(sources: Sequence[Source], raw_dir: str) -> None:
    """Download the given sources into raw_dir: each into NAME.part (the parts of a
    split download one after the other), with a progress bar, checked against the
    published sizes and checksums, then renamed to NAME. A mismatch stops with a
    PrepareError and leaves NAME.part for inspection (NAME is not created)."""
    for s in sources:
        dest = os.path.join(raw_dir, s.name)
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        tmp = dest + ".part"
        whole = {a: hashlib.new(a) for a in s.whole.checksums}
        total = 0
        with open(tmp, "wb") as out:
            for remote in s.remotes:
                logger.info("downloading %s -> %s", remote.url, dest)
                own = {a: hashlib.new(a) for a in remote.checksums} if s.parts else {}
                with urllib.request.urlopen(remote.url) as r:  # noqa: S310 (URLs are the manifests' own)
                    length = (getattr(r, "headers", None) or {}).get("Content-Length")
                    expected = remote.size or (int(length) if length and str(length).isdigit() else None)
                    with progress(total=expected, unit="B", unit_scale=True,
                                  desc=os.path.basename(remote.url)) as bar:
                        n = _copy(r, out, bar, {**{"part " + a: h for a, h in own.items()}, **whole})
                total += n
                if s.parts:
                    _check(remote.url, remote, n, own, s, tmp)
        _check(dest if s.parts else s.url, s.whole, total, whole, s, tmp)
        os.replace(tmp, dest)


def verify(source: Source, path: str) -> List[str]:
    """Check a file against the published size and checksums of its source (reads it
    once, with a progress bar); the differences found (empty: it matches, or nothing
    is published)."""
    whole = source.whole
    if not whole.published:
        return []
    hashes = {a: hashlib.new(a) for a in whole.checksums}
    with open(path, "rb") as f, progress(total=os.path.getsize(path), unit="B", unit_scale=True,
                                         desc=f"verify {source.name}") as bar:
        n = _copy(f, _Sink(), bar, hashes)
    return _problems(whole, n, hashes)
