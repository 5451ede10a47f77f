"""The operator on a real kube-apiserver: reconcile latency, throughput and memory.

What runs:

* etcd + kube-apiserver 1.20 (:class:`tests.support.EnvTest`, the binaries that
  ``scripts/provision-envtest.sh`` builds; no kube-controller-manager, no scheduler, no
  kubelet: pods stay Pending, which does not matter here);
* the operator as its own process, as deployed: ``trainjob operator --namespace bench``
  (kopf, the default 5 s timer per TrainJob), with a kubeconfig for the admin and, as in the
  operator image, no Kubernetes client library importable (:data:`AS_IN_THE_IMAGE`), so its
  memory is measured alone (``VmRSS`` from ``/proc``);
* this process creates TrainJobs (``examples/quickstart.yaml`` renamed: 2 workers, a
  validation pool with ``minReplicas: 0``) with plain HTTPS POSTs and watches the children
  with one watch per kind (pods, services, serviceaccounts, roles, rolebindings: what the
  operator creates for that manifest; the count comes from the operator's own renderer) and the
  TrainJobs themselves.

Phases:

1. ``sequential``: ``--sequential`` TrainJobs one at a time (the next one is created when the
   previous one's children all exist): the latency of one reconcile on an idle operator;
2. ``burst``: ``--jobs`` TrainJobs created back to back as fast as one client can: latency
   under load and throughput (TrainJobs whose children all exist per second, from the first
   create to the last child);
3. ``scale``: more TrainJobs in a burst until ``--total`` exist, then ``--settle-s`` seconds
   of steady state (every TrainJob's timer keeps firing): the operator's RSS at ``--total``
   TrainJobs, and the CPU the operator, kube-apiserver and etcd use in steady state; then
   ``--probe`` TrainJobs one at a time again: a new TrainJob's latency with ``--total``
   others there (phase 1's figure at scale).

Between the burst and the scale phase, three bounds of the burst's throughput on the same API
server, each by a plain client that costs the operator nothing: :func:`bound` (the children
alone), :func:`bound_with_trainjobs` (and the TrainJobs' own POSTs) and
:func:`bound_of_the_writes` (every write the operator makes for a new TrainJob, with watches
standing for its own). After the run, :func:`write_costs`: the API server's CPU per write, by
kind of write. The benchmark's watches span all namespaces, so every bound feeds the same
watchers as the burst; this process's own CPU is sampled too.

Latency of one TrainJob: from just before its POST to the moment the last of its children was
seen by the watch ("children"), and to the first status the operator wrote ("status"). RSS
and CPU are sampled every 0.5 s. The operator's Prometheus metrics (reconciles by trigger,
reconcile seconds) are scraped at the end. No Ray Train comparison: Ray Train has no operator
(KubeRay's RayJob would be the closest, and it is not part of this repository's test setup).

Usage::

    python benchmarks/bench_operator.py [--quick] [--sequential N] [--jobs N] [--total N]
        [--settle-s S]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common

NAME = "operator"
NAMESPACE = "bench"
#: Where the plain client of the bound creates its children (the operator does not watch it).
BOUND_NAMESPACE = "bench-bound"
NAME_LABEL = "trainjob.dev/name"
CHILD_KINDS = {
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Service": "/api/v1/namespaces/{ns}/services",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
}
TRAINJOBS = "/apis/trainjob.dev/v1alpha1/namespaces/{ns}/trainjobs"
CRD = common.REPO_ROOT / "crds" / "trainjob.dev_trainjobs.yaml"
MANIFEST = common.REPO_ROOT / "examples" / "quickstart.yaml"


def _proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB (empty when it is gone)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


class Api:
    """Minimal HTTPS JSON client (keep-alive connection per thread) for the benchmark side."""

    def __init__(self, host: str, token: str, ca_file: str) -> None:
        parsed = urllib.parse.urlparse(host)
        self.host = parsed.hostname or "127.0.0.1"
        self.port = parsed.port or 443
        self.token = token
        self.context = ssl.create_default_context(cafile=ca_file)
        self._local = threading.local()

    def connection(self, timeout: float | None = 30.0) -> http.client.HTTPSConnection:
        """A new connection (watches use their own)."""
        return http.client.HTTPSConnection(
            self.host, self.port, context=self.context, timeout=timeout
        )

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """One request on this thread's keep-alive connection; (status, decoded JSON)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self.connection()
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException):
            self._local.conn = None
            conn.close()
            raise
        return resp.status, (json.loads(raw) if raw else None)


class Watch(threading.Thread):
    """One streaming watch; calls ``on_event(type, object, seen_at)`` for every event, or, with
    ``on_event=None``, reads the events and drops them unparsed (a watcher that costs the API
    server what any watcher does, and this process next to nothing)."""

    def __init__(self, api: Api, path: str, query: dict[str, str], on_event: Any) -> None:
        super().__init__(name=f"watch {path}", daemon=True)
        self.api = api
        self.path = path
        self.query = query
        self.on_event = on_event
        self.conn: http.client.HTTPSConnection | None = None
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        status, listing = api.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
        if status != 200:
            raise RuntimeError(f"list {path}: HTTP {status}: {listing}")
        self.resource_version = listing["metadata"]["resourceVersion"]

    def run(self) -> None:
        """Stream events until :meth:`stop` (re-watching from the last version on timeouts)."""
        while not self.stopped.is_set():
            query = {
                **self.query,
                "watch": "1",
                "resourceVersion": self.resource_version,
                "timeoutSeconds": "3600",
            }
            try:
                self.conn = self.api.connection(timeout=None)
                self.conn.request(
                    "GET",
                    f"{self.path}?{urllib.parse.urlencode(query)}",
                    headers={"Authorization": f"Bearer {self.api.token}"},
                )
                resp = self.conn.getresponse()
                if resp.status != 200:
                    raise RuntimeError(f"watch {self.path}: HTTP {resp.status}")
                while not self.stopped.is_set():
                    line = resp.readline()
                    if not line:
                        break
                    if self.on_event is None:
                        continue
                    seen = time.time()
                    event = json.loads(line)
                    obj = event.get("object") or {}
                    rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.resource_version = rv
                    self.on_event(event.get("type"), obj, seen)
            except Exception as exc:  # noqa: BLE001 - kept; the run fails with it
                if not self.stopped.is_set():
                    self.error = exc
                    return
            finally:
                if self.conn is not None:
                    self.conn.close()

    def stop(self) -> None:
        """Close the stream."""
        self.stopped.set()
        conn = self.conn
        if conn is not None and conn.sock is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)


