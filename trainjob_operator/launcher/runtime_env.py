"""``spec.runtimeEnv`` in the driver: the Ray ``runtime_env`` of the driver's Ray job.

The driver connects to the job's Ray cluster with ``ray.init(runtime_env=...)``, so every
actor and task of its Ray job inherits it: the train workers and the validation tasks see the
same working folder, modules, environment variables and packages.

Remote archives (``gs://``/``s3://`` ``.zip``) are read here, by the driver, through
:mod:`trainer_runtime.storage` (the pods' storage credentials, the same as for
``spec.storage.path``), unpacked into a local folder, and handed to Ray as local folders: Ray
packages them into its own cluster store, from which every node unpacks them. No node needs
Ray's own remote-URI support (``smart_open``) nor credentials for the archive, and the driver
can import ``spec.entrypoint`` from the same files before the run starts.

An archive is laid out as Ray's remote archives are: one top folder holds the files (what
:mod:`trainjob_operator.sdk.packaging` writes); an archive with several entries at its top
is used as it is.
"""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer_runtime.storage import StorageError, get_storage
from trainer_runtime.storage.base import is_permanent_error
from trainjob_operator.api.spec import RuntimeEnvConfig

__all__ = [
    "RuntimeEnvError",
    "add_import_paths",
    "is_remote",
    "prepare_runtime_env",
    "ray_runtime_env",
    "unpack_archive",
]


class RuntimeEnvError(Exception):
    """An archive of ``spec.runtimeEnv`` cannot be read or unpacked.

    ``permanent``: the same input fails again (missing object, not a zip): the driver exits
    with the invalid-input status; otherwise (a storage outage) a restart may succeed.
    """

    def __init__(self, field: str, message: str, *, permanent: bool) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.permanent = permanent


def is_remote(location: str) -> bool:
    """Whether ``location`` is a ``gs://``/``s3://`` archive (else a folder in the image)."""
    return location.startswith(("gs://", "s3://"))


def ray_runtime_env(
    config: RuntimeEnvConfig | None, local: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """Ray's ``runtime_env`` for ``config`` (None when it changes nothing).

    ``local``: remote archive URI -> the local folder it was unpacked into
    (:func:`prepare_runtime_env`); other locations are passed as they are.
    """
    if config is None or config.is_empty():
        return None
    local = local or {}
    env: dict[str, Any] = {}
    if config.working_dir:
        env["working_dir"] = local.get(config.working_dir, config.working_dir)
    if config.py_modules:
        env["py_modules"] = [local.get(m, m) for m in config.py_modules]
    if config.excludes and ("working_dir" in env or "py_modules" in env):
        env["excludes"] = list(config.excludes)
    if config.env_vars:
        env["env_vars"] = dict(config.env_vars)
    if config.pip:
        env["pip"] = list(config.pip)
    if config.uv_packages:
        env["uv"] = list(config.uv_packages)
    return env


def unpack_archive(data: bytes, dest: Path, field: str) -> Path:
    """Unpack a zip archive into ``dest``; the folder that holds its files.

    That is the archive's single top folder when it has one and nothing else (Ray's layout),
    else ``dest`` itself. Entries that would land outside ``dest`` are refused.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise RuntimeEnvError(field, f"not a zip archive ({exc})", permanent=True) from exc
    root = dest.resolve()
    with archive:
        for name in archive.namelist():
            target = (root / name).resolve()
            if target != root and root not in target.parents:
                raise RuntimeEnvError(
                    field, f"archive entry {name!r} points outside its folder", permanent=True
                )
        archive.extractall(root)
    tops = [p for p in root.iterdir() if p.name != "__MACOSX"]
    if len(tops) == 1 and tops[0].is_dir():
        return tops[0]
    return root


def prepare_runtime_env(
    config: RuntimeEnvConfig | None, cache_dir: Path
) -> tuple[dict[str, Any] | None, list[str]]:
    """Download and unpack the remote archives of ``config`` under ``cache_dir``.

    Returns Ray's ``runtime_env`` (:func:`ray_runtime_env`, the archives as local folders)
    and the folders the driver itself must put first on ``sys.path`` to import the
    entrypoints: the working folder, and the parent folder of each module.

    Raises:
        RuntimeEnvError: an archive is missing, unreadable or not a zip.
    """
    if config is None or config.is_empty():
        return None, []
    local: dict[str, str] = {}
    fields = [("spec.runtimeEnv.workingDir", config.working_dir)] if config.working_dir else []
    fields += [(f"spec.runtimeEnv.pyModules[{i}]", m) for i, m in enumerate(config.py_modules)]
    for field, location in fields:
        if is_remote(location):
            local[location] = str(_fetch(location, cache_dir, field))
        elif not Path(location).is_dir():
            raise RuntimeEnvError(
                field,
                f"{location!r} is not a folder in the image",
                permanent=True,
            )
    import_paths: list[str] = []
    if config.working_dir:
        import_paths.append(local.get(config.working_dir, config.working_dir))
    for module in config.py_modules:
        import_paths.append(str(Path(local.get(module, module)).parent))
    return ray_runtime_env(config, local), import_paths


def _fetch(uri: str, cache_dir: Path, field: str) -> Path:
    try:
        data = get_storage(uri).read_bytes(uri)
    except FileNotFoundError as exc:
        raise RuntimeEnvError(
            field,
            f"{uri} does not exist",
            permanent=True,
        ) from exc
    except (StorageError, OSError) as exc:
        permanent = exc.permanent if isinstance(exc, StorageError) else is_permanent_error(exc)
        raise RuntimeEnvError(field, f"cannot read {uri}: {exc}", permanent=permanent) from exc
    dest = cache_dir / hashlib.sha256(uri.encode()).hexdigest()[:16]
    dest.mkdir(parents=True, exist_ok=True)
    return unpack_archive(data, dest, field)


def add_import_paths(paths: list[str]) -> None:
    """Put ``paths`` first on this process's ``sys.path`` (in their order)."""
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
