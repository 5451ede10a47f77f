"""Where the operator's memory per TrainJob goes: ``tracemalloc`` snapshots of the operator.

A profiling tool next to ``bench_operator.py`` (issue 40: the operator's RSS at 10,000
TrainJobs), not a benchmark with a result: it starts the same API server (etcd +
kube-apiserver, no kubelet, so every TrainJob stays ``Starting`` and keeps its timer) and the
operator as the image runs it, with ``tracemalloc`` started in the operator's process. It
takes a snapshot with the operator idle, creates ``--jobs`` TrainJobs, waits until the
operator is quiet (no reconcile for a few seconds, timers included), takes a second snapshot
and prints:

* the operator's RSS at both points and the Python heap ``tracemalloc`` sees (RSS minus that
  is the interpreter, the libraries' C allocations, and freed memory the allocator keeps);
* the allocation sites that grew most between the snapshots, per TrainJob, grouped by
  ``--group`` (``lineno``, or ``traceback`` with ``--frames`` frames).

``tracemalloc`` costs the operator time and memory of its own (every traced block carries its
traceback), so the RSS printed here is higher than ``bench_operator.py``'s; the per-site
figures are what to read.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_operator_memory.py --jobs 2000
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import tracemalloc
from pathlib import Path

from benchmarks import bench_operator as bo
from benchmarks import common

#: Run in the operator's process before it starts: tracemalloc on (unless frames is 0), and a
#: thread that writes a snapshot to ``<dir>/<n>.trace`` whenever ``<dir>/<n>.request``
#: appears, and on ``<dir>/trim.request`` runs the garbage collector and glibc's
#: ``malloc_trim(0)`` (what RSS then drops by was free memory the allocators kept).
_PRELUDE = """\
import ctypes as _ct, gc as _gc, os as _os, pathlib as _pl, threading as _th, time as _t
import tracemalloc as _tm
if int(_os.environ["TRAINJOB_PROFILE_FRAMES"]):
    _tm.start(int(_os.environ["TRAINJOB_PROFILE_FRAMES"]))
def _snapshots(folder=_pl.Path(_os.environ["TRAINJOB_PROFILE_DIR"])):
    n = 0
    while True:
        if (folder / f"{n}.request").exists():
            _tm.take_snapshot().dump(str(folder / f"{n}.part"))
            (folder / f"{n}.part").rename(folder / f"{n}.trace")
            n += 1
        if (folder / "trim.request").exists() and not (folder / "trim.done").exists():
            _gc.collect()
            _ct.CDLL("libc.so.6").malloc_trim(0)
            (folder / "trim.done").touch()
        _t.sleep(0.2)
_th.Thread(target=_snapshots, daemon=True, name="profile-snapshots").start()
"""


def trim(folder: Path, pid: int, timeout_s: float = 60.0) -> float:
    """Ask the operator to collect garbage and trim malloc's free memory; its RSS after, MiB."""
    (folder / "trim.request").touch()
    deadline = time.monotonic() + timeout_s
    while not (folder / "trim.done").exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the operator did not trim")
        time.sleep(0.2)
    return bo._proc_status(pid).get("VmRSS", 0) / 1024


def snapshot(folder: Path, index: int, timeout_s: float = 300.0) -> tracemalloc.Snapshot:
    """Ask the operator for snapshot ``index`` and load it."""
    (folder / f"{index}.request").touch()
    path = folder / f"{index}.trace"
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no snapshot {path} after {timeout_s} s")
        time.sleep(0.2)
    return tracemalloc.Snapshot.load(str(path))


def traced_mib(snap: tracemalloc.Snapshot) -> float:
    """The Python heap the snapshot holds, in MiB (tracemalloc's own blocks left out)."""
    return sum(s.size for s in _own_left_out(snap).statistics("filename")) / 2**20


def _own_left_out(snap: tracemalloc.Snapshot) -> tracemalloc.Snapshot:
    return snap.filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ]
    )


def top_growth(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, group: str, jobs: int, top: int
) -> list[str]:
    """The ``top`` sites whose memory grew most, as lines (bytes per TrainJob first)."""
    lines = []
    diffs = _own_left_out(after).compare_to(_own_left_out(before), group)
    for diff in diffs[:top]:
        per_job = diff.size_diff / max(jobs, 1)
        where = diff.traceback.format(limit=None if group == "traceback" else 1)
        lines.append(
            f"{per_job:9.0f} B/job  {diff.size_diff / 2**20:7.2f} MiB  "
            f"{diff.count_diff:+9d} blocks  " + "\n" + "\n".join(f"    {w}" for w in where)
        )
    return lines