class Tracker:
    """First-seen times of every TrainJob's children and status, from the watches."""

    def __init__(self, expected_children: int) -> None:
        self.expected = expected_children
        self.lock = threading.Lock()
        self.children: dict[str, dict[tuple[str, str], float]] = {}
        self.done_at: dict[str, float] = {}
        self.status_at: dict[str, float] = {}
        self.created_at: dict[str, float] = {}
        self.done_event = threading.Condition(self.lock)

    def on_child(self, kind: str) -> Any:
        def handle(event_type: str, obj: dict[str, Any], seen: float) -> None:
            if event_type != "ADDED":
                return
            meta = obj.get("metadata") or {}
            job = (meta.get("labels") or {}).get(NAME_LABEL)
            if not job:
                return
            with self.lock:
                seen_children = self.children.setdefault(job, {})
                seen_children.setdefault((kind, meta.get("name", "")), seen)
                if len(seen_children) >= self.expected and job not in self.done_at:
                    self.done_at[job] = max(seen_children.values())
                    self.done_event.notify_all()

        return handle

    def on_trainjob(self, event_type: str, obj: dict[str, Any], seen: float) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if name and (obj.get("status") or {}).get("phase"):
            with self.lock:
                self.status_at.setdefault(name, seen)

    def done_count(self, names: list[str]) -> int:
        with self.lock:
            return sum(1 for n in names if n in self.done_at)

    def wait_done(self, names: list[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not all(n in self.done_at for n in names):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.done_event.wait(min(left, 1.0))
        return True


class Sampler(threading.Thread):
    """Every ``interval`` s: RSS of the operator, CPU seconds of the operator, apiserver, etcd."""

    def __init__(self, pids: dict[str, int], tracker: Tracker, interval: float = 0.5) -> None:
        super().__init__(name="sampler", daemon=True)
        self.pids = pids
        self.tracker = tracker
        self.interval = interval
        self.samples: list[dict[str, Any]] = []
        self.stopped = threading.Event()

    def sample(self) -> dict[str, Any]:
        st = _proc_status(self.pids["operator"])
        with self.tracker.lock:
            created = len(self.tracker.created_at)
            done = len(self.tracker.done_at)
        row: dict[str, Any] = {
            "t": time.time(),
            "rss_mib": st.get("VmRSS", 0) / 1024,
            "hwm_mib": st.get("VmHWM", 0) / 1024,
            "created": created,
            "done": done,
        }
        for name, pid in self.pids.items():
            row[f"cpu_{name}"] = common.process_cpu_seconds(pid)
        return row

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            self.samples.append(self.sample())

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)


def _all_namespaces(path: str) -> str:
    """``path`` (a namespaced collection, ``{ns}`` unfilled) across all namespaces."""
    return path.replace("/namespaces/{ns}", "")


def _job_body(name: str, template: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(template)
    body["metadata"] = {"name": name, "namespace": NAMESPACE}
    return body


def create_jobs(
    api: Api, tracker: Tracker, names: list[str], template: dict[str, Any]
) -> dict[str, Any]:
    """POST the TrainJobs back to back; returns the submission timing."""
    path = TRAINJOBS.format(ns=NAMESPACE)
    t0 = time.time()
    post_s = []
    for name in names:
        sent = time.time()
        with tracker.lock:
            tracker.created_at[name] = sent
        status, body = api.request("POST", path, _job_body(name, template))
        if status != 201:
            raise RuntimeError(f"create TrainJob {name}: HTTP {status}: {body}")
        post_s.append(time.time() - sent)
    return {"submit_s": time.time() - t0, "post_ms_p50": common.median(post_s) * 1e3}


def one_at_a_time(
    api: Api, tracker: Tracker, names: list[str], template: dict[str, Any], timeout_s: float
) -> None:
    """Create each TrainJob of ``names`` once the previous one's children all exist."""
    for name in names:
        create_jobs(api, tracker, [name], template)
        if not tracker.wait_done([name], timeout_s):
            raise RuntimeError(f"{name}: children not all created in {timeout_s} s")


def phase_figures(tracker: Tracker, names: list[str], label: str) -> dict[str, Any]:
    """Latency percentiles and throughput of one phase's TrainJobs."""
    with tracker.lock:
        created = [tracker.created_at[n] for n in names]
        lat = [tracker.done_at[n] - tracker.created_at[n] for n in names if n in tracker.done_at]
        status = [
            tracker.status_at[n] - tracker.created_at[n] for n in names if n in tracker.status_at
        ]
        last = max((tracker.done_at[n] for n in names if n in tracker.done_at), default=None)
    stats = common.summarize(lat)
    span = (last - min(created)) if last else None
    return {
        "phase": label,
        "jobs": len(names),
        "completed": len(lat),
        "latency_s": lat,
        "p50_s": stats["p50"],
        "p90_s": stats["p90"],
        "p99_s": stats["p99"],
        "max_s": stats["max"],
        "status_p50_s": common.median(status) if status else None,
        "status_p99_s": common.percentile(status, 99) if status else None,
        "span_s": span,
        "jobs_per_s": len(lat) / span if span else None,
        "cdf_s": common.quantile_curve(lat, 100),
    }


def scrape_metrics(port: int) -> dict[str, float]:
    """The operator's ``trainjob_*`` Prometheus samples (name{labels} -> value)."""
    out: dict[str, float] = {}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("trainjob_") and " " in line:
                key, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[key] = float(value)
    return out


def wait_quiet(
    metrics_port: int, timeout: float, quiet_s: float = 3.0, timers_too: bool = False
) -> float:
    """Wait until no create- or pod-triggered reconcile (with ``timers_too``: no reconcile at
    all) ran for ``quiet_s``; returns the wait."""
    t0 = time.monotonic()

    def event_reconciles() -> float:
        m = scrape_metrics(metrics_port)
        return sum(
            v
            for k, v in m.items()
            if k.startswith("trainjob_reconciles_total{")
            and (timers_too or '"pod"' in k or '"create"' in k)
        )

    last = event_reconciles()
    while time.monotonic() - t0 < timeout:
        time.sleep(quiet_s)
        now = event_reconciles()
        if now == last:
            break
        last = now
    return time.monotonic() - t0


def request_costs(env: Any, api: Api, repeats: int = 10) -> dict[str, Any]:
    """With every TrainJob's children in the namespace (operator stopped): what one of the
    reconciler's child LISTs costs, as it sends it and with the alternatives.

    * ``list_etcd_ms``: ``GET pods?labelSelector=trainjob.dev/name=<one job>`` (no
      ``resourceVersion``: a quorum read from etcd that decodes every pod of the namespace);
    * ``list_cache_ms``: the same with ``resourceVersion=0`` (served from the watch cache);
    * ``kubeclient_list_ms``: the operator's ``KubeClient.list(..., from_cache=True)``, as the
      reconciler sends it (watch cache, kept-alive connection);
    * ``get_keepalive_ms`` / ``kubeclient_get_ms``: one small GET (the namespace) on a kept-alive
      connection vs through ``KubeClient``;
    * ``new_connection_get_ms``: the same GET on a new HTTPS connection each time (TLS
      handshake), as ``KubeClient`` sent every request before it kept connections alive.
    """
    from trainjob_operator.kube import KubeClient, KubeConfig

    kube = KubeClient(KubeConfig(host=env.host, token=env.token, ca_file=str(env.ca_file)))
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    selector = urllib.parse.urlencode({"labelSelector": f"{NAME_LABEL}=burst-0000"})

    def timed(fn: Any) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return common.median(times) * 1e3

    def get_on_new_connection() -> None:
        kube.close()  # the next request opens a new connection
        kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}")

    return {
        "namespace_pods": len(api.request("GET", f"{pods}?resourceVersion=0")[1]["items"]),
        "list_etcd_ms": timed(lambda: api.request("GET", f"{pods}?{selector}")),
        "list_cache_ms": timed(lambda: api.request("GET", f"{pods}?{selector}&resourceVersion=0")),
        "kubeclient_list_ms": timed(
            lambda: kube.list("Pod", NAMESPACE, f"{NAME_LABEL}=burst-0000", from_cache=True)
        ),
        "get_keepalive_ms": timed(lambda: api.request("GET", f"/api/v1/namespaces/{NAMESPACE}")),
        "kubeclient_get_ms": timed(lambda: kube.request("GET", f"/api/v1/namespaces/{NAMESPACE}")),
        "new_connection_get_ms": timed(get_on_new_connection),
    }


#: How often a driver patches its TrainJob's status while it reports (``StatusPublisher``).
DRIVER_STATUS_INTERVAL_S = 2.0


def driver_updates(api: Api, names: list[str], duration_s: float) -> dict[str, Any]:
    """Stand in for the drivers of TrainJobs ``names``, training: for ``duration_s``, patch
    each one's ``status.progress`` every :data:`DRIVER_STATUS_INTERVAL_S`, as the in-pod
    driver's status publisher does while ``report()`` is called (a new step and metrics each
    time). What the operator does meanwhile is what running TrainJobs cost it."""
    import datetime as dt
    from concurrent.futures import ThreadPoolExecutor

    path = TRAINJOBS.format(ns=NAMESPACE)

    def publish(item: tuple[str, int]) -> None:
        name, step = item
        patch = {
            "status": {
                "progress": {
                    "step": step,
                    "metrics": {"loss": 1.0 / (step + 1)},
                    "updatedAt": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            }
        }
        _check(
            *api.request("PATCH", f"{path}/{name}/status", patch, "application/merge-patch+json"),
            f"PATCH {name}/status",
        )

    patches = 0
    t0 = time.monotonic()
    with ThreadPoolExecutor(4, thread_name_prefix="driver") as pool:
        step = 0
        while time.monotonic() - t0 < duration_s:
            round_start = time.monotonic()
            list(pool.map(publish, [(name, step) for name in names]))
            patches += len(names)
            step += 1
            time.sleep(max(0.0, DRIVER_STATUS_INTERVAL_S - (time.monotonic() - round_start)))
    span = time.monotonic() - t0
    return {"trainjobs": len(names), "patches": patches, "span_s": span}


#: Where :func:`write_costs` writes (no watcher and no operator there).
COSTS_NAMESPACE = "bench-costs"


def write_costs(
    env: Any, api: Api, template: dict[str, Any], jobs: int, concurrency: int
) -> dict[str, dict[str, float]]:
    """The API server's and etcd's CPU per write, by kind of write: what a new TrainJob costs
    the API server, write by write (operator stopped, no watchers of this namespace).

    The writes of ``jobs`` TrainJobs (:func:`_operator_writes`, into
    :data:`COSTS_NAMESPACE`), one kind of write at a time, by ``concurrency`` threads: the
    TrainJob POSTs, each child kind's POSTs, the status patches, the Events. For each: ms of
    CPU per write of the kube-apiserver and of etcd (their ``/proc`` CPU time over the
    phase), and writes per second.
    """
    import datetime as dt
    from concurrent.futures import ThreadPoolExecutor

    from trainjob_operator.reconcile.apply import event_body

    pids = {p.name: p.popen.pid for p in env._procs}  # read-only use
    status, body = api.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": COSTS_NAMESPACE}, "kind": "Namespace"}
    )
    if status != 201:
        raise RuntimeError(f"create namespace: HTTP {status}: {body}")

    writes = [_operator_writes(f"cost-{i:04d}", template, COSTS_NAMESPACE) for i in range(jobs)]
    trainjobs_path = TRAINJOBS.format(ns=COSTS_NAMESPACE)
    created: list[dict[str, Any]] = []
    by_kind: dict[str, list[tuple[str, str, Any, str]]] = {}
    for _, children, _, _ in writes:
        for path, child in children:
            by_kind.setdefault(f"POST {child['kind']}", []).append(
                ("POST", path, child, "application/json")
            )

    def phase(what: str, requests: list[tuple[str, str, Any, str]]) -> dict[str, float]:
        answers: list[Any] = []

        def send(request: tuple[str, str, Any, str]) -> None:
            method, path, body, content_type = request
            status, answer = api.request(method, path, body, content_type)
            if status not in (200, 201):
                raise RuntimeError(f"costs: {what}: HTTP {status}: {answer}")
            answers.append(answer)

        before = {k: common.process_cpu_seconds(pid) for k, pid in pids.items()}
        t0 = time.perf_counter()
        with ThreadPoolExecutor(concurrency, thread_name_prefix="costs") as pool:
            list(pool.map(send, requests))
        span = time.perf_counter() - t0
        n = len(requests)
        row = {"writes": float(n), "per_s": n / span}
        for k, pid in pids.items():
            now, then = common.process_cpu_seconds(pid), before[k]
            if now is not None and then is not None:
                row[f"{k.replace('-', '_')}_ms"] = (now - then) / n * 1e3
        if what == "POST TrainJob":
            created.extend(answers)
        return row

    costs: dict[str, dict[str, float]] = {}
    trainjob_posts = [("POST", trainjobs_path, w[0], "application/json") for w in writes]
    costs["POST TrainJob"] = phase("POST TrainJob", trainjob_posts)
    for what, requests in by_kind.items():
        costs[what] = phase(what, requests)
    by_name = {c["metadata"]["name"]: c for c in created}
    patches, events = [], []
    now = dt.datetime.now(dt.UTC)
    for trainjob, _, status_patch, planned in writes:
        obj = by_name[trainjob["metadata"]["name"]]
        name = obj["metadata"]["name"]
        patches.append(
            (
                "PATCH",
                f"{trainjobs_path}/{name}/status",
                status_patch,
                "application/merge-patch+json",
            )
        )
        for event in planned:
            events.append(
                (
                    "POST",
                    f"/api/v1/namespaces/{COSTS_NAMESPACE}/events",
                    event_body(obj, event, now),
                    "application/json",
                )
            )
    costs["PATCH TrainJob status"] = phase("PATCH TrainJob status", patches)
    costs["POST Event"] = phase("POST Event", events)
    return costs


def _bound_children(
    name: str, template: dict[str, Any], namespace: str = BOUND_NAMESPACE
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """TrainJob ``name`` of ``template`` in ``namespace``, and the children the operator's own
    renderer makes for it, with the path each is POSTed to (rendered before a bound's clock
    starts), in the renderer's order."""
    from trainjob_operator.api import parse_trainjob
    from trainjob_operator.kube import resource_path
    from trainjob_operator.render import render_for_reconcile

    obj = _job_body(name, template)
    obj["metadata"]["namespace"] = namespace
    trainjob = copy.deepcopy(obj)
    uid = obj["metadata"]["uid"] = f"{name}-uid"
    children = []
    for child in render_for_reconcile(parse_trainjob(obj), uid, 0, 0):
        child = dict(child)
        # The owner (a TrainJob that does not exist here) would be garbage collected.
        child["metadata"] = {k: v for k, v in child["metadata"].items() if k != "ownerReferences"}
        child["metadata"]["namespace"] = namespace
        children.append((resource_path(child["kind"], namespace), child))
    return trainjob, children


def bound(api: Api, template: dict[str, Any], jobs: int, concurrency: int) -> dict[str, Any]:
    """The physical bound of the operator's create throughput on this API server.

    The children the operator's renderer makes for ``jobs`` TrainJobs of ``template``
    (rendered before the clock starts) POSTed by a plain client with ``concurrency`` threads
    (one kept-alive connection each) into :data:`BOUND_NAMESPACE`: first every non-Pod child,
    then every Pod (a Pod names its ServiceAccount, which must exist). No reads, no status
    writes, no Events, no rendering: what the operator does beyond the creates is its cost
    over this bound.
    """
    from concurrent.futures import ThreadPoolExecutor

    waves: list[list[tuple[str, dict[str, Any]]]] = [[], []]
    for i in range(jobs):
        for path, child in _bound_children(f"bound-{i:04d}", template)[1]:
            waves[child["kind"] == "Pod"].append((path, child))

    def post(item: tuple[str, dict[str, Any]]) -> float:
        sent = time.perf_counter()
        status, body = api.request("POST", item[0], item[1])
        if status != 201:
            raise RuntimeError(f"bound: POST {item[0]}: HTTP {status}: {body}")
        return time.perf_counter() - sent

    latencies: list[float] = []
    with ThreadPoolExecutor(concurrency, thread_name_prefix="bound") as pool:
        t0 = time.perf_counter()
        for wave in waves:
            latencies.extend(pool.map(post, wave))
        span = time.perf_counter() - t0
    n = sum(len(w) for w in waves)
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "creates": n,
        "span_s": span,
        "creates_per_s": n / span,
        "jobs_per_s": jobs / span,
        "post_ms_p50": common.median(latencies) * 1e3,
    }


def bound_with_trainjobs(
    api: Api, template: dict[str, Any], jobs: int, concurrency: int
) -> dict[str, Any]:
    """The bound with the TrainJobs' own creates: what an operator that took no CPU and no
    time would make the API server do during the burst.

    This process POSTs ``jobs`` TrainJobs back to back, as the burst does (one client, into
    :data:`BOUND_NAMESPACE`, which the operator does not watch), and a plain client of
    ``concurrency`` threads POSTs each TrainJob's children (rendered before the clock starts)
    as soon as its TrainJob exists: every non-Pod child, then the Pods. TrainJobs per second
    from the first TrainJob POST to the last child's answer, as the burst's figure.
    """
    prepared = []
    for i in range(jobs):
        trainjob, children = _bound_children(f"boundtj-{i:04d}", template)
        children.sort(key=lambda item: item[1]["kind"] == "Pod")  # a Pod names its ServiceAccount
        prepared.append((trainjob, children))

    def post_children(_created: dict[str, Any], children: list[tuple[str, Any]]) -> None:
        for path, child in children:
            _check(*api.request("POST", path, child), f"POST {path}")

    return _trainjobs_then(api, prepared, post_children, concurrency)


def _check(status: int, body: Any, what: str) -> None:
    """Raise unless the API server answered ``what`` with success."""
    if status not in (200, 201):
        raise RuntimeError(f"bound: {what}: HTTP {status}: {body}")


def _trainjobs_then(
    api: Api, prepared: list[tuple[dict[str, Any], Any]], then: Any, concurrency: int
) -> dict[str, Any]:
    """POST each ``(trainjob, rest)`` of ``prepared``'s TrainJobs back to back, as the burst
    does (one client), and run ``then(trainjob as created, rest)`` for each on a pool of
    ``concurrency`` threads as soon as it exists: TrainJobs per second from the first POST to
    the last ``then`` done, as the burst's figure."""
    from concurrent.futures import ThreadPoolExecutor

    path = TRAINJOBS.format(ns=BOUND_NAMESPACE)
    with ThreadPoolExecutor(concurrency, thread_name_prefix="bound-tj") as pool:
        t0 = time.perf_counter()
        futures = []
        for trainjob, rest in prepared:
            status, created = api.request("POST", path, trainjob)
            _check(status, created, "POST TrainJob")
            futures.append(pool.submit(then, created, rest))
        submitted = time.perf_counter() - t0
        for future in futures:
            future.result()
        span = time.perf_counter() - t0
    return {
        "jobs": len(prepared),
        "concurrency": concurrency,
        "span_s": span,
        "submit_s": submitted,
        "jobs_per_s": len(prepared) / span,
    }


def _operator_writes(
    name: str, template: dict[str, Any], namespace: str = BOUND_NAMESPACE
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]], dict[str, Any], list[Any]]:
    """What the operator writes for a new TrainJob ``name`` of ``template`` in ``namespace``,
    from its own planner: the TrainJob, its children with their
    paths (every non-Pod child first), the status patch of its first reconcile and the Events
    (:class:`~trainjob_operator.reconcile.plan.Event`; their bodies name the TrainJob's uid,
    known once it exists)."""
    import datetime as dt

    from trainjob_operator.api import parse_trainjob
    from trainjob_operator.reconcile.state_machine import plan_trainjob
    from trainjob_operator.render import render_for_reconcile

    trainjob, children = _bound_children(name, template, namespace)
    children.sort(key=lambda item: item[1]["kind"] == "Pod")  # a Pod names its ServiceAccount
    obj = copy.deepcopy(trainjob)
    obj["metadata"]["uid"] = f"{name}-uid"
    plan = plan_trainjob(
        parse_trainjob(obj),
        obj["metadata"]["uid"],
        {},
        {},
        [],
        render_for_reconcile,
        dt.datetime.now(dt.UTC),
        generation=1,
    )
    if len(plan.create) != len(children):
        raise RuntimeError(
            f"the plan creates {len(plan.create)} children, the renderer made {len(children)}"
        )
    return trainjob, children, {"status": plan.status_patch()}, list(plan.events)


