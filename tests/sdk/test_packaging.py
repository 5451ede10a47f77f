"""Packaging a working folder: excludes (.gitignore, spec.runtimeEnv.excludes, defaults), the
one-top-folder layout the driver unpacks, content addressing, the size limit, the
entrypoint check; and the kubeconfig errors of TrainJobClient."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from trainjob_operator.launcher.runtime_env import unpack_archive
from trainjob_operator.sdk import ConfigError, PackagingError, TrainJobClient, package_working_dir
from trainjob_operator.sdk.packaging import (
    _fallback_matcher,
    archive_uri,
    check_entrypoints,
)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_gitignore_excludes_and_defaults_are_left_out(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "proj",
        {
            ".gitignore": "data/\n*.ckpt\n!keep.ckpt\n/top.txt\n",
            "pkg/__init__.py": "",
            "pkg/train.py": "def train(config): pass\n",
            "pkg/__pycache__/train.cpython-311.pyc": "x",
            "pkg/.gitignore": "local.txt\n",
            "pkg/local.txt": "x",
            "pkg/sub/local.txt": "x",
            "data/big.bin": "x",
            "model.ckpt": "x",
            "keep.ckpt": "x",
            "top.txt": "x",
            "sub/top.txt": "x",
            "notes/scratch.md": "x",
            ".git/HEAD": "x",
        },
    )
    package = package_working_dir(root, excludes=["notes/"])
    assert package.files == (
        ".gitignore",
        "keep.ckpt",
        "pkg/.gitignore",
        "pkg/__init__.py",
        "pkg/train.py",
        "sub/top.txt",
    )


@pytest.mark.parametrize(
    ("patterns", "rel", "is_dir", "excluded"),
    [
        (["*.ckpt"], "a/b/m.ckpt", False, True),
        (["data/"], "x/data", True, True),
        (["data/"], "x/data", False, False),
        (["/top.txt"], "sub/top.txt", False, False),
        (["/top.txt"], "top.txt", False, True),
        (["a/**/z.py"], "a/b/c/z.py", False, True),
        (["*.ckpt", "!keep.ckpt"], "keep.ckpt", False, False),
    ],
)
def test_the_fallback_matcher_without_pathspec(
    patterns: list[str], rel: str, is_dir: bool, excluded: bool
) -> None:
    assert _fallback_matcher(patterns)(rel, is_dir) is excluded


def test_the_archive_is_reproducible_and_unpacks_to_the_folder(tmp_path: Path) -> None:
    root = _tree(tmp_path / "proj", {"pkg/__init__.py": "", "run.py": "print(1)\n"})
    first = package_working_dir(root)
    second = package_working_dir(root)
    assert first.data == second.data and first.digest == second.digest
    names = zipfile.ZipFile(io.BytesIO(first.data)).namelist()
    assert names == ["working_dir/pkg/__init__.py", "working_dir/run.py"]
    unpacked = unpack_archive(first.data, tmp_path / "out", "workingDir")
    assert (unpacked / "run.py").read_text() == "print(1)\n"
    assert archive_uri("gs://b/runs/", "job", first) == (
        f"gs://b/runs/job/_code/{first.digest[:16]}.zip"
    )


def test_a_package_over_the_limit_is_refused_naming_the_largest_files(tmp_path: Path) -> None:
    import os

    root = _tree(tmp_path / "proj", {"pkg/__init__.py": ""})
    (root / "weights.bin").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(PackagingError, match=r"over the 0 MiB limit \(largest files: weights.bin"):
        package_working_dir(root, max_bytes=16 * 1024)


def test_not_a_folder_and_empty_folders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PackagingError, match="not a folder"):
        package_working_dir(tmp_path / "missing")
    _tree(tmp_path / "empty", {".git/HEAD": "x"})
    with pytest.raises(PackagingError, match="no files to upload"):
        package_working_dir(tmp_path / "empty")


def test_entrypoint_modules_must_be_in_the_package(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "proj",
        {"pkg/__init__.py": "", "pkg/train.py": "", "ns/mod/x.py": "", "single.py": ""},
    )
    package = package_working_dir(root)
    check_entrypoints(
        package,
        {"a": "pkg.train:f", "b": "pkg:f", "c": "single:f", "d": "ns.mod:f"},
    )
    with pytest.raises(PackagingError, match=r"spec.entrypoint: module 'other.train' is not in"):
        check_entrypoints(package, {"spec.entrypoint": "other.train:f"})


def test_kubeconfig_problems_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no kubeconfig at"):
        TrainJobClient(kubeconfig=tmp_path / "none")
    config = tmp_path / "config"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n"
        "contexts:\n- name: a\n  context: {cluster: c, user: u, namespace: team-a}\n"
        "clusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"
        "users:\n- name: u\n  user: {token: t}\n"
    )
    with pytest.raises(ConfigError, match=r"no context 'b' in the kubeconfig .* \(contexts: a\)"):
        TrainJobClient(kubeconfig=config, context="b")
    assert TrainJobClient(kubeconfig=config).namespace == "team-a"
    assert TrainJobClient(kubeconfig=config, namespace="x").namespace == "x"
