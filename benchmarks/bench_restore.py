"""Restore: a new driver resuming a run whose latest checkpoint is 1 GiB, ours vs Ray Train.

For each storage (a local folder; ``gs://`` on fake-gcs-server) and layout (1 rank holding one
1 GiB file; 2 ranks each holding a 512 MiB shard of it), each framework first writes a run of
its own whose one checkpoint is that payload (a ``fit()`` whose ranks each report their file).
Then, repeatedly and alternating between the frameworks, a **new driver process** (``python
benchmarks/bench_restore.py --driver ...``, attached to the Ray cluster this script started
once with ``ray.init(num_cpus=4)``) calls ``fit()`` with the same run name and storage path:
the run resumes from that checkpoint. Its train function (``restore_loop``, the same for both) calls
``get_checkpoint()``, opens it with ``as_directory()`` (the form Ray Train's guides use) and
reads its rank's file(s) to the end; the next line is the first step.

Figures per restore (wall clock; the driver, its workers and this script share the machine):

* ``to_first_step_s``: from the driver process's start (``Popen``) to the last rank's first
  step: the headline;
* ``driver_setup_s``: driver start -> ``fit()`` called (Python, imports, ``ray.init``);
* ``fit_to_entered_s``: ``fit()`` -> the last rank entered the train function;
* ``restore_s``: the slowest rank's ``get_checkpoint()`` + ``as_directory()`` + reading;
* ``restore_mib_s``: the checkpoint's MiB over ``restore_s``.

The **raw bound**, measured in the same run after each round of restores, in a Ray task (a
Ray worker process like the train functions', at the same priority: Ray runs its workers at
nice 15) and, for reference, in this process (nice 0): the storage library alone
fetching and reading the same bytes, with no framework: for GCS, google-cloud-storage's
``Blob.download_to_filename`` of every object (one thread per object) and
``transfer_manager.download_chunks_concurrently`` (8 threads per object), each followed by
reading the files, the faster of the two (and, for reference, the first of them in a new
process, timed from its start: Python, the library's import and a client included); for local
storage, reading the files where they are (``open`` + ``read``: neither framework copies a
local checkpoint, both hand the folder itself) and, for reference, ``shutil.copyfile`` of
them. Result ``restore``.

Usage::

    python benchmarks/bench_restore.py [--quick] [--repeats N] [--size-mib 1024]
        [--storage local,gcs] [--layouts 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common
from benchmarks.restore_section import held_bound

NAME = "restore"
FRAMEWORKS = ("ours", "ray_train")
MiB = common.MiB
READ_CHUNK = 16 * MiB
BLOCK = 64 * MiB


# -- the train functions ----------------------------------------------------------------------
def _api(framework: str) -> Any:
    if framework == "ours":
        import trainer_runtime as api

        return api
    import ray.train as api_ray

    return api_ray


def shard_name(rank: int) -> str:
    """The file rank ``rank`` writes and reads."""
    return f"shard_{rank:02d}.bin"


def write_shard(path: Path, size: int) -> None:
    """``size`` bytes of random data (one random 64 MiB block repeated)."""
    block = os.urandom(min(BLOCK, size))
    with open(path, "wb") as fh:
        left = size
        while left > 0:
            n = min(left, len(block))
            fh.write(block[:n])
            left -= n


def read_file(path: str | os.PathLike[str], buf: bytearray | None = None) -> int:
    """Read a file to its end in 16 MiB pieces; returns its size."""
    view = memoryview(buf if buf is not None else bytearray(READ_CHUNK))
    total = 0
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(view):
            total += n
    return total


def write_loop(config: dict[str, Any]) -> None:
    """Every rank reports a checkpoint holding its shard (the run to resume)."""
    api = _api(config["framework"])
    ctx = api.get_context()
    rank, size = ctx.get_world_rank(), ctx.get_world_size()
    folder = Path(tempfile.mkdtemp(prefix="bench-restore-write-"))
    try:
        write_shard(folder / shard_name(rank), config["size_bytes"] // size)
        api.report({"step": 0}, checkpoint=api.Checkpoint.from_directory(str(folder)))
    finally:
        common.rmtree(folder)


def restore_loop(config: dict[str, Any]) -> None:
    """Resume: get_checkpoint(), as_directory(), read this rank's file, then the first step."""
    entered = time.time()
    api = _api(config["framework"])
    rank = api.get_context().get_world_rank()
    before_get = time.time()
    checkpoint = api.get_checkpoint()
    if checkpoint is None:
        raise RuntimeError("bench_restore: the resumed run has no checkpoint")
    nbytes = 0
    with checkpoint.as_directory() as folder:
        got_folder = time.time()
        nbytes += read_file(Path(folder, shard_name(rank)))
    first_step = time.time()
    out = {
        "rank": rank,
        "entered": entered,
        "before_get": before_get,
        "got_folder": got_folder,
        "first_step": first_step,
        "bytes_read": nbytes,
    }
    Path(config["out_dir"], f"rank_{rank}.json").write_text(json.dumps(out))