def bound_of_the_writes(
    api: Api, template: dict[str, Any], jobs: int, concurrency: int
) -> dict[str, Any]:
    """The bound of everything the operator makes the API server do for a new TrainJob, done
    by a client that takes no CPU and no time: the physical bound of this operator's work.

    As :func:`bound_with_trainjobs` (this process POSTs ``jobs`` TrainJobs back to back into
    :data:`BOUND_NAMESPACE`; ``concurrency`` threads POST each one's children as soon as it
    exists), and then, as the operator's first reconcile does, the TrainJob's status patch and
    its Event, all rendered and planned by the operator's own code before the clock starts.
    Two more watches stand for the operator's own (its TrainJobs, its pods), their events
    read and dropped. What is left out: the operator's CPU, its reads of the watch streams'
    events and its handler's queueing. TrainJobs per second from the first TrainJob POST to the
    last answer, as the burst's figure."""
    import datetime as dt

    from trainjob_operator.reconcile.apply import event_body

    writes = [_operator_writes(f"boundop-{i:04d}", template) for i in range(jobs)]
    operator_watches = [
        Watch(api, TRAINJOBS.format(ns=BOUND_NAMESPACE), {}, None),
        Watch(
            api, CHILD_KINDS["Pod"].format(ns=BOUND_NAMESPACE), {"labelSelector": NAME_LABEL}, None
        ),
    ]
    for w in operator_watches:
        w.start()

    def reconcile(created: dict[str, Any], rest: tuple[Any, dict[str, Any], list[Any]]) -> None:
        children, status_patch, events = rest
        for path, child in children:
            _check(*api.request("POST", path, child), f"POST {path}")
        name = created["metadata"]["name"]
        _check(
            *api.request(
                "PATCH",
                f"{TRAINJOBS.format(ns=BOUND_NAMESPACE)}/{name}/status",
                status_patch,
                "application/merge-patch+json",
            ),
            f"PATCH {name}/status",
        )
        for event in events:
            body = event_body(created, event, dt.datetime.now(dt.UTC))
            _check(
                *api.request("POST", f"/api/v1/namespaces/{BOUND_NAMESPACE}/events", body),
                "POST Event",
            )

    prepared = [
        (trainjob, (children, patch, events)) for trainjob, children, patch, events in writes
    ]
    try:
        result = _trainjobs_then(api, prepared, reconcile, concurrency)
    finally:
        for w in operator_watches:
            w.stop()
    errors = [str(w.error) for w in operator_watches if w.error is not None]
    if errors:
        raise RuntimeError(f"bound: watch errors {errors}")
    return {**result, "requests_per_job": 1 + len(writes[0][1]) + 1 + len(writes[0][3])}


