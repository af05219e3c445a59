"""Where a logdir's files live: a local directory, or any URL fsspec understands (s3://, gs://, ...).

The reader asks a :class:`Storage` three things: which runs and event files exist
(:meth:`Storage.discover`), how big a file is and whether it is still the same file
(:meth:`Storage.info`), and bytes ``[offset, offset + n)`` of it (:meth:`Storage.read_into`).
Why this seam: the local fast path (kept-open handles read straight into the reader's
reused mmap buffer) stays as it was, and a remote store is read in large ranged requests,
only past the bytes already consumed, after one listing per reload (object stores list a
prefix in pages; nothing is opened to discover runs).

Remote access goes through fsspec and the client library of the URL's protocol (s3fs for
``s3://``, gcsfs for ``gs://``), configured the ordinary way: environment variables
(``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ``GOOGLE_APPLICATION_CREDENTIALS``,
...) and those libraries' config files. Nothing here logs a credential: errors are reported
with the URL and the client's message only.
"""

from __future__ import annotations

import os
from typing import IO, Any, Hashable, NamedTuple, Protocol

from tb_parity_plugin.records.urls import is_url

#: Event files are recognised by this substring of their name, as TensorBoard does.
EVENT_MARK = "tfevents"


class FileInfo(NamedTuple):
    """Size now, and an identity that changes when the file is replaced rather than appended to."""

    size: int
    identity: Hashable


class StorageError(OSError):
    """The store could not be listed or read (missing bucket, refused credentials, network)."""


class Storage(Protocol):
    """What the reader needs of a logdir's home."""

    root: str  # the logdir as given (a path or a URL), for messages
    min_request: int  # bytes worth asking for at once: a ranged request's latency wants large reads

    def is_dir(self) -> bool: ...

    def discover(self) -> dict[str, list[str]]:
        """Run name (relative, "/"-separated, "." for the root) -> its event files, in name order."""
        ...

    def rel(self, path: str) -> str: ...

    def info(self, path: str) -> FileInfo: ...

    def read_into(self, path: str, offset: int, out: memoryview) -> int:
        """Read up to ``len(out)`` bytes at ``offset`` into ``out``; the count read."""
        ...

    def forget(self, path: str) -> None:
        """Release what is kept for ``path`` (a handle); the next read reopens it."""
        ...


def open_storage(logdir: str) -> Storage:
    """The storage of ``logdir``; raises FileNotFoundError/StorageError naming the cause."""
    if is_url(logdir):
        return RemoteStorage(logdir)
    if logdir.startswith("file://"):
        logdir = logdir[len("file://") :]
    return LocalStorage(logdir)


def _broken(path: str) -> bool:
    """A symlink whose target does not exist."""
    return os.path.islink(path) and not os.path.exists(path)


def _target(link: str) -> str:
    """Where a symlink points, or "?" when it vanished meanwhile (a run folder being moved)."""
    try:
        return os.readlink(link)
    except OSError:
        return "?"


#: How a listing names a symlink that leaves the logdir (``unfollowed``): callers that say what to do
#: about one recognise it by this.
LINK_OUT = "a link out of the logdir, not followed"


class LocalStorage:
    """A directory on this machine; symlinks leaving it are not followed."""

    min_request = 0  # the reader's own chunk size decides

    def __init__(self, logdir: str) -> None:
        if not os.path.isdir(logdir):
            raise FileNotFoundError(f"logdir {logdir!r} does not exist or is not a directory")
        self.root = logdir
        self._real = os.path.realpath(logdir)
        self._handles: dict[str, IO[bytes]] = {}
        #: Directories the last :meth:`discover` could not list, with why.
        self.errors: list[str] = []
        #: Symlinks the last :meth:`discover` did not follow (out of the logdir, or to nothing), each
        #: ``link -> target: why``: a new user's ``tf1 -> ../faithful/tf1`` vanished without a word.
        self.unfollowed: list[str] = []

    def is_dir(self) -> bool:
        return os.path.isdir(self._real)

    def _inside(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real == self._real or real.startswith(self._real + os.sep)

    def discover(self) -> dict[str, list[str]]:
        runs: dict[str, list[str]] = {}
        seen: set[str] = set()
        self.errors, self.unfollowed = [], []

        def unlistable(exc: OSError) -> None:
            self.errors.append(f"{self.rel(str(exc.filename))}: {exc.strerror or exc}")

        for dirpath, dirnames, filenames in os.walk(self._real, onerror=unlistable, followlinks=True):
            real = os.path.realpath(dirpath)
            if real in seen or not self._inside(dirpath):
                if not self._inside(dirpath):
                    self.unfollowed.append(f"{self.rel(dirpath)} -> {real}: {LINK_OUT}")
                dirnames[:] = []
                continue
            seen.add(real)
            dirnames.sort()
            paths = [os.path.join(dirpath, f) for f in filenames]
            # a link to nothing is listed among the files (a run folder moved away: a review's)
            self.unfollowed += [f"{self.rel(p)} -> {_target(p)}: a link to nothing" for p in paths if _broken(p)]
            marked = [p for p in paths if EVENT_MARK in os.path.basename(p) and not _broken(p)]
            self.unfollowed += [
                f"{self.rel(f)} -> {os.path.realpath(f)}: {LINK_OUT}" for f in marked if not self._inside(f)
            ]
            files = sorted(f for f in marked if self._inside(f) and os.path.isfile(f))
            if files:
                runs[self.rel(dirpath)] = files
        return runs

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self._real).replace(os.sep, "/")

    def _handle(self, path: str) -> IO[bytes]:
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = open(path, "rb")
        return handle

    def info(self, path: str) -> FileInfo:
        """By path, not by the kept handle: a file renamed over this one is another file."""
        st = os.stat(path)
        handle = self._handles.get(path)
        if handle is not None and os.fstat(handle.fileno()).st_ino != st.st_ino:
            self.forget(path)  # the handle holds the file that was replaced
        # mtime changes with every write: the reader then checks the bytes it read are still there
        return FileInfo(st.st_size, (st.st_dev, st.st_ino, st.st_mtime_ns))

    def read_into(self, path: str, offset: int, out: memoryview) -> int:
        handle = self._handle(path)
        handle.seek(offset)
        return handle.readinto(out) or 0  # type: ignore[attr-defined]

    def forget(self, path: str) -> None:
        handle = self._handles.pop(path, None)
        if handle is not None:
            handle.close()