# -- the driver process -----------------------------------------------------------------------
def _trainer(spec: dict[str, Any], loop: Callable[[dict[str, Any]], None]) -> Any:
    framework, storage = spec["framework"], spec["storage_path"]
    config = {**spec["config"], "framework": framework}
    if framework == "ours":
        from trainer_runtime import RunConfig, ScalingConfig
        from trainer_runtime.torch import TorchTrainer

        return TorchTrainer(
            loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=spec["workers"]),
            run_config=RunConfig(name=spec["name"], storage_path=storage),
        )
    import ray.train
    import ray.train.torch

    kwargs: dict[str, Any] = {"storage_path": storage}
    if storage.startswith("gs://"):
        import pyarrow.fs as pafs

        fs = pafs.GcsFileSystem(
            anonymous=True, endpoint_override=f"127.0.0.1:{spec['gcs_port']}", scheme="http"
        )
        kwargs = {"storage_path": storage[len("gs://") :], "storage_filesystem": fs}
    return ray.train.torch.TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ray.train.ScalingConfig(num_workers=spec["workers"]),
        run_config=ray.train.RunConfig(name=spec["name"], **kwargs),
    )


def driver_main(spec: dict[str, Any]) -> None:
    """The driver process: attach to the cluster, ``fit()``, write its times to ``out_dir``."""
    main_at = time.time()
    import ray

    common.setup_paths()
    ray.init(address=spec["address"], log_to_driver=False, configure_logging=False)
    attached = time.time()
    trainer = _trainer(spec, write_loop if spec["mode"] == "write" else restore_loop)
    fit_at = time.time()
    trainer.fit()
    done = time.time()
    times = {"main": main_at, "attached": attached, "fit": fit_at, "done": done}
    Path(spec["config"]["out_dir"], "driver.json").write_text(json.dumps(times))
    ray.shutdown()