def _print_bound(what: str, bound: dict[str, Any]) -> None:
    print(
        f"[operator] {what} = {bound['jobs_per_s']:.1f} TrainJobs/s; the operator's burst is "
        f"{common.fmt(bound['operator_ratio'], 3)} of it",
        flush=True,
    )


def expected_children(template: dict[str, Any]) -> dict[str, int]:
    """What the operator's renderer makes for one TrainJob of this manifest, by kind."""
    from trainjob_operator.api import parse_trainjob
    from trainjob_operator.render import render_for_reconcile

    obj = _job_body("probe", template)
    obj["metadata"]["uid"] = "probe-uid"
    counts: dict[str, int] = {}
    for m in render_for_reconcile(parse_trainjob(obj), "probe-uid", 0, 0):
        counts[m["kind"]] = counts.get(m["kind"], 0) + 1
    return counts


#: ``trainjob operator`` as the operator image runs it: the image has the core install only
#: (pyproject's ``dependencies``), without the Kubernetes client libraries that this
#: environment has for its tests. kopf imports them at start when they are installed (for
#: ``isinstance`` checks on client objects, which the operator never hands it): with
#: ``kubernetes`` importable the operator's idle RSS was 106 MiB instead of 57 MiB.
AS_IN_THE_IMAGE = (
    "import sys\n"
    "for name in ('kubernetes', 'kubernetes_asyncio', 'pykube'):\n"
    "    sys.modules[name] = None  # absent: import raises ImportError\n"
    "from trainjob_operator.cli import main\n"
    "sys.argv[0] = 'trainjob'\n"
    "sys.exit(main())\n"
)


