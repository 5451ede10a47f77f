"""Storage in a local or mounted folder (a PersistentVolume, Filestore, gcsfuse...)."""

from __future__ import annotations

import functools
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from trainer_runtime._layout import STORE_TEMP_SUFFIX
from trainer_runtime.storage.base import Storage, StoredFile, TransferStats, UploadCheck


def _walk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


STORE_TMP_SUFFIX = STORE_TEMP_SUFFIX
"""Suffix of a file being stored (see :func:`_store_file`), renamed once it is whole."""


def _stored(path: Path) -> StoredFile:
    st = path.stat()
    return StoredFile(st.st_size, str(st.st_mtime_ns))


def _fsync_path(path: Path) -> None:
    """Flush a file's or folder's data and metadata to the device (``fsync(2)``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folders(dest: Path, rels: Sequence[str]) -> None:
    """fsync ``dest``, every folder under it that holds one of ``rels``, and ``dest``'s parent.

    A file's own fsync does not make its name durable: the folder entries that lead to it must be
    flushed too (``fsync(2)``), or a power loss can leave a committed marker whose files are gone.
    """
    folders = {dest}
    for rel in rels:
        parent = (dest / rel).parent
        while parent != dest and dest in parent.parents:
            folders.add(parent)
            parent = parent.parent
    for folder in sorted(folders, key=lambda f: len(f.parts), reverse=True):
        _fsync_path(folder)
    _fsync_path(dest.parent)


@functools.cache
def _new_file_mode() -> int:
    """The mode ``shutil.copyfile`` gives a new file: ``0o666`` less the process's umask
    (read once from ``/proc``: setting the umask to read it would race with other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def _drop_own_link(src: Path, target: Path) -> None:
    """Remove ``target`` when it is ``src`` itself: a link an earlier, failed attempt at this
    upload left (a copy onto it would copy the file onto itself, and it would count as the
    source's second name)."""
    try:
        if os.path.samestat(os.lstat(src), os.lstat(target)):
            target.unlink()
    except OSError:
        pass


def _link_sole_file(src: Path, target: Path) -> bool:
    """Give ``target`` the data of ``src`` by hard-linking it instead of copying it; False
    (nothing done) where that is not safe or not possible, and the caller copies.

    Only for a source its caller deletes right after the upload: then the stored file is the
    data's only name. So only a regular file that is not a symlink and has no other name
    (``st_nlink == 1``): a symlink's target or a file hard-linked from elsewhere lives on
    after the source folder is deleted, and writing to it later would change the stored
    checkpoint. The link gets the mode a copy would have. Another file system (``EXDEV``), or
    one without hard links, answers False.
    """
    try:
        st = os.lstat(src)
    except OSError:
        return False  # the copy raises the error that names the file
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        return False
    try:
        try:
            os.link(src, target, follow_symlinks=False)
        except FileExistsError:  # left by an earlier, failed attempt at this upload
            target.unlink()
            os.link(src, target, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return False
    if stat.S_IMODE(st.st_mode) != _new_file_mode():
        try:
            os.chmod(target, _new_file_mode())
        except OSError:  # e.g. a file this process does not own: copy it, a copy gets the mode
            target.unlink(missing_ok=True)
            return False
    return True


def _store_file(src: Path, target: Path, *, link: bool, durable: bool) -> None:
    """Store ``src`` as ``target`` atomically: written (or hard-linked) under a temporary name
    in ``target``'s folder, flushed, then renamed over ``target``. Several ranks storing the
    same name into one checkpoint (Ray Train's tests have every rank write a shared
    ``checkpoint.pkl``) then each replace a whole file: nobody sees a half-written one."""
    fd, tmp_name = tempfile.mkstemp(
        dir=target.parent, prefix=f".{target.name}.", suffix=STORE_TMP_SUFFIX
    )
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        tmp.unlink()  # the name is reserved; a link or a copy creates the file
        if not (link and _link_sole_file(src, tmp)):
            shutil.copyfile(src, tmp)
        if durable:
            _fsync_path(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class LocalStorage(Storage):
    """Files under an absolute local path."""

    def upload_dir(
        self,
        local_dir: Path,
        dest_uri: str,
        *,
        files: Sequence[str] | None = None,
        check: UploadCheck | None = None,
        consume_source: bool = False,
    ) -> TransferStats:
        """Copy the folder's files (``copyfile`` uses the kernel's zero-copy path) durably.

        Every stored file, and the folders that name it, are fsynced before this returns, so a
        commit marker written afterwards never outlives its files on a power loss (the commit
        invariant). A checkpoint written in place (the folder is already ``dest_uri``) is
        fsynced the same way. ``consume_source``: the caller deletes ``local_dir`` once this
        returns, so a file on the same file system with no other name is hard-linked instead
        of copied (its data is written to the device once, by the fsync, and never copied).
        """
        return self._copy_dir(
            local_dir, dest_uri, files=files, check=check, durable=True, link=consume_source
        )

    def _copy_dir(
        self,
        local_dir: Path,
        dest_uri: str,
        *,
        files: Sequence[str] | None,
        check: UploadCheck | None,
        durable: bool,
        link: bool = False,
    ) -> TransferStats:
        start = time.perf_counter()
        src = Path(local_dir).resolve()
        dest = Path(dest_uri)
        rels = [str(f.relative_to(src)) for f in _walk_files(src)] if files is None else list(files)
        stats = TransferStats()
        in_place = dest.exists() and dest.resolve() == src
        for rel in rels:
            if check is not None:
                check()
            target = dest / rel
            if not in_place:  # else the checkpoint was written in place: nothing to copy
                target.parent.mkdir(parents=True, exist_ok=True)
                _drop_own_link(src / rel, target)
                _store_file(src / rel, target, link=link, durable=durable)
            elif durable:
                _fsync_path(target)
            stored = _stored(target)
            stats.stored[rel] = stored
            stats.files += 1
            stats.bytes += stored.size
        dest.mkdir(parents=True, exist_ok=True)
        if durable:
            _fsync_folders(dest, rels)
        stats.seconds = time.perf_counter() - start
        return stats

    def download_dir(self, src_uri: str, local_dir: Path) -> TransferStats:
        """Copy ``src_uri``'s files into ``local_dir``."""
        src = Path(src_uri)
        if not src.is_dir():
            raise FileNotFoundError(f"checkpoint folder {src_uri} does not exist")
        # A restored copy is scratch space: no fsync.
        return self._copy_dir(src, str(local_dir), files=None, check=None, durable=False)

    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write durably via a temporary file and ``os.replace``: readers never see half a file."""
        path = Path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_path(path.parent)  # the rename itself is durable only once its folder is flushed

    def read_bytes(self, uri: str) -> bytes:
        """Read the file."""
        return Path(uri).read_bytes()

    def exists(self, uri: str) -> bool:
        """Whether the file exists."""
        return Path(uri).exists()

    def list_dirs(self, uri: str) -> list[str]:
        """Sorted names of sub-folders."""
        path = Path(uri)
        if not path.is_dir():
            return []
        return sorted(p.name for p in path.iterdir() if p.is_dir())

    def list_files(self, uri: str) -> list[str]:
        """Sorted relative paths of every file below ``uri``."""
        root = Path(uri)
        if not root.is_dir():
            return []
        return [str(p.relative_to(root)) for p in _walk_files(root)]

    def list_stored(self, uri: str, *, fingerprints: bool = True) -> dict[str, StoredFile]:
        """Every file below ``uri`` with its size and modification time."""
        root = Path(uri)
        if not root.is_dir():
            return {}
        out: dict[str, StoredFile] = {}
        for path in _walk_files(root):
            try:
                out[str(path.relative_to(root))] = _stored(path)
            except FileNotFoundError:  # deleted while listing
                continue
        return out

    def delete_dir(self, uri: str) -> None:
        """Remove the folder tree."""
        shutil.rmtree(uri, ignore_errors=True)

    def local_path(self, uri: str) -> Path:
        """The path itself."""
        return Path(uri)