def run_driver(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one driver process; returns its times and its ranks' (``start``: its Popen)."""
    out_dir = Path(spec["config"]["out_dir"])
    start = time.time()
    proc = subprocess.run(
        [sys.executable, __file__, "--driver", json.dumps(spec)],
        cwd=common.REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"driver {spec['mode']} {spec['framework']} failed:\n{proc.stdout[-3000:]}\n"
            f"{proc.stderr[-6000:]}"
        )
    driver = json.loads((out_dir / "driver.json").read_text())
    ranks = [json.loads(p.read_text()) for p in sorted(out_dir.glob("rank_*.json"))]
    return {"start": start, "driver": driver, "ranks": ranks}


# -- the raw bound ----------------------------------------------------------------------------
def _read_all(paths: list[Path]) -> int:
    with ThreadPoolExecutor(max_workers=max(1, len(paths))) as pool:
        return sum(pool.map(read_file, paths))


def bound_local(folder: Path, scratch: Path) -> dict[str, float]:
    """Seconds to read the files where they are, and to ``shutil.copyfile`` them (+ read)."""
    import shutil

    files = sorted(folder.glob("shard_*.bin"))
    t0 = time.perf_counter()
    _read_all(files)
    read_s = time.perf_counter() - t0
    target = scratch / "copy"
    target.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        list(pool.map(lambda f: shutil.copyfile(f, target / f.name), files))
    _read_all([target / f.name for f in files])
    copy_s = time.perf_counter() - t0
    common.rmtree(target)
    return {"local_read": read_s, "local_copyfile": copy_s}


def bound_gcs(uri: str, scratch: Path) -> dict[str, float]:
    """Seconds for google-cloud-storage alone to fetch (and read) every object below ``uri``
    (on the server ``STORAGE_EMULATOR_HOST`` names)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import transfer_manager

    bucket_name, _, prefix = uri[len("gs://") :].partition("/")
    client = storage.Client(project="bench", credentials=AnonymousCredentials())
    bucket = client.bucket(bucket_name)
    blobs = [b for b in client.list_blobs(bucket_name, prefix=prefix + "/") if "shard_" in b.name]
    out: dict[str, float] = {}
    target = scratch / "download"

    def plain(blob: Any) -> Path:
        path = target / Path(blob.name).name
        bucket.blob(blob.name).download_to_filename(str(path), checksum="crc32c")
        return path

    def chunked(blob: Any) -> Path:
        path = target / Path(blob.name).name
        transfer_manager.download_chunks_concurrently(
            bucket.blob(blob.name, chunk_size=None),
            str(path),
            chunk_size=32 * MiB,
            max_workers=8,
            worker_type=transfer_manager.THREAD,
            crc32c_checksum=True,
        )
        return path

    for key, fetch in (("gcs_download_to_filename", plain), ("gcs_chunks_concurrently", chunked)):
        target.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(max_workers=len(blobs)) as pool:
            paths = list(pool.map(fetch, blobs))
        _read_all(paths)
        out[key] = time.perf_counter() - t0
        common.rmtree(target)
    # The same plain download in a new process, timed from its start: what any restore in a
    # fresh process pays first (Python, importing google-cloud-storage, a client).
    target.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", FRESH_DOWNLOAD, bucket_name, str(target)] + [b.name for b in blobs],
        check=True,
    )
    out["gcs_fresh_process"] = time.perf_counter() - t0
    common.rmtree(target)
    return out


FRESH_DOWNLOAD = """
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
bucket = storage.Client(project="bench", credentials=AnonymousCredentials()).bucket(sys.argv[1])
def fetch(name):
    path = Path(sys.argv[2], Path(name).name)
    bucket.blob(name).download_to_filename(str(path), checksum="crc32c")
    with open(path, "rb", buffering=0) as fh:
        while fh.read(16 << 20):
            pass
with ThreadPoolExecutor(len(sys.argv) - 3) as pool:
    list(pool.map(fetch, sys.argv[3:]))
"""


def _bound(storage: str, location: str, scratch: str) -> dict[str, float]:
    if storage == "gcs":
        return bound_gcs(location, Path(scratch))
    return bound_local(Path(location), Path(scratch))


def measure_bound(
    storage: str, location: str, scratch: str, in_ray_task: bool = True
) -> dict[str, float]:
    """The bound's seconds, measured in a Ray task (a Ray worker process, as the train
    functions run in: same priority) or, ``in_ray_task=False``, in this process."""
    if not in_ray_task:
        return _bound(storage, location, scratch)
    import ray

    task = ray.remote(num_cpus=0)(_bound)
    result: dict[str, float] = ray.get(task.remote(storage, location, scratch))
    return result


# -- the run ----------------------------------------------------------------------------------
def restore_figures(run: dict[str, Any], size_bytes: int) -> dict[str, Any]:
    """The figures of one restore (seconds)."""
    start, driver, ranks = run["start"], run["driver"], run["ranks"]
    restore_s = max(r["first_step"] - r["before_get"] for r in ranks)
    return {
        "to_first_step_s": max(r["first_step"] for r in ranks) - start,
        "driver_setup_s": driver["fit"] - start,
        "fit_to_entered_s": max(r["entered"] for r in ranks) - driver["fit"],
        "as_directory_s": max(r["got_folder"] - r["before_get"] for r in ranks),
        "restore_s": restore_s,
        "restore_mib_s": size_bytes / MiB / restore_s,
        "bytes_read": sum(r["bytes_read"] for r in ranks),
    }


KEYS = (
    "to_first_step_s",
    "driver_setup_s",
    "fit_to_entered_s",
    "as_directory_s",
    "restore_s",
    "restore_mib_s",
)


def summarize(restores: list[dict[str, Any]], bounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median/min/max per (storage, workers, framework), with the case's median bound."""
    out = []
    cases = dict.fromkeys((r["storage"], r["workers"]) for r in restores)
    for storage, workers in cases:
        case_bounds = [b for b in bounds if b["storage"] == storage and b["workers"] == workers]
        bound_keys = [k for k in case_bounds[0] if k.endswith("_mib_s")] if case_bounds else []
        bound = {k: common.median([b[k] for b in case_bounds]) for k in bound_keys}
        for fw in FRAMEWORKS:
            group = [
                r
                for r in restores
                if r["storage"] == storage and r["workers"] == workers and r["framework"] == fw
            ]
            if not group:
                continue
            row: dict[str, Any] = {
                "storage": storage,
                "workers": workers,
                "framework": fw,
                "repeats": len(group),
                "bound": bound,
            }
            for key in KEYS:
                vals = [r[key] for r in group]
                row[key] = common.median(vals)
                row[f"{key}_min"] = min(vals)
                row[f"{key}_max"] = max(vals)
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 restores per framework and case")
    parser.add_argument("--repeats", type=int, help="restores per framework and case (4)")
    parser.add_argument("--size-mib", type=int, default=1024, help="checkpoint size (1024)")
    parser.add_argument("--storage", default="local,gcs", help="local,gcs")
    parser.add_argument("--layouts", default="1,2", help="ranks holding the checkpoint (1,2)")
    parser.add_argument("--frameworks", default="ours,ray_train")
    parser.add_argument(
        "--emulator-cpus", default="last", help="CPUs for fake-gcs-server (as bench_async_...)"
    )
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:
        driver_main(json.loads(args.driver))
        return {}
    repeats = args.repeats or (2 if args.quick else 4)
    storages = [s for s in args.storage.split(",") if s]
    layouts = [int(w) for w in args.layouts.split(",") if w]
    common.setup_paths()
    skip = common.ray_train_status()
    frameworks = [f for f in args.frameworks.split(",") if f and not (skip and f == "ray_train")]
    size = args.size_mib * MiB
    from benchmarks.bench_async_checkpoint import emulator_cpu_set

    cpus = emulator_cpu_set(args.emulator_cpus)
    emulator = common.Emulator(cpus) if "gcs" in storages else None
    # The cluster is this process's own (``ray.init(address="local")``, shut down with it);
    # each driver process attaches to it by its GCS address.
    ray = common.start_ray(num_cpus=4)
    address = ray.get_runtime_context().gcs_address
    restores: list[dict[str, Any]] = []
    bounds: list[dict[str, Any]] = []
    try:
        for storage in storages:
            for workers in layouts:
                restores_c, bounds_c = run_case(
                    storage, workers, frameworks, size, repeats, address, emulator
                )
                restores += restores_c
                bounds += bounds_c
    finally:
        common.stop_ray()
        if emulator is not None:
            emulator.close()
    summary = summarize(restores, bounds)
    print_table(summary, args.size_mib)
    data = {
        "params": {
            "size_mib": args.size_mib,
            "storage": storages,
            "layouts": layouts,
            "repeats": repeats,
            "quick": args.quick,
            "ray_num_cpus": 4,
            "emulator_cpus": sorted(cpus) if cpus else None,
        },
        "ray_train": skip or "measured",
        "restores": restores,
        "bounds": bounds,
        "summary": summary,
    }
    common.write_result(NAME, data)
    return data