def start_operator(
    env: Any, workdir: Path, prelude: str = ""
) -> tuple[subprocess.Popen[bytes], int, Path]:
    """``trainjob operator --namespace bench`` as a subprocess; waits for its liveness probe.
    ``prelude``: Python run in the operator's process before it starts (a profiler's hook)."""
    from tests.support.ports import free_port

    kubeconfig = env.write_kubeconfig(workdir / "kubeconfig")
    live_port, metrics_port = free_port(), free_port()
    log_path = workdir / "operator.log"
    log = log_path.open("wb")
    cmd = [
        sys.executable,
        "-c",
        prelude + AS_IN_THE_IMAGE,
        "operator",
        "--namespace",
        NAMESPACE,
        "--liveness",
        f"http://127.0.0.1:{live_port}/healthz",
        "--metrics-port",
        str(metrics_port),
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"operator exited ({proc.returncode}):\n{_tail(log_path)}")
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{live_port}/healthz", timeout=2) as r,
        ):
            if r.status == 200:
                break
        if time.monotonic() > deadline:
            raise RuntimeError(f"operator not live after 120 s:\n{_tail(log_path)}")
        time.sleep(0.5)
    return proc, metrics_port, log_path


def _tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _window(samples: list[dict[str, Any]], t0: float, t1: float) -> list[dict[str, Any]]:
    return [s for s in samples if t0 <= s["t"] <= t1]