class RemoteStorage:
    """An fsspec URL: one recursive listing per :meth:`discover`, ranged reads of new bytes only."""

    min_request = 16 << 20  # one ranged request per 16 MiB: its round trip, not the copy, is the cost

    def __init__(self, url: str) -> None:
        try:
            import fsspec  # a dependency of remote logdirs only; local reading never imports it
        except ImportError as exc:  # pragma: no cover - fsspec is in the locked environment
            raise StorageError(f"reading {url!r} needs fsspec: pip install 'tb-parity[remote]'") from exc
        try:
            self._fs, self._path = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:  # unknown protocol, or its client library missing
            raise StorageError(f"cannot open {url!r}: {exc}") from exc
        self.root = url
        self._path = self._path.rstrip("/")
        #: Bytes received by ranged reads (the benchmark sets it against the bytes stored).
        self.bytes_fetched = 0
        self._listed: dict[str, FileInfo] = {}
        if not self.is_dir():
            raise FileNotFoundError(f"logdir {url!r} does not exist or holds no files")

    def is_dir(self) -> bool:
        try:
            self._fs.invalidate_cache(self._path)
            return bool(self._fs.isdir(self._path))
        except Exception as exc:  # clients raise their own types (ClientError, HttpError, ...)
            raise StorageError(f"cannot list {self.root!r}: {_message(exc)}") from exc

    def discover(self) -> dict[str, list[str]]:
        try:
            self._fs.invalidate_cache(self._path)
            found: dict[str, Any] = self._fs.find(self._path, detail=True)
        except FileNotFoundError:
            found = {}
        except Exception as exc:
            raise StorageError(f"cannot list {self.root!r}: {_message(exc)}") from exc
        runs: dict[str, list[str]] = {}
        self._listed = {}
        for path, detail in found.items():
            directory, _, name = path.rpartition("/")
            if EVENT_MARK not in name or detail.get("type", "file") != "file":
                continue
            self._listed[path] = FileInfo(int(detail.get("size") or 0), _identity(detail))
            runs.setdefault(self.rel(directory), []).append(path)
        return {run: sorted(paths) for run, paths in sorted(runs.items())}

    def rel(self, path: str) -> str:
        if path == self._path:
            return "."
        return path[len(self._path) + 1 :] if path.startswith(self._path + "/") else path

    def info(self, path: str) -> FileInfo:
        known = self._listed.get(path)
        if known is not None:  # from this reload's listing: no request per object
            return known
        try:
            detail = self._fs.info(path)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot stat {self.rel(path)!r}: {_message(exc)}") from exc
        return FileInfo(int(detail.get("size") or 0), _identity(detail))

    def read_into(self, path: str, offset: int, out: memoryview) -> int:
        try:
            data = self._fs.cat_file(path, start=offset, end=offset + len(out))
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise StorageError(f"cannot read {self.rel(path)!r} at byte {offset}: {_message(exc)}") from exc
        out[: len(data)] = data
        self.bytes_fetched += len(data)
        return len(data)

    def forget(self, path: str) -> None:
        self._listed.pop(path, None)


def _identity(detail: dict[str, Any]) -> Hashable:
    """What changes when an object is rewritten: its ETag (S3), generation (GCS) or mtime."""
    for key in ("ETag", "etag", "generation", "md5Hash", "LastModified", "mtime", "updated"):
        if detail.get(key) is not None:
            return (key, str(detail[key]))
    return None


def _message(exc: BaseException) -> str:
    """The client's message, without the arguments a request was made with (they may hold keys)."""
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:300]