def run_case(
    storage: str,
    workers: int,
    frameworks: list[str],
    size: int,
    repeats: int,
    address: str,
    emulator: common.Emulator | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Write each framework's run, then restore it ``repeats`` times (alternating), with a raw
    bound measured after each round of restores."""
    scratch = common.scratch_dir("restore")
    bucket = None
    if storage == "gcs":
        assert emulator is not None
        emulator.restart()  # a fresh server: nothing left in its memory from the last case
        bucket = emulator.new_bucket("restore")
        base = f"gs://{bucket}/runs"
    else:
        base = str(scratch / "storage")
    tag = f"{storage}-{workers}"
    names = {fw: f"restore-{fw}-{tag}-{int(time.time())}" for fw in frameworks}
    restores: list[dict[str, Any]] = []
    bounds: list[dict[str, Any]] = []

    def spec(fw: str, mode: str, out_dir: Path) -> dict[str, Any]:
        return {
            "framework": fw,
            "mode": mode,
            "name": names[fw],
            "storage_path": base,
            "workers": workers,
            "address": address,
            "gcs_port": emulator.port if emulator else None,
            "config": {"out_dir": str(out_dir), "size_bytes": size},
        }

    try:
        for fw in frameworks:
            out = scratch / f"write-{fw}"
            out.mkdir()
            t0 = time.perf_counter()
            run_driver(spec(fw, "write", out))
            print(f"[restore] {tag}: {fw} wrote its run in {time.perf_counter() - t0:.1f} s")
        ours_ckpt = _latest_checkpoint(storage, base, names.get("ours") or names[frameworks[0]])
        for rep in range(repeats):
            order = frameworks if rep % 2 == 0 else list(reversed(frameworks))
            for fw in order:
                out = scratch / f"restore-{fw}-{rep}"
                out.mkdir()
                run = run_driver(spec(fw, "restore", out))
                common.rmtree(out)
                fig = restore_figures(run, size)
                if fig["bytes_read"] != size:
                    raise RuntimeError(f"{fw} read {fig['bytes_read']} bytes, not {size}")
                fig.update(storage=storage, workers=workers, framework=fw, repeat=rep)
                fig["loadavg_1m_after"] = common.loadavg_1m()
                restores.append(fig)
                print(
                    f"[restore] {tag} {fw} #{rep}: first step {fig['to_first_step_s']:.2f} s "
                    f"(driver setup {fig['driver_setup_s']:.2f}, fit->entered "
                    f"{fig['fit_to_entered_s']:.2f}, restore {fig['restore_s']:.2f} s = "
                    f"{fig['restore_mib_s']:.0f} MiB/s)",
                    flush=True,
                )
            secs = measure_bound(storage, ours_ckpt, str(scratch))
            # The same in this process, at nice 0: Ray runs its worker processes (the train
            # functions, and the task above) at nice 15, and on a shared machine that costs.
            here = measure_bound(storage, ours_ckpt, str(scratch), in_ray_task=False)
            secs.update({f"{k}_nice0": v for k, v in here.items() if "fresh" not in k})
            b: dict[str, Any] = {f"{k}_mib_s": size / MiB / v for k, v in secs.items()}
            b.update(storage=storage, workers=workers, repeat=rep)
            bounds.append(b)
            print(
                f"[restore] {tag} bound #{rep}: "
                + ", ".join(f"{k} {v:.0f} MiB/s" for k, v in b.items() if k.endswith("_mib_s")),
                flush=True,
            )
    finally:
        common.rmtree(scratch)
        if bucket is not None and emulator is not None:
            emulator.delete_bucket(bucket)
    return restores, bounds


def _latest_checkpoint(storage: str, base: str, name: str) -> str:
    """The checkpoint folder of run ``name`` (its one ``checkpoint_*``)."""
    from trainer_runtime.storage.factory import get_storage

    run = f"{base}/{name}"
    dirs = [d for d in get_storage(run).list_dirs(run) if d.startswith("checkpoint_")]
    if not dirs:
        raise RuntimeError(f"no checkpoint folder in {run}")
    return f"{run}/{sorted(dirs)[-1]}"


def print_table(summary: list[dict[str, Any]], size_mib: int) -> None:
    """The figures and ratios on stdout."""
    print(f"\nRestore of a {size_mib} MiB checkpoint (median of the restores; MiB/s)")
    header = (
        f"{'storage':7s} {'ranks':>5s} {'framework':10s} {'first step s':>12s} "
        f"{'restore s':>9s} {'MiB/s':>7s} {'bound MiB/s':>11s} {'of bound':>8s}"
    )
    print(header)
    for r in summary:
        _, bound = held_bound(r["storage"], r["bound"])
        print(
            f"{r['storage']:7s} {r['workers']:5d} {r['framework']:10s} "
            f"{r['to_first_step_s']:12.2f} {r['restore_s']:9.2f} {r['restore_mib_s']:7.0f} "
            f"{bound:11.0f} {r['restore_mib_s'] / bound:8.0%}"
        )
    for r in summary:
        if r["framework"] != "ours":
            continue
        ray = next(
            (
                x
                for x in summary
                if x["framework"] == "ray_train"
                and (x["storage"], x["workers"]) == (r["storage"], r["workers"])
            ),
            None,
        )
        if ray:
            print(
                f"{r['storage']} x{r['workers']}: Ray Train / ours: first step "
                f"{ray['to_first_step_s'] / r['to_first_step_s']:.2f}x, restore "
                f"{ray['restore_s'] / r['restore_s']:.2f}x"
            )


if __name__ == "__main__":
    main()
