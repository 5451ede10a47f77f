"""Packaging a working folder for ``spec.runtimeEnv.workingDir``.

:func:`package_working_dir` zips a folder, leaving out what ``.gitignore`` files, the
manifest's ``spec.runtimeEnv.excludes`` and :data:`DEFAULT_EXCLUDES` name (``.gitignore``
syntax: `pathspec <https://pypi.org/project/pathspec/>`_ when installed, else a subset:
``*``/``?``/``**`` globs, a trailing ``/`` for folders, a leading ``/`` to anchor, ``!`` to
re-include). The archive has one top folder, as Ray's remote working folders do, and fixed
timestamps and order: the same files give the same bytes, so the same
:attr:`Package.digest` and the same object name (:func:`archive_uri`, content-addressed).

A package larger than :data:`MAX_PACKAGE_BYTES` (compressed) is refused: ship data through
storage, not the working folder.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from trainjob_operator.api.fields import split_entrypoint
from trainjob_operator.sdk.errors import PackagingError

__all__ = [
    "ARCHIVE_TOP",
    "DEFAULT_EXCLUDES",
    "MAX_PACKAGE_BYTES",
    "Package",
    "archive_uri",
    "check_entrypoints",
    "package_working_dir",
]

MAX_PACKAGE_BYTES = 100 * 1024 * 1024
"""The largest working-folder package (compressed): 100 MiB, well under Ray's own limit for a
package in its cluster store (the driver hands the unpacked folder to Ray)."""
ARCHIVE_TOP = "working_dir"
"""The one top folder of the archive (Ray's layout for remote working folders)."""
DEFAULT_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    "__pycache__/",
    "*.pyc",
    ".venv/",
    "venv/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".ipynb_checkpoints/",
    ".DS_Store",
)
"""Left out of every package (on top of ``.gitignore`` and ``excludes``)."""
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Package:
    """A packaged working folder: the zip's bytes, its sha256 and the files it holds."""

    data: bytes
    digest: str
    files: tuple[str, ...]
    source: Path

    @property
    def size(self) -> int:
        """Compressed size in bytes."""
        return len(self.data)


def _glob_regex(pattern: str) -> str:
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def _fallback_matcher(patterns: list[str]) -> Callable[[str, bool], bool]:
    """A ``.gitignore`` subset without pathspec: the last matching pattern decides."""
    rules: list[tuple[bool, bool, re.Pattern[str]]] = []
    for raw in patterns:
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!")
        dir_only = pattern.endswith("/")
        pattern = pattern.rstrip("/")
        anchored = pattern.startswith("/") or "/" in pattern
        body = _glob_regex(pattern.lstrip("/"))
        regex = re.compile(("^" if anchored else "^(?:.*/)?") + body + "$")
        rules.append((negate, dir_only, regex))

    def match(rel: str, is_dir: bool) -> bool:
        # Folders are matched (and pruned) before the files in them are visited.
        excluded = False
        for negate, dir_only, regex in rules:
            if (is_dir or not dir_only) and regex.match(rel):
                excluded = not negate
        return excluded

    return match


def _matcher(patterns: list[str]) -> Callable[[str, bool], bool]:
    try:  # the `cluster` extra; without it, a .gitignore subset
        import pathspec
    except ImportError:  # pragma: no cover - pathspec is installed where the tests run
        return _fallback_matcher(patterns)
    spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    return lambda rel, is_dir: spec.match_file(rel + "/" if is_dir else rel)


def _walk(root: Path, extra: list[str]) -> list[str]:
    """Files under ``root`` (relative, ``/``-separated, sorted) that no pattern excludes.

    ``.gitignore`` files apply to their own folder and below (their patterns are rewritten
    relative to ``root``)."""
    patterns = list(DEFAULT_EXCLUDES) + list(extra)
    files: list[str] = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        rel_dir = here.relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        ignore = here / ".gitignore"
        if ignore.is_file():
            for line in ignore.read_text(errors="replace").splitlines():
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                negate = "!" if line.startswith("!") else ""
                line = line.removeprefix("!")
                if prefix:
                    anchored = line.startswith("/") or "/" in line.rstrip("/")
                    line = prefix + (line.lstrip("/") if anchored else "**/" + line)
                patterns.append(negate + line)
        match = _matcher(patterns)
        dirs[:] = sorted(d for d in dirs if not match(prefix + d, True))
        for name in sorted(names):
            path = here / name
            if path.is_symlink() and not path.exists():
                continue
            if not match(prefix + name, False):
                files.append(prefix + name)
    return sorted(files)


def package_working_dir(
    directory: str | os.PathLike[str],
    excludes: Iterable[str] = (),
    *,
    max_bytes: int = MAX_PACKAGE_BYTES,
) -> Package:
    """Zip ``directory`` (see the module docstring); raises :class:`PackagingError` when it is
    not a folder, holds no file, or its package exceeds ``max_bytes``."""
    root = Path(directory).expanduser().resolve()
    if not root.is_dir():
        raise PackagingError(f"working dir {directory}: not a folder", reason="NotAFolder")
    files = _walk(root, list(excludes))
    if not files:
        raise PackagingError(
            f"working dir {directory}: no files to upload (all excluded?)", reason="Empty"
        )
    raw = 0
    for rel in files:
        raw += (root / rel).stat().st_size
        if raw > max_bytes * 4:  # far past any compression ratio: stop reading early
            break
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for rel in files:
            info = zipfile.ZipInfo(f"{ARCHIVE_TOP}/{rel}", date_time=_EPOCH)
            mode = (root / rel).stat().st_mode
            info.external_attr = (mode & 0o777 | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, (root / rel).read_bytes())
            if buf.tell() > max_bytes:
                break
    data = buf.getvalue()
    if len(data) > max_bytes:
        biggest = sorted(files, key=lambda r: (root / r).stat().st_size, reverse=True)[:3]
        raise PackagingError(
            f"working dir {directory}: the package is over the {max_bytes // (1024 * 1024)} MiB "
            f"limit (largest files: {', '.join(biggest)}); exclude data and checkpoints "
            "(.gitignore or spec.runtimeEnv.excludes) and read them from storage instead",
            reason="TooLarge",
        )
    return Package(data, hashlib.sha256(data).hexdigest(), tuple(files), root)


def check_entrypoints(package: Package, entrypoints: dict[str, str]) -> None:
    """Refuse a package that lacks the module of an entrypoint.

    ``entrypoints``: field -> ``package.module:function``. A module is found as
    ``a/b.py``, ``a/b/__init__.py`` or, for a namespace package, the folder ``a/b``.
    """
    files = set(package.files)
    folders = {str(Path(f).parent.as_posix()) for f in files}
    for field, entrypoint in entrypoints.items():
        module, _ = split_entrypoint(entrypoint)
        path = module.replace(".", "/")
        if f"{path}.py" in files or f"{path}/__init__.py" in files or path in folders:
            continue
        raise PackagingError(
            f"{field}: module {module!r} is not in the working dir {package.source} (looked for "
            f"{path}.py and {path}/__init__.py)",
            reason="EntrypointMissing",
        )


def archive_uri(storage_path: str, name: str, package: Package) -> str:
    """Where a package is uploaded: ``<storage.path>/<name>/_code/<sha256[:16]>.zip``."""
    return f"{storage_path.rstrip('/')}/{name}/_code/{package.digest[:16]}.zip"
