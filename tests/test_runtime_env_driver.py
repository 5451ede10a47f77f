"""spec.runtimeEnv in the driver: Ray's runtime_env rendered from it, its archives read from
storage and unpacked, the entrypoint imported from them, and ray.init given the result."""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from trainjob_operator.api import parse_trainjob
from trainjob_operator.api.spec import RuntimeEnvConfig
from trainjob_operator.launcher import driver
from trainjob_operator.launcher.runtime_env import (
    RuntimeEnvError,
    prepare_runtime_env,
    ray_runtime_env,
    unpack_archive,
)


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return buf.getvalue()


def test_ray_runtime_env_maps_every_field() -> None:
    config = RuntimeEnvConfig.model_validate(
        {
            "workingDir": "gs://b-1/code/w.zip",
            "pyModules": ["/opt/lib/mylib", "s3://b-2/m.zip"],
            "envVars": {"A": "1"},
            "excludes": ["*.ckpt"],
            "uvPackages": ["einops"],
        }
    )
    env = ray_runtime_env(config, {"gs://b-1/code/w.zip": "/tmp/x/w", "s3://b-2/m.zip": "/tmp/m"})
    assert env == {
        "working_dir": "/tmp/x/w",
        "py_modules": ["/opt/lib/mylib", "/tmp/m"],
        "excludes": ["*.ckpt"],
        "env_vars": {"A": "1"},
        "uv": ["einops"],
    }
    assert ray_runtime_env(RuntimeEnvConfig(pip=["a==1"])) == {"pip": ["a==1"]}
    assert ray_runtime_env(RuntimeEnvConfig()) is None
    assert ray_runtime_env(None) is None


def test_an_archive_with_one_top_folder_is_that_folder(tmp_path: Path) -> None:
    root = unpack_archive(_zip({"code/pkg/__init__.py": "", "code/a.txt": "x"}), tmp_path, "f")
    assert root == tmp_path / "code"
    flat = unpack_archive(_zip({"pkg/__init__.py": "", "a.txt": "x"}), tmp_path / "flat", "f")
    assert flat == tmp_path / "flat"


def test_a_bad_archive_is_a_permanent_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeEnvError, match="workingDir: not a zip") as info:
        unpack_archive(b"not a zip", tmp_path, "workingDir")
    assert info.value.permanent


def test_folders_in_the_image_are_passed_as_they_are(tmp_path: Path) -> None:
    (tmp_path / "wd").mkdir()
    (tmp_path / "libs" / "mylib").mkdir(parents=True)
    config = RuntimeEnvConfig(
        working_dir=str(tmp_path / "wd"), py_modules=[str(tmp_path / "libs" / "mylib")]
    )
    env, paths = prepare_runtime_env(config, tmp_path / "cache")
    assert env == {
        "working_dir": str(tmp_path / "wd"),
        "py_modules": [str(tmp_path / "libs/mylib")],
    }
    assert paths == [str(tmp_path / "wd"), str(tmp_path / "libs")]
    with pytest.raises(RuntimeEnvError, match=r"workingDir: .* is not a folder in the image"):
        prepare_runtime_env(RuntimeEnvConfig(working_dir=str(tmp_path / "nope")), tmp_path)


def test_the_driver_unpacks_imports_and_passes_the_runtime_env_to_ray_init(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainjob_operator.launcher import runtime_env as module

    archive = _zip({"wd/rtenv_probe_pkg/__init__.py": "def train(config):\n    return 7\n"})

    class FakeStorage:
        def read_bytes(self, uri: str) -> bytes:
            if uri != "gs://my-bucket/code/w.zip":
                raise FileNotFoundError(uri)
            return archive

    monkeypatch.setattr(module, "get_storage", lambda uri: FakeStorage())
    job = parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "rt"},
            "spec": {
                "entrypoint": "rtenv_probe_pkg:train",
                "scaling": {"numWorkers": 1},
                "runtimeEnv": {"workingDir": "gs://my-bucket/code/w.zip", "envVars": {"A": "1"}},
            },
        }
    )
    monkeypatch.setenv("TRAINJOB_MANIFEST", job.model_dump_json(by_alias=True, exclude_none=True))
    monkeypatch.setenv(driver.RUNTIME_ENV_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("TRAINJOB_NAME", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_init(**kwargs: Any) -> None:
        seen.update(kwargs)
        raise Stop

    import ray

    monkeypatch.setattr(ray, "init", fake_init)
    with pytest.raises(Stop):
        driver.main()
    unpacked = next((tmp_path / "cache").iterdir()) / "wd"
    assert seen["runtime_env"] == {"working_dir": str(unpacked), "env_vars": {"A": "1"}}
    assert sys.path[0] == str(unpacked)
    assert sys.modules["rtenv_probe_pkg"].train({}) == 7


def test_a_missing_archive_fails_the_driver_as_invalid_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainjob_operator.launcher import runtime_env as module

    class Missing:
        def read_bytes(self, uri: str) -> bytes:
            raise FileNotFoundError(uri)

    monkeypatch.setattr(module, "get_storage", lambda uri: Missing())
    job = parse_trainjob(
        {
            "apiVersion": "trainjob.dev/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": "rt"},
            "spec": {"entrypoint": "m:f", "runtimeEnv": {"workingDir": "gs://my-bucket/w.zip"}},
        }
    )
    monkeypatch.setenv("TRAINJOB_MANIFEST", job.model_dump_json(by_alias=True, exclude_none=True))
    monkeypatch.setenv(driver.RUNTIME_ENV_DIR_ENV, str(tmp_path))
    monkeypatch.delenv("TRAINJOB_NAME", raising=False)
    assert driver.main() == 2
    assert "spec.runtimeEnv.workingDir: gs://my-bucket/w.zip does not exist" in (
        capsys.readouterr().err
    )