def run(args: argparse.Namespace) -> None:
    """Start the API server and the traced operator, create the TrainJobs, print the growth."""
    import yaml

    from tests.support import EnvTest, ensure_assets

    template = yaml.safe_load(bo.MANIFEST.read_text())
    kinds = bo.expected_children(template)
    workdir = common.scratch_dir("operator-memory")
    folder = workdir / "snapshots"
    folder.mkdir(parents=True)

    os.environ["TRAINJOB_PROFILE_DIR"] = str(folder)
    os.environ["TRAINJOB_PROFILE_FRAMES"] = "0" if args.rss_only else str(args.frames)
    for item in args.env:  # for the operator's process (which inherits this one's)
        key, _, value = item.partition("=")
        os.environ[key] = value
    with EnvTest(ensure_assets(), controller_manager=False) as env:
        env.apply_crd(bo.CRD)
        api = bo.Api(env.host, env.token, str(env.ca_file))
        status, body = api.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": bo.NAMESPACE}, "kind": "Namespace"}
        )
        if status != 201:
            raise RuntimeError(f"create namespace: HTTP {status}: {body}")
        tracker = bo.Tracker(sum(kinds.values()))
        watches = [
            bo.Watch(
                api, bo._all_namespaces(p), {"labelSelector": bo.NAME_LABEL}, tracker.on_child(k)
            )
            for k, p in bo.CHILD_KINDS.items()
            if k in kinds
        ]
        for w in watches:
            w.start()
        proc, metrics_port, log_path = bo.start_operator(env, workdir, prelude=_PRELUDE)
        try:
            time.sleep(2.0)
            rss_idle = bo._proc_status(proc.pid).get("VmRSS", 0) / 1024
            idle = None if args.rss_only else snapshot(folder, 0)
            names = [f"mem-{i:05d}" for i in range(args.jobs)]
            progress = threading.Event()

            def report() -> None:
                while not progress.wait(30):
                    print(f"[profile] {tracker.done_count(names)}/{len(names)} done", flush=True)

            threading.Thread(target=report, daemon=True).start()
            t0 = time.time()
            bo.create_jobs(api, tracker, names, template)
            if not tracker.wait_done(names, args.timeout_s):
                raise RuntimeError(f"children not all created in {args.timeout_s} s")
            progress.set()
            print(f"[profile] {args.jobs} TrainJobs' children in {time.time() - t0:.0f} s")
            quiet = bo.wait_quiet(metrics_port, args.timeout_s, quiet_s=5.0, timers_too=False)
            time.sleep(args.settle_s)
            rss_total = bo._proc_status(proc.pid).get("VmRSS", 0) / 1024
            full = None if args.rss_only else snapshot(folder, 1)
            rss_trimmed = trim(folder, proc.pid)
        finally:
            for w in watches:
                w.stop()
            alive = proc.poll() is None
            bo._stop(proc)
            if not alive:
                print(bo._tail(log_path), file=sys.stderr)
    print(
        f"[profile] quiet after {quiet:.0f} s; RSS idle {rss_idle:.1f} MiB, at {args.jobs} "
        f"TrainJobs {rss_total:.1f} MiB ({(rss_total - rss_idle) * 1024 / args.jobs:.1f} KiB "
        f"per TrainJob{'' if args.rss_only else ', tracemalloc included'}; "
        f"env {' '.join(args.env) or 'as is'}); after gc.collect() and malloc_trim(0) "
        f"{rss_trimmed:.1f} MiB"
    )
    if idle is None or full is None:
        common.rmtree(workdir)
        return
    heap_idle, heap_total = traced_mib(idle), traced_mib(full)
    print(
        f"[profile] Python heap traced: idle {heap_idle:.1f} MiB, at {args.jobs} TrainJobs "
        f"{heap_total:.1f} MiB ({(heap_total - heap_idle) * 1024 / args.jobs:.1f} KiB per "
        "TrainJob)"
    )
    print(f"[profile] the {args.top} sites that grew most (group by {args.group}):")
    for line in top_growth(idle, full, args.group, args.jobs, args.top):
        print(line)
    common.rmtree(workdir)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000, help="TrainJobs to create (2000)")
    parser.add_argument("--frames", type=int, default=8, help="traceback depth traced (8)")
    parser.add_argument("--group", choices=("lineno", "traceback"), default="lineno")
    parser.add_argument("--top", type=int, default=25, help="sites printed (25)")
    parser.add_argument("--settle-s", type=float, default=20.0, help="wait once quiet (20 s)")
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument(
        "--rss-only", action="store_true", help="no tracemalloc: the operator's RSS alone"
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="environment of the operator's process (e.g. MALLOC_ARENA_MAX=2); repeatable",
    )
    args = parser.parse_args(argv)
    common.setup_paths()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    run(args)


if __name__ == "__main__":
    main()