def _cpu_shares(samples: list[dict[str, Any]], t0: float, t1: float) -> dict[str, float | None]:
    """Cores each sampled process used between ``t0`` and ``t1`` (1.0 = one core)."""
    if not samples:
        return {}
    window = _window(samples, t0, t1)
    return {k[len("cpu_") :]: _cpu_share(window, k) for k in samples[0] if k.startswith("cpu_")}


def _cpu_share(samples: list[dict[str, Any]], key: str) -> float | None:
    """CPU seconds per wall second of ``key`` over the samples (1.0 = one core)."""
    vals = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
    if len(vals) < 2 or vals[-1][0] <= vals[0][0]:
        return None
    return float((vals[-1][1] - vals[0][1]) / (vals[-1][0] - vals[0][0]))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """All three phases on one fresh API server and operator."""
    import yaml

    from tests.support import EnvTest, ensure_assets

    template = yaml.safe_load(MANIFEST.read_text())
    kinds = expected_children(template)
    n_children = sum(kinds.values())
    unknown = set(kinds) - set(CHILD_KINDS)
    if unknown:
        raise RuntimeError(f"the renderer makes kinds this benchmark does not watch: {unknown}")
    workdir = common.scratch_dir("operator")
    assets = ensure_assets()
    result: dict[str, Any] = {"children_per_job": kinds}
    with EnvTest(assets, controller_manager=False) as env:
        env.apply_crd(CRD)
        api = Api(env.host, env.token, str(env.ca_file))
        status, body = api.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}, "kind": "Namespace"}
        )
        if status != 201:
            raise RuntimeError(f"create namespace: HTTP {status}: {body}")
        status, body = api.request(
            "POST",
            "/api/v1/namespaces",
            {"metadata": {"name": BOUND_NAMESPACE}, "kind": "Namespace"},
        )
        if status != 201:
            raise RuntimeError(f"create namespace: HTTP {status}: {body}")
        tracker = Tracker(n_children)
        # The benchmark's own watches cover every namespace, so the bounds below, in their
        # own namespace, make the API server feed the same watchers as the operator's burst.
        watches = [
            Watch(api, _all_namespaces(p), {"labelSelector": NAME_LABEL}, tracker.on_child(k))
            for k, p in CHILD_KINDS.items()
            if k in kinds
        ]
        watches.append(Watch(api, _all_namespaces(TRAINJOBS), {}, tracker.on_trainjob))
        for w in watches:
            w.start()
        t_start = time.time()
        proc, metrics_port, log_path = start_operator(env, workdir)
        result["operator_start_s"] = time.time() - t_start
        # This process too: its watches and client share the 2 cores with the API server.
        pids = {"operator": proc.pid, "benchmark": os.getpid()}
        for p in env._procs:  # the apiserver's and etcd's CPU time (read-only use)
            pids[p.name.replace("-", "_")] = p.popen.pid
        sampler = Sampler(pids, tracker)
        time.sleep(2.0)  # let the operator settle after start-up
        idle = sampler.sample()
        sampler.start()
        phases: list[dict[str, Any]] = []
        marks: dict[str, float] = {}
        try:
            # 1. sequential
            seq = [f"seq-{i:04d}" for i in range(args.sequential)]
            marks["sequential_start"] = time.time()
            one_at_a_time(api, tracker, seq, template, args.timeout_s)
            phases.append(phase_figures(tracker, seq, "sequential"))
            print(_phase_line(phases[-1]), flush=True)
            # 2. burst
            burst = [f"burst-{i:04d}" for i in range(args.jobs)]
            marks["burst_start"] = time.time()
            sub = create_jobs(api, tracker, burst, template)
            ok = tracker.wait_done(burst, args.timeout_s)
            marks["burst_end"] = time.time()
            phases.append({**phase_figures(tracker, burst, "burst"), **sub, "all_done": ok})
            print(_phase_line(phases[-1]), flush=True)
            # The bound: the same children for as many TrainJobs, by a plain concurrent client,
            # on the same API server, right after the burst, once the operator is idle again
            # (its first timer ticks of the burst's TrainJobs, 5 s after each, done too).
            wait_quiet(metrics_port, args.timeout_s, quiet_s=3.0, timers_too=True)
            marks["bound_start"] = time.time()
            rate = phases[-1]["jobs_per_s"]
            # Then the same with the TrainJobs' own creates (an operator that costs nothing),
            # and with every write of the operator's (status, Event) and its watches.
            bounds = (
                (
                    "bound",
                    bound,
                    lambda b: (
                        f"bound: {b['creates']} creates by {b['concurrency']} threads in "
                        f"{b['span_s']:.2f} s"
                    ),
                ),
                (
                    "bound_with_trainjobs",
                    bound_with_trainjobs,
                    lambda b: (
                        f"bound with the TrainJob creates (their POSTs {b['submit_s']:.2f} s)"
                    ),
                ),
                (
                    "bound_of_the_writes",
                    bound_of_the_writes,
                    lambda b: (
                        f"bound of the operator's writes (the TrainJob POSTs {b['submit_s']:.2f} s)"
                    ),
                ),
            )
            for key, measure, describe in bounds:
                result[key] = measure(api, template, args.jobs, args.bound_concurrency)
                marks[f"{key}_end"] = time.time()
                result[key]["operator_ratio"] = rate / result[key]["jobs_per_s"] if rate else None
                _print_bound(describe(result[key]), result[key])
            # 3. scale up to --total, then steady state
            more = [f"scale-{i:04d}" for i in range(max(0, args.total - len(seq) - len(burst)))]
            marks["scale_start"] = time.time()
            sub = create_jobs(api, tracker, more, template)
            ok = tracker.wait_done(more, args.timeout_s)
            marks["scale_end"] = time.time()
            phases.append({**phase_figures(tracker, more, "scale"), **sub, "all_done": ok})
            print(_phase_line(phases[-1]), flush=True)
            # The operator may still be working through queued pod events: steady state
            # starts when no create/pod-triggered reconcile ran for a while.
            marks["quiet_wait_s"] = wait_quiet(metrics_port, args.timeout_s)
            metrics_before = scrape_metrics(metrics_port)
            marks["settle_start"] = time.time()
            time.sleep(args.settle_s)
            marks["settle_end"] = time.time()
            metrics = scrape_metrics(metrics_port)
            # 3b. one at a time again, now that --total others exist: what a new TrainJob
            # waits for its children on a loaded cluster (phase 1's figure, at scale).
            probe = [f"probe-{i:04d}" for i in range(args.probe)]
            marks["probe_start"] = time.time()
            one_at_a_time(api, tracker, probe, template, args.timeout_s)
            marks["probe_end"] = time.time()
            if probe:
                phases.append(phase_figures(tracker, probe, f"one at a time at {args.total}"))
                print(_phase_line(phases[-1]), flush=True)
            # 4. drivers at work: progress updates of --running TrainJobs
            if args.running and args.running_s > 0:
                marks["running_start"] = time.time()
                result["running"] = driver_updates(
                    api, [*seq, *burst, *more][: args.running], args.running_s
                )
                marks["running_end"] = time.time()
                metrics_running = scrape_metrics(metrics_port)
                result["running"]["reconciles_per_s"] = {
                    key.split('"')[1]: (metrics_running.get(key, 0.0) - metrics.get(key, 0.0))
                    / (marks["running_end"] - marks["running_start"])
                    for key in metrics_running
                    if key.startswith("trainjob_reconciles_total{")
                }
        finally:
            sampler.stop()
            for w in watches:
                w.stop()
            alive = proc.poll() is None
            _stop(proc)
            log_tail = _tail(log_path, 20)
        errors = [str(w.error) for w in watches if w.error is not None]
        if errors or not alive:
            raise RuntimeError(f"watch errors {errors}, operator alive {alive}:\n{log_tail}")
        result["request_costs"] = request_costs(env, api)
        result["write_costs"] = write_costs(env, api, template, args.jobs, args.bound_concurrency)
    common.rmtree(workdir)

    samples = sampler.samples
    settle = _window(samples, marks["settle_start"], marks["settle_end"])
    settle_s = marks["settle_end"] - marks["settle_start"]
    steady: dict[str, float | None] = {
        key.split('"')[1]: (metrics.get(key, 0.0) - metrics_before.get(key, 0.0)) / settle_s
        for key in metrics
        if key.startswith("trainjob_reconciles_total{")
    }
    n_rec = metrics.get("trainjob_reconcile_seconds_count", 0.0) - metrics_before.get(
        "trainjob_reconcile_seconds_count", 0.0
    )
    s_rec = metrics.get("trainjob_reconcile_seconds_sum", 0.0) - metrics_before.get(
        "trainjob_reconcile_seconds_sum", 0.0
    )
    with tracker.lock:
        total_jobs = len(tracker.created_at)
    result.update(
        {
            "phases": phases,
            "marks": marks,
            "total_jobs": total_jobs,
            "rss_idle_mib": idle["rss_mib"],
            "rss_after_burst_mib": next(
                (s["rss_mib"] for s in samples if s["t"] >= marks["burst_end"]), None
            ),
            "rss_at_total_mib": common.median([s["rss_mib"] for s in settle]) if settle else None,
            "rss_peak_mib": max((s["hwm_mib"] for s in samples), default=None),
            "steady_cpu": {
                k[len("cpu_") :]: _cpu_share(settle, k) for k in samples[0] if k.startswith("cpu_")
            }
            if samples and settle
            else {},
            "burst_cpu": _cpu_shares(samples, marks["burst_start"], marks["burst_end"]),
            "bound_cpu": _cpu_shares(samples, marks["bound_start"], marks["bound_end"]),
            "bound_with_trainjobs_cpu": _cpu_shares(
                samples, marks["bound_end"], marks["bound_with_trainjobs_end"]
            ),
            "running_cpu": _cpu_shares(
                samples, marks.get("running_start", 0.0), marks.get("running_end", 0.0)
            ),
            "bound_of_the_writes_cpu": _cpu_shares(
                samples, marks["bound_with_trainjobs_end"], marks["bound_of_the_writes_end"]
            ),
            "metrics": metrics,
            # Reconciles per second by trigger while nothing changed (timers, mostly) and their
            # mean duration; each TrainJob's timer alone asks for 1 / 5 s.
            "steady_reconciles_per_s": steady,
            "steady_reconcile_mean_s": s_rec / n_rec if n_rec else None,
            "all_reconcile_mean_s": (
                metrics.get("trainjob_reconcile_seconds_sum", 0.0)
                / metrics["trainjob_reconcile_seconds_count"]
                if metrics.get("trainjob_reconcile_seconds_count")
                else None
            ),
            "samples": [
                {k: v for k, v in s.items() if k in ("t", "rss_mib", "created", "done")}
                for s in samples
            ],
        }
    )
    if result["rss_at_total_mib"] is not None:
        result["rss_per_job_kib"] = (
            (result["rss_at_total_mib"] - result["rss_idle_mib"]) * 1024 / max(total_jobs, 1)
        )
    return result


def _phase_line(ph: dict[str, Any]) -> str:
    rate = ph.get("jobs_per_s")
    return (
        f"[operator] {ph['phase']}: {ph['completed']}/{ph['jobs']} TrainJobs, children p50 "
        f"{ph['p50_s']:.3f} s p99 {ph['p99_s']:.3f} s max {ph['max_s']:.3f} s; status p50 "
        f"{common.fmt(ph['status_p50_s'], 3)} s; "
        f"{'n/a' if rate is None else f'{rate:.1f}'} TrainJobs/s"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller phases")
    parser.add_argument("--sequential", type=int, help="one-at-a-time TrainJobs (20; 5 quick)")
    parser.add_argument("--jobs", type=int, help="TrainJobs in the burst (200; 100 quick)")
    parser.add_argument("--total", type=int, help="TrainJobs at the end (1000; 250 quick)")
    parser.add_argument("--settle-s", type=float, help="steady state at --total (30 s; 10 quick)")
    parser.add_argument(
        "--probe",
        type=int,
        help="one-at-a-time TrainJobs once --total exist (as --sequential; 0: none)",
    )
    parser.add_argument(
        "--name", default=NAME, help="the result's name (benchmarks/results/NAME.json)"
    )
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per phase")
    parser.add_argument(
        "--bound-concurrency", type=int, default=8, help="threads of the bound's plain client"
    )
    parser.add_argument(
        "--running",
        type=int,
        default=100,
        help="TrainJobs whose driver publishes progress in the last phase (100)",
    )
    parser.add_argument(
        "--running-s", type=float, help="length of that phase (30 s; 10 quick; 0: none)"
    )
    args = parser.parse_args(argv)
    args.sequential = args.sequential if args.sequential is not None else (5 if args.quick else 20)
    args.jobs = args.jobs if args.jobs is not None else (100 if args.quick else 200)
    args.total = args.total if args.total is not None else (250 if args.quick else 1000)
    args.settle_s = args.settle_s if args.settle_s is not None else (10.0 if args.quick else 30.0)
    args.probe = args.probe if args.probe is not None else args.sequential
    args.running_s = (
        args.running_s if args.running_s is not None else (10.0 if args.quick else 30.0)
    )

    common.setup_paths()
    # A stopped benchmark (SIGTERM, as run_all's caller or a user sends) unwinds through its
    # finally blocks: the operator process and the API server stop with it instead of running
    # on (an operator left at 10,000 TrainJobs took a core from whatever ran next).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    result = run(args)
    print(
        f"[operator] RSS idle {result['rss_idle_mib']:.1f} MiB, at {result['total_jobs']} "
        f"TrainJobs {common.fmt(result['rss_at_total_mib'], 1)} MiB (peak "
        f"{common.fmt(result['rss_peak_mib'], 1)} MiB); steady CPU {result['steady_cpu']}",
        flush=True,
    )
    running = result.get("running")
    if running:
        print(
            f"[operator] {running['trainjobs']} drivers at work: {running['patches']} progress "
            f"patches in {running['span_s']:.1f} s; reconciles/s {running['reconciles_per_s']}",
            flush=True,
        )
    for key in (
        "burst_cpu",
        "bound_cpu",
        "bound_with_trainjobs_cpu",
        "bound_of_the_writes_cpu",
        "running_cpu",
    ):
        shares = ", ".join(f"{k} {common.fmt(v, 2)}" for k, v in result[key].items())
        print(f"[operator] cores used, {key[: -len('_cpu')]}: {shares}", flush=True)
    for what, row in result["write_costs"].items():
        print(
            f"[operator] {what}: kube-apiserver {row['kube_apiserver_ms']:.2f} ms, etcd "
            f"{row['etcd_ms']:.2f} ms of CPU per write ({row['per_s']:.0f}/s)",
            flush=True,
        )
    data = {
        "params": {
            "sequential": args.sequential,
            "jobs": args.jobs,
            "total": args.total,
            "settle_s": args.settle_s,
            "probe": args.probe,
            "bound_concurrency": args.bound_concurrency,
            "manifest": str(MANIFEST.relative_to(common.REPO_ROOT)),
            "timer_interval_s": 5.0,
            "controller_manager": False,
            "k8s_version": "1.20.2",
            "quick": args.quick,
        },
        "ray_train": "not applicable (no operator in Ray Train)",
        **result,
    }
    common.write_result(args.name, data)
    return data


if __name__ == "__main__":
    main()
