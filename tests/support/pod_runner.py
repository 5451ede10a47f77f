"""A test "kubelet": run the Pods of a namespace as local processes and report their status.

There is no kubelet (and no scheduler) next to the test kube-apiserver of
:mod:`tests.support.envtest`, so Pods stay ``Pending`` forever. :class:`PodRunner` plays both
for one namespace: it binds each new Pod to its node (``pods/binding``, like the
scheduler), starts the Pod's container command as a process of this machine with the Pod's
environment, reports the Pod's life through the ``pods/status`` subresource (``Pending`` ->
``Running`` with ``podIP``, the ``Ready`` condition from the readiness probe -> ``Succeeded`` /
``Failed`` with the exit code), and stops the processes when the Pod is deleted (``SIGTERM``,
then ``SIGKILL`` after the grace period, then it confirms the deletion with a zero grace period,
as a kubelet does). Example::

    with EnvTest(ensure_assets()) as env:
        config = KubeConfig(host=env.host, token=env.token, ca_file=str(env.ca_file))
        with PodRunner(config, "my-namespace") as runner:
            ...  # create Pods (or let an operator create them): they run here
            runner.logs("my-pod")  # like kubectl logs

What a Pod gets, compared with a real node:

Image
    The image is ignored: every container runs on this machine, with ``image_env`` as the
    image's environment (by default ``PATH`` starting with this Python's ``bin`` folder, so
    ``python`` and ``ray`` are this virtualenv's) and ``workdir`` as its working directory
    (``workingDir`` wins). ``command`` + ``args`` are run as given (a container without a
    ``command`` cannot be started: the image's entrypoint is unknown). Exactly one container
    and no init containers are supported; other Pods are reported ``Failed``.
Environment
    ``env`` and ``envFrom`` are resolved as a kubelet does: literal values with ``$(VAR)``
    expansion (``$$`` escapes), ``fieldRef`` (``metadata.name``/``namespace``/``uid``,
    ``metadata.labels['k']``/``annotations['k']``, ``spec.nodeName``,
    ``spec.serviceAccountName``, ``status.podIP``/``podIPs``/``hostIP``), ``resourceFieldRef``
    (limits/requests of cpu and memory, with ``divisor``), ``configMapKeyRef`` and
    ``secretKeyRef`` (read from the API); ``$(VAR)`` references in ``command``/``args`` are
    expanded too. The container runtime's ``HOSTNAME`` is the Pod's ``spec.hostname`` (else
    its name); ``HOME`` is a private folder.
Isolation (``isolate``)
    With isolation (the default where :func:`namespaces_available`: util-linux ``unshare``, and
    root or unprivileged user namespaces), each container runs as PID 1 of its own PID
    namespace with its own ``/proc``, and its own ``/tmp`` (a private folder mounted there in a
    new mount namespace), as in a real container: programs that look for "their" processes
    (``ray.init`` finds the local raylet with ``ps``) see only the Pod's, files under ``/tmp``
    (Ray's sessions and sockets) do not collide, and when the main process exits the kernel
    kills the rest. Without isolation the containers share this machine's process table, and
    ``TMPDIR`` points at the private folder instead (Ray nodes other than the head still use the
    head's temp folder then, so Ray Pods started at the same moment can collide).
ServiceAccount token
    Unless ``automountServiceAccountToken`` is false, the runner asks the API server for a token
    of the Pod's ServiceAccount bound to the Pod (``TokenRequest``, what the kubelet mounts at
    ``/var/run/secrets/kubernetes.io/serviceaccount``), so the process acts with exactly the
    RBAC rights of that account. The runner does not create that path on this machine; it
    writes the token, ``ca.crt`` and ``namespace`` to a private folder plus a kubeconfig using
    them, and sets ``KUBECONFIG`` (``KUBERNETES_SERVICE_HOST`` is not set, so clients such as
    :meth:`trainjob_operator.kube.KubeConfig.load` use that kubeconfig).
Network
    Every Pod shares this machine's network: its IP is ``127.0.0.1``. Several Pods declare the
    same ports, and other programs on the machine may already use them (Ray's 6379 or 8265), so
    each port a Pod declares (``containerPorts``) is mapped to a free port of this machine, as
    ``docker run -p`` does, and the runner stands in for cluster DNS by rewriting what it
    launches (never the API objects): in ``command``, ``args`` and env values a Pod's stable
    DNS name ``<hostname>.<subdomain>`` (``subdomain`` being a Service of the namespace;
    optionally followed by ``.<namespace>``, ``.svc`` and ``.cluster.local``) becomes
    ``127.0.0.1`` and ``<name>:<port>`` becomes ``127.0.0.1:<mapped port>``; in a Pod's own
    ``command``/``args``, a ``--...port=<containerPort>`` flag (or ``--...port <containerPort>``)
    gets the mapped port too. Mappings are per stable name, so a Pod recreated under the same
    name gets the same ports. :meth:`PodRunner.host_port` tells a test where a port is.
Scheduling and resources
    The runner is one node that fits every Pod: ``nodeSelector``, affinity, tolerations,
    resources, volumes and security contexts are not enforced. Probes: ``tcpSocket``,
    ``httpGet`` and ``exec`` readiness probes are run (``periodSeconds``,
    ``failureThreshold``, ``initialDelaySeconds``); a container without one is Ready once
    started. ``restartPolicy`` ``Always``/``OnFailure`` restart the container (no back-off).
Processes
    Every process of a container carries the environment variable :data:`MARKER_ENV` (a unique
    id per container), which is how the runner lists them (:meth:`PodRunner.processes`) and
    makes sure none survives the container, including daemons that left its session (``ray
    start`` without ``--block``). Deleting a Pod sends ``SIGTERM`` to the main process (as PID 1
    of a namespace it only gets signals it handles, as in a container) and ``SIGKILL`` to all
    after the grace period (capped by ``max_grace_seconds``). :meth:`PodRunner.stop` kills every
    process it started and reports the Pods whose containers were still running as ``Failed``
    (their containers are gone).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from tests.support.lifecycle import StartStop
from trainjob_operator.constants import now
from trainjob_operator.kube import ApiError, KubeClient, KubeConfig

__all__ = [
    "MARKER_ENV",
    "POD_IP",
    "PodProcess",
    "PodRunner",
    "container_argv",
    "default_image_env",
    "expand_env_refs",
    "namespaces_available",
]

logger = logging.getLogger(__name__)

POD_IP = "127.0.0.1"
"""``status.podIP`` and ``status.hostIP`` of every Pod the runner runs."""
MARKER_ENV = "TRAINJOB_POD_RUNNER_CONTAINER"
"""Set in every container's environment to a unique id; inherited by all its processes."""

_DEFAULT_GRACE_SECONDS = 30
_PROBE_TIMEOUT_SECONDS = 1.0
_TOKEN_SECONDS = 3600
_ENV_REF_RE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")
_FIELD_KEY_RE = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"


def default_image_env() -> dict[str, str]:
    """The environment every container starts from: this Python's ``bin`` first on ``PATH``."""
    return {
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin:/usr/bin:/bin"]),
        "LANG": "C.UTF-8",
    }


@dataclass(frozen=True)
class PodProcess:
    """A live process of a Pod's container."""

    pid: int
    cmdline: tuple[str, ...]

    @property
    def name(self) -> str:
        """The program name (``argv[0]``'s base name, or the title, e.g. ``ray::TrainWorker``)."""
        return os.path.basename(self.cmdline[0]) if self.cmdline else ""


def _now() -> str:
    return now()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quantity(value: Any) -> float:
    from trainjob_operator.api.quantity import parse_quantity

    return parse_quantity(value if isinstance(value, int) else str(value))


def expand_env_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined variables are replaced, ``$$`` is ``$``, and
    references to undefined variables are left as they are."""

    def sub(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _ENV_REF_RE.sub(sub, text)


# --------------------------------------------------------------------------------------------
# Containers: a PID and mount namespace per Pod, when this machine allows it
# --------------------------------------------------------------------------------------------

_namespaces_checked: bool | None = None


def _unshare_prefix() -> list[str]:
    """``unshare`` with a new PID namespace (own ``/proc``) and mount namespace; as non-root
    also a user namespace. ``--kill-child``: the container dies with ``unshare``."""
    unshare = shutil.which("unshare") or "unshare"
    user = ["--user", "--map-root-user"] if os.geteuid() != 0 else []
    return [
        unshare,
        *user,
        "--fork",
        "--pid",
        "--mount",
        "--mount-proc",
        "--propagation",
        "private",
        "--kill-child",
        "--",
    ]


def host_folders_under_tmp() -> list[str]:
    """The folders directly under ``/tmp`` that this process runs from (its virtualenv, its
    ``sys.path``, its working directory): a checkout in ``/tmp/x`` must stay visible to the
    containers it starts, whose own ``/tmp`` replaces the host's."""
    tmp = Path("/tmp").resolve()
    found = set()
    for raw in [sys.prefix, os.getcwd(), *sys.path]:
        if not raw:
            continue
        path = Path(raw).absolute()
        for candidate in {path, path.resolve()}:
            if candidate.is_relative_to(tmp) and candidate != tmp:
                found.add(str(tmp / candidate.relative_to(tmp).parts[0]))
    return sorted(found)


def container_argv(argv: list[str], tmp: Path, keep: list[str] | None = None) -> list[str]:
    """Run ``argv`` as a container: PID 1 of a new PID namespace with its own ``/proc``, and
    ``tmp`` mounted on ``/tmp`` in a new mount namespace.

    ``keep`` (default :func:`host_folders_under_tmp`): host folders directly under ``/tmp`` that
    stay visible at the same path inside the container (bound into ``tmp`` first). A folder
    holding ``tmp`` itself is left out.
    """
    private = Path(tmp).absolute()
    binds = []
    for folder in host_folders_under_tmp() if keep is None else keep:
        name = Path(folder).name
        if private.is_relative_to(Path(folder).absolute()):
            continue
        binds.append(
            f'mkdir -p "$0"/{shlex.quote(name)} && mount --bind {shlex.quote(folder)} '
            f'"$0"/{shlex.quote(name)} && '
        )
    script = "".join(binds) + 'mount --rbind "$0" /tmp && exec "$@"'
    return [*_unshare_prefix(), "/bin/sh", "-c", script, str(tmp), *argv]


def namespaces_available() -> bool:
    """Whether :func:`container_argv` works here (util-linux ``unshare``, and root or
    unprivileged user namespaces). Checked once."""
    global _namespaces_checked
    if _namespaces_checked is None:
        if sys.platform != "linux" or shutil.which("unshare") is None:
            _namespaces_checked = False
        else:
            with tempfile.TemporaryDirectory() as tmp:
                probe = container_argv(["/bin/sh", "-c", "test $$ = 1 && touch /tmp/ok"], Path(tmp))
                try:
                    done = subprocess.run(probe, capture_output=True, timeout=30, check=False)
                except (OSError, subprocess.TimeoutExpired):
                    _namespaces_checked = False
                else:
                    _namespaces_checked = done.returncode == 0 and (Path(tmp) / "ok").exists()
    return _namespaces_checked


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


# --------------------------------------------------------------------------------------------
# Processes, found by the marker in their environment
# --------------------------------------------------------------------------------------------


def _marked_pids(marker: str) -> list[int]:
    needle = f"{MARKER_ENV}={marker}".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                data = f.read()
        except OSError:  # gone, or someone else's process
            continue
        if needle in data.split(b"\0"):
            pids.append(int(entry.name))
    return pids


def _cmdline(pid: int) -> tuple[str, ...]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return ()
    return tuple(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)


def _signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _kill_marked(marker: str, timeout: float = 10.0) -> None:
    """SIGKILL every process carrying ``marker`` until none is left (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = _marked_pids(marker)
        if not pids:
            return
        _signal_pids(pids, signal.SIGKILL)
        if time.monotonic() > deadline:
            logger.warning("processes %s of container %s survive SIGKILL", pids, marker)
            return
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# The pod network: stable names -> 127.0.0.1, declared ports -> free ports of this machine
# --------------------------------------------------------------------------------------------


class _Network:
    """Host ports standing in for the ports of the Pods' stable names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ports: dict[tuple[str, int], int] = {}

    def host_port(self, host: str, port: int) -> int:
        key = (host.lower(), int(port))
        with self._lock:
            if key not in self._ports:
                taken = set(self._ports.values())
                mapped = _free_port()
                while mapped in taken:
                    mapped = _free_port()
                self._ports[key] = mapped
            return self._ports[key]

    def rewrite_names(self, text: str, services: Iterable[str], namespace: str) -> str:
        """``<host>.<service>[.<ns>[.svc[.cluster.local]]][:<port>]`` -> ``127.0.0.1[:<mapped>]``
        (``<service>`` one of ``services``)."""
        names = sorted({s for s in services if s}, key=len, reverse=True)
        if not names:
            return text
        pattern = re.compile(
            rf"(?<![-.a-zA-Z0-9])({_DNS_LABEL})\.({'|'.join(map(re.escape, names))})"
            rf"(?:\.{re.escape(namespace)}(?:\.svc(?:\.cluster\.local)?)?)?\.?"
            r"(?::([0-9]{1,5}))?(?![-.a-zA-Z0-9])"
        )

        def sub(match: re.Match[str]) -> str:
            host = f"{match.group(1)}.{match.group(2)}"
            if match.group(3) is None:
                return POD_IP
            return f"{POD_IP}:{self.host_port(host, int(match.group(3)))}"

        return pattern.sub(sub, text)

    def rewrite_own_ports(self, argv: list[str], own: str, ports: Iterable[int]) -> list[str]:
        """A Pod's ``--...port=<containerPort>`` / ``--...port <containerPort>`` flags."""
        out = list(argv)
        for port in ports:
            mapped = str(self.host_port(own, port))
            flag = re.compile(rf"(--[-a-zA-Z0-9]*port=){port}(?![0-9])")
            for i, arg in enumerate(out):
                out[i] = flag.sub(rf"\g<1>{mapped}", arg)
                if (
                    arg == str(port)
                    and i > 0
                    and re.fullmatch(r"--[-a-zA-Z0-9]*port", out[i - 1]) is not None
                ):
                    out[i] = mapped
        return out


# --------------------------------------------------------------------------------------------
# One container
# --------------------------------------------------------------------------------------------


class _LaunchError(Exception):
    """The container cannot start (reported on the Pod) or cannot start yet (``retry``)."""

    def __init__(self, message: str, *, retry: bool = False, reason: str = "StartError") -> None:
        super().__init__(message)
        self.retry = retry
        self.reason = reason


@dataclass
class _Container:
    """The running (or exited) container of one Pod."""

    uid: str
    name: str
    own_host: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    probe: dict[str, Any] | None
    container_name: str
    image: str
    restart_policy: str
    grace_seconds: float
    scratch: Path
    log_dir: Path
    started_at: str = ""
    marker: str = ""
    popen: subprocess.Popen[bytes] | None = None
    log_file: IO[bytes] | None = None
    log_path: Path | None = None
    restarts: int = 0
    ready: bool = False
    exit_code: int | None = None
    finished_at: str = ""
    reported: str = ""
    probe_successes: int = 0
    probe_failures: int = 0
    next_probe: float = 0.0
    terminating_since: float | None = None
    kill_deadline: float = 0.0
    restart_at: float | None = None
    history: list[Path] = field(default_factory=list)


class PodRunner(StartStop):
    """Run the Pods of ``namespace`` on this machine (see the module docstring).

    Args:
        config: API server and admin credentials (binding Pods, their status, TokenRequests).
        namespace: the namespace whose Pods to run.
        image_env: the environment of every container before the Pod's own (the "image");
            default :func:`default_image_env`.
        workdir: working directory of containers without ``workingDir``; default the current
            directory.
        node_name: ``spec.nodeName`` the Pods are bound to.
        label_selector: only run Pods matching it.
        poll_interval: seconds between two looks at the namespace's Pods.
        max_grace_seconds: cap on ``terminationGracePeriodSeconds`` (tests need not wait 30s).
        isolate: run each container in its own PID and mount namespace (own ``/proc`` and
            ``/tmp``); default: when :func:`namespaces_available`. ``True`` raises
            ``RuntimeError`` where it is not.
    """

    def __init__(
        self,
        config: KubeConfig,
        namespace: str,
        *,
        image_env: Mapping[str, str] | None = None,
        workdir: str | os.PathLike[str] | None = None,
        node_name: str = "pod-runner",
        label_selector: str | None = None,
        poll_interval: float = 0.25,
        max_grace_seconds: float = 10.0,
        isolate: bool | None = None,
    ) -> None:
        self.config = config
        self.namespace = namespace
        self.image_env = dict(image_env if image_env is not None else default_image_env())
        self.workdir = str(workdir or os.getcwd())
        self.node_name = node_name
        self.label_selector = label_selector
        self.poll_interval = poll_interval
        self.max_grace_seconds = max_grace_seconds
        if isolate is None:
            isolate = namespaces_available()
        elif isolate and not namespaces_available():
            raise RuntimeError(
                "PodRunner(isolate=True) needs Linux PID and mount namespaces: util-linux "
                "unshare, run as root or with unprivileged user namespaces enabled"
            )
        self.isolate = isolate
        self.client = KubeClient(config)
        self.errors: list[str] = []
        """Unexpected errors of the background loop (a test may assert there are none)."""
        self._network = _Network()
        self._lock = threading.RLock()
        self._containers: dict[str, _Container] = {}  # by pod uid
        self._finished: dict[str, _Container] = {}  # exited and deleted, by pod uid
        self._launches: dict[str, int] = {}  # by pod name
        self._retry_after: dict[str, float] = {}  # pods whose launch must be retried
        self._scratch: dict[str, Path] = {}  # by pod uid
        self._waiting: dict[str, str] = {}  # why a pod cannot start yet, by pod uid
        self._counter = itertools.count()
        self._root: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PodRunner:
        """Start watching the namespace in a background thread."""
        if self._thread is not None:
            return self
        # Not under /tmp, which each container replaces with its own; short, because without
        # isolation Ray puts Unix sockets under TMPDIR (at most 107 bytes per path).
        parent = "/var/tmp" if os.path.isdir("/var/tmp") else None
        self._root = Path(tempfile.mkdtemp(prefix="podrun-", dir=parent))
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._thread.start()
        return self

    def stop(self, remove_files: bool = True) -> None:
        """Stop watching, kill every process started, report still-running Pods as Failed.

        Pods being deleted are confirmed deleted; the scratch folders and logs are removed
        unless ``remove_files`` is false.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            self._thread = None
        with self._lock:
            containers = list(self._containers.values())
            self._containers.clear()
            self._finished.update({c.uid: c for c in containers})
        for c in containers:
            self._kill_container(c)
            with contextlib.suppress(ApiError):
                pod = self._get_pod(c.name)
                if pod is None or pod["metadata"]["uid"] != c.uid:
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    self._confirm_deletion(pod)
                elif c.exit_code is None:
                    c.exit_code = 137
                    c.finished_at = _now()
                    self._patch_status(pod, c, "Failed", reason="PodRunnerStopped")
        if remove_files and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # -- what tests look at -------------------------------------------------------------------

    def launches(self, name: str) -> int:
        """How many containers were started for Pods named ``name`` (recreations included)."""
        with self._lock:
            return self._launches.get(name, 0)

    def running(self) -> list[str]:
        """Names of the Pods whose container is running now."""
        with self._lock:
            return sorted(
                c.name
                for c in self._containers.values()
                if c.popen is not None and c.exit_code is None
            )

    def logs(self, name: str, previous: bool = False) -> str:
        """The output of the Pod's current (or latest) container, like ``kubectl logs``.

        ``previous``: of the container before it (an earlier Pod with the same name, or the
        container before a restart).
        """
        with self._lock:
            paths = [
                p
                for c in itertools.chain(self._finished.values(), self._containers.values())
                if c.name == name
                for p in c.history
            ]
        paths.sort(key=lambda p: int(p.stem.rsplit("-", 1)[-1]))
        index = -2 if previous else -1
        if len(paths) < -index:
            raise KeyError(f"no {'previous ' if previous else ''}container logs for pod {name}")
        return paths[index].read_text(errors="replace")

    def processes(self, name: str) -> list[PodProcess]:
        """The live processes of the current container of Pod ``name``."""
        with self._lock:
            markers = [c.marker for c in self._containers.values() if c.name == name and c.marker]
        return [PodProcess(pid, _cmdline(pid)) for m in markers for pid in _marked_pids(m)]

    def all_processes(self) -> list[PodProcess]:
        """Every live process of every container this runner started (none after stop)."""
        with self._lock:
            markers = [
                c.marker
                for c in itertools.chain(self._containers.values(), self._finished.values())
                if c.marker
            ]
        return [PodProcess(pid, _cmdline(pid)) for m in markers for pid in _marked_pids(m)]

    @property
    def root(self) -> Path | None:
        """The folder with the containers' logs and scratch folders (None when stopped)."""
        return self._root

    def host_port(self, host: str, port: int) -> int:
        """The port of this machine that stands for ``<host>:<port>`` of the pod network."""
        return self._network.host_port(host, port)

    # -- the loop -----------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as exc:  # keep playing the kubelet; record it
                logger.exception("pod runner: sync failed")
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_interval)

    def _list_pods(self) -> list[dict[str, Any]]:
        return self.client.list("Pod", self.namespace, self.label_selector)

    def _get_pod(self, name: str) -> dict[str, Any] | None:
        return self.client.get("Pod", self.namespace, name)

    def _sync(self) -> None:
        pods = self._list_pods()
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            with self._lock:
                container = self._containers.get(uid)
            if container is None:
                self._admit(pod)
            else:
                self._tend(pod, container)
        with self._lock:
            gone = [c for uid, c in self._containers.items() if uid not in seen]
        for c in gone:  # deleted without grace (e.g. a finished Pod): stop what is left
            self._kill_container(c)
            self._forget(c)
        for uid in list(self._retry_after):
            if uid not in seen:
                self._retry_after.pop(uid, None)
                self._waiting.pop(uid, None)

    def _forget(self, c: _Container) -> None:
        with self._lock:
            self._containers.pop(c.uid, None)
            self._finished[c.uid] = c
        self._retry_after.pop(c.uid, None)

    # -- scheduling and starting --------------------------------------------------------------

    def _admit(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        status = pod.get("status") or {}
        uid = meta["uid"]
        node = spec.get("nodeName")
        if meta.get("deletionTimestamp"):
            if node == self.node_name:
                self._confirm_deletion(pod)  # bound here, never started: nothing to stop
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        if node and node != self.node_name:
            return  # another node's
        if node == self.node_name and uid not in self._retry_after and status.get("podIP"):
            # Started by an earlier runner: its container is gone with it.
            self._report_lost(pod)
            return
        if time.monotonic() < self._retry_after.get(uid, 0.0):
            return
        if not node:
            if not self._bind(pod):
                return
            self._patch_raw(
                pod,
                {
                    "phase": "Pending",
                    "conditions": [_condition("PodScheduled", True)],
                },
            )
        try:
            container = self._prepare(pod)
        except _LaunchError as exc:
            if exc.retry:  # like a kubelet: keep trying, say why on the Pod
                if self._waiting.get(uid) != str(exc):
                    logger.info("pod %s cannot start yet: %s", meta["name"], exc)
                    self._report_waiting(pod, str(exc))
                    self._waiting[uid] = str(exc)
                self._retry_after[uid] = time.monotonic() + 1.0
                return
            self._report_start_failure(pod, str(exc), exc.reason)
            return
        self._retry_after.pop(uid, None)
        self._waiting.pop(uid, None)
        with self._lock:
            self._containers[uid] = container
        self._launch(pod, container)

    def _bind(self, pod: dict[str, Any]) -> bool:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": meta["name"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self.client.request(
                "POST", f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}/binding", body
            )
        except ApiError as exc:
            if exc.status in (404, 409):  # gone, or bound meanwhile
                return False
            raise
        pod.setdefault("spec", {})["nodeName"] = self.node_name
        return True

    def _prepare(self, pod: dict[str, Any]) -> _Container:
        meta, spec = pod["metadata"], pod["spec"]
        containers = spec.get("containers") or []
        if len(containers) != 1 or spec.get("initContainers"):
            raise _LaunchError(
                "PodRunner runs pods with exactly one container and no init containers",
                reason="Unsupported",
            )
        container = containers[0]
        if not container.get("command"):
            raise _LaunchError(
                f"container {container.get('name')} has no command (the image's entrypoint "
                "is unknown to PodRunner)",
                reason="Unsupported",
            )
        assert self._root is not None
        scratch = self._scratch.get(meta["uid"])
        if scratch is None:
            scratch = self._scratch[meta["uid"]] = self._root / str(next(self._counter))
            for sub in ("tmp", "home", "serviceaccount"):
                (scratch / sub).mkdir(parents=True, exist_ok=True)
        own_host = _stable_name(pod)
        services = self._service_names(spec)
        defined = self._container_env(pod, container)
        argv = [
            expand_env_refs(str(a), defined)
            for a in [*container.get("command", []), *container.get("args", [])]
        ]
        argv = [self._network.rewrite_names(a, services, self.namespace) for a in argv]
        ports = [int(p["containerPort"]) for p in container.get("ports") or []]
        argv = self._network.rewrite_own_ports(argv, own_host, ports)
        env = dict(self.image_env)
        env.update(
            {
                k: self._network.rewrite_names(v, services, self.namespace)
                for k, v in defined.items()
            }
        )
        env["HOSTNAME"] = spec.get("hostname") or meta["name"]
        if not self.isolate:  # without its own /tmp, a container's temp folder
            env["TMPDIR"] = str(scratch / "tmp")
        env["HOME"] = str(scratch / "home")
        kubeconfig = self._mount_token(pod, scratch / "serviceaccount")
        if kubeconfig is not None:
            env["KUBECONFIG"] = str(kubeconfig)
        grace = spec.get("terminationGracePeriodSeconds", _DEFAULT_GRACE_SECONDS)
        return _Container(
            uid=meta["uid"],
            name=meta["name"],
            own_host=own_host,
            argv=argv,
            env=env,
            cwd=container.get("workingDir") or self.workdir,
            probe=container.get("readinessProbe"),
            container_name=container.get("name", "main"),
            image=container.get("image", ""),
            restart_policy=spec.get("restartPolicy", "Always"),
            grace_seconds=min(float(grace), self.max_grace_seconds),
            scratch=scratch,
            log_dir=self._root,
        )

    def _service_names(self, spec: Mapping[str, Any]) -> set[str]:
        try:
            names = {s["metadata"]["name"] for s in self.client.list("Service", self.namespace)}
        except ApiError as exc:
            raise _LaunchError(f"cannot list Services: {exc}", retry=True) from exc
        if spec.get("subdomain"):
            names.add(str(spec["subdomain"]))
        return names

    def _launch(self, pod: dict[str, Any], c: _Container) -> None:
        c.marker = uuid.uuid4().hex
        env = dict(c.env)
        env[MARKER_ENV] = c.marker
        with self._lock:
            self._launches[c.name] = self._launches.get(c.name, 0) + 1
            number = sum(self._launches.values())
        c.log_path = c.log_dir / f"{c.name}-{number}.log"
        c.history.append(c.log_path)
        c.log_file = c.log_path.open("ab")
        c.exit_code = None
        c.ready = False
        c.probe_successes = c.probe_failures = 0
        c.next_probe = time.monotonic() + float((c.probe or {}).get("initialDelaySeconds", 0))
        c.started_at = _now()
        argv = container_argv(c.argv, c.scratch / "tmp") if self.isolate else c.argv
        # Die with this process even when it is killed without cleanup (then, with isolation,
        # ``unshare --kill-child`` takes the whole container along). PR_SET_PDEATHSIG fires
        # when the forking thread exits: the runner's loop, which lives until stop().
        setpriv = shutil.which("setpriv")
        if setpriv:
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        try:
            c.popen = subprocess.Popen(
                argv,
                env=env,
                cwd=c.cwd,
                stdin=subprocess.DEVNULL,
                stdout=c.log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            c.log_file.write(f"PodRunner: cannot start {c.argv[:1]}: {exc}\n".encode())
            c.log_file.close()
            c.exit_code = 128
            c.finished_at = _now()
            self._report_start_failure(pod, f"cannot start {c.argv[:1]}: {exc}", "StartError")
            return
        logger.info("pod %s: started pid %d: %s", c.name, c.popen.pid, c.argv)
        if c.probe is None:
            c.ready = True
        self._patch_status(pod, c, "Running")

    def _container_env(self, pod: dict[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            if "configMapRef" in source:
                data = self._config_data("configmaps", source["configMapRef"])
            elif "secretRef" in source:
                data = self._config_data("secrets", source["secretRef"])
            else:
                continue
            env.update({prefix + k: v for k, v in data.items()})
        for var in container.get("env") or []:
            name = var["name"]
            if "valueFrom" in var:
                value = self._value_from(pod, container, var["valueFrom"])
                if value is None:
                    continue
                env[name] = value
            else:
                env[name] = expand_env_refs(str(var.get("value", "")), env)
        return env

    def _config_data(self, plural: str, ref: Mapping[str, Any]) -> dict[str, str]:
        try:
            obj = self.client.request(
                "GET", f"/api/v1/namespaces/{self.namespace}/{plural}/{ref['name']}"
            )
        except ApiError as exc:
            if exc.status == 404 and ref.get("optional"):
                return {}
            raise _LaunchError(f"{plural} {ref['name']}: {exc}", retry=True) from exc
        data: dict[str, str] = dict(obj.get("data") or {})
        if plural == "secrets":
            data = {k: base64.b64decode(v).decode() for k, v in data.items()}
        return data

    def _value_from(
        self, pod: dict[str, Any], container: Mapping[str, Any], source: Mapping[str, Any]
    ) -> str | None:
        meta, spec = pod["metadata"], pod["spec"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            simple = {
                "metadata.name": meta["name"],
                "metadata.namespace": meta.get("namespace", self.namespace),
                "metadata.uid": meta["uid"],
                "spec.nodeName": self.node_name,
                "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
                "status.hostIP": POD_IP,
                "status.podIP": POD_IP,
                "status.podIPs": POD_IP,
            }
            if path in simple:
                return str(simple[path])
            match = _FIELD_KEY_RE.match(path)
            if match:
                return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
            raise _LaunchError(f"fieldRef {path!r} is not supported", reason="Unsupported")
        if "resourceFieldRef" in source:
            ref = source["resourceFieldRef"]
            kind, _, resource = str(ref["resource"]).partition(".")
            target = container
            if ref.get("containerName"):
                target = next(
                    (c for c in spec["containers"] if c["name"] == ref["containerName"]),
                    container,
                )
            quantity = ((target.get("resources") or {}).get(kind) or {}).get(resource)
            if quantity is None:  # no limit: the node's capacity
                quantity = os.cpu_count() if resource == "cpu" else _memory_bytes()
            divisor = _quantity(ref.get("divisor", "1")) or 1.0
            return str(math.ceil(_quantity(quantity) / divisor))
        for key, plural in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if key in source:
                ref = source[key]
                data = self._config_data(plural, ref)
                if ref["key"] not in data:
                    if ref.get("optional"):
                        return None
                    raise _LaunchError(
                        f"{plural} {ref['name']} has no key {ref['key']}", retry=True
                    )
                return data[ref["key"]]
        raise _LaunchError(f"unsupported valueFrom {dict(source)}", reason="Unsupported")

    def _mount_token(self, pod: dict[str, Any], folder: Path) -> Path | None:
        """TokenRequest for the Pod's ServiceAccount; write it with a kubeconfig using it."""
        meta, spec = pod["metadata"], pod["spec"]
        if spec.get("automountServiceAccountToken") is False:
            return None
        account = spec.get("serviceAccountName") or "default"
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": _TOKEN_SECONDS,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        try:
            answer = self.client.request(
                "POST",
                f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
                body,
            )
        except ApiError as exc:  # e.g. the ServiceAccount is not there yet: the kubelet waits
            raise _LaunchError(f"no token for ServiceAccount {account}: {exc}", retry=True) from exc
        token = answer["status"]["token"]
        (folder / "token").write_text(token)
        (folder / "namespace").write_text(self.namespace)
        cluster: dict[str, Any] = {"server": self.config.host}
        if self.config.ca_file:
            shutil.copyfile(self.config.ca_file, folder / "ca.crt")
            cluster["certificate-authority"] = str(folder / "ca.crt")
        if self.config.insecure:
            cluster["insecure-skip-tls-verify"] = True
        # tokenFile for clients that re-read it, the token itself for those that do not.
        user = {"tokenFile": str(folder / "token"), "token": token}
        kubeconfig: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": cluster}],
            "users": [{"name": account, "user": user}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {"cluster": "cluster", "user": account, "namespace": self.namespace},
                }
            ],
            "current-context": "pod",
        }
        path = folder / "kubeconfig"
        path.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        for child in folder.iterdir():
            child.chmod(0o600)
        return path

    # -- running and stopping -----------------------------------------------------------------

    def _tend(self, pod: dict[str, Any], c: _Container) -> None:
        if pod["metadata"].get("deletionTimestamp"):
            self._terminate(pod, c)
            return
        if c.popen is None:
            return
        if c.exit_code is None:
            rc = c.popen.poll()
            if rc is not None:
                self._on_exit(pod, c, rc)
                return
            self._probe(pod, c)
        elif c.restart_at is not None and time.monotonic() >= c.restart_at:
            c.restart_at = None
            c.restarts += 1
            self._launch(pod, c)

    def _on_exit(self, pod: dict[str, Any], c: _Container, rc: int) -> None:
        c.exit_code = 128 - rc if rc < 0 else rc  # killed by a signal: 128 + signal
        c.finished_at = _now()
        c.ready = False
        if c.log_file is not None:
            c.log_file.close()
        _kill_marked(c.marker)  # the container is gone: so is everything it started
        logger.info("pod %s: container exited with %d", c.name, c.exit_code)
        policy = c.restart_policy
        if policy == "Always" or (policy == "OnFailure" and c.exit_code != 0):
            c.restart_at = time.monotonic() + 1.0
            self._patch_status(pod, c, "Running")
            return
        self._patch_status(pod, c, "Succeeded" if c.exit_code == 0 else "Failed")

    def _probe(self, pod: dict[str, Any], c: _Container) -> None:
        probe = c.probe
        if probe is None or time.monotonic() < c.next_probe:
            return
        period = float(probe.get("periodSeconds", 10))
        ok = self._run_probe(probe, c)
        if ok:
            c.probe_successes += 1
            c.probe_failures = 0
        else:
            c.probe_failures += 1
            c.probe_successes = 0
        was = c.ready
        if ok and c.probe_successes >= int(probe.get("successThreshold", 1)):
            c.ready = True
        elif not ok and c.probe_failures >= int(probe.get("failureThreshold", 3)):
            c.ready = False
        # Until the first success, look often (a kubelet would wait periodSeconds).
        c.next_probe = time.monotonic() + (period if c.ready else min(period, 1.0))
        if c.ready != was:
            self._patch_status(pod, c, "Running")

    def _run_probe(self, probe: Mapping[str, Any], c: _Container) -> bool:
        timeout = float(probe.get("timeoutSeconds", _PROBE_TIMEOUT_SECONDS))
        if "tcpSocket" in probe:
            port = self._probe_port(probe["tcpSocket"]["port"], c)
            try:
                with socket.create_connection((POD_IP, port), timeout=timeout):
                    return True
            except OSError:
                return False
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = self._probe_port(get["port"], c)
            url = f"http://{POD_IP}:{port}{get.get('path', '/')}"
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    return 200 <= int(resp.status) < 400
            except (urllib.error.URLError, OSError):
                return False
        if "exec" in probe:
            try:
                done = subprocess.run(
                    probe["exec"]["command"],
                    env={**c.env, MARKER_ENV: c.marker},
                    cwd=c.cwd,
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired):
                return False
            return done.returncode == 0
        return True

    def _probe_port(self, port: int | str, c: _Container) -> int:
        if isinstance(port, str) and not port.isdigit():
            pod = self._get_pod(c.name) or {}
            for container in (pod.get("spec") or {}).get("containers") or []:
                for declared in container.get("ports") or []:
                    if declared.get("name") == port:
                        return self._network.host_port(c.own_host, int(declared["containerPort"]))
            return 0
        return self._network.host_port(c.own_host, int(port))

    def _terminate(self, pod: dict[str, Any], c: _Container) -> None:
        """Graceful stop of a Pod being deleted: SIGTERM, SIGKILL after the grace period,
        then confirm the deletion."""
        running = c.popen is not None and c.popen.poll() is None
        if c.terminating_since is None:
            c.terminating_since = time.monotonic()
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            grace = c.grace_seconds if grace is None else min(float(grace), c.grace_seconds)
            c.kill_deadline = c.terminating_since + grace
            if running:
                main = self._main_pid(c)
                logger.info("pod %s deleted: SIGTERM to pid %d", c.name, main)
                _signal_pids([main], signal.SIGTERM)
        if running and time.monotonic() < c.kill_deadline:
            return
        self._kill_container(c)
        self._confirm_deletion(pod)
        self._forget(c)

    def _main_pid(self, c: _Container) -> int:
        """The container's main process: PID 1 of its namespace (``unshare``'s child)."""
        assert c.popen is not None
        if self.isolate:
            children = _children(c.popen.pid)
            if children:
                return children[0]
        return c.popen.pid

    def _kill_container(self, c: _Container) -> None:
        if c.popen is not None and c.popen.poll() is None:
            # PID 1 of a PID namespace takes everything in it along.
            _signal_pids([self._main_pid(c)], signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.popen.pid, signal.SIGKILL)
        if c.marker:
            _kill_marked(c.marker)
        if c.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.popen.wait(10)
            if c.exit_code is None and c.popen.returncode is not None:
                rc = c.popen.returncode
                c.exit_code = 128 - rc if rc < 0 else rc
        if c.log_file is not None and not c.log_file.closed:
            c.log_file.close()

    def _confirm_deletion(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        try:
            self.client.request(
                "DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}", body
            )
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone, or a new Pod with that name
                raise

    # -- status -------------------------------------------------------------------------------

    def _patch_raw(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        try:
            self.client.patch(
                "Pod", self.namespace, pod["metadata"]["name"], {"status": status}, "status"
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    def _patch_status(
        self, pod: dict[str, Any], c: _Container, phase: str, reason: str | None = None
    ) -> None:
        ready = c.ready and phase == "Running" and c.exit_code is None
        if c.exit_code is None:
            state: dict[str, Any] = {"running": {"startedAt": c.started_at}}
        elif c.restart_at is not None:
            state = {"waiting": {"reason": "CrashLoopBackOff"}}
        else:
            state = {
                "terminated": {
                    "exitCode": c.exit_code,
                    "reason": reason or ("Completed" if c.exit_code == 0 else "Error"),
                    "startedAt": c.started_at,
                    "finishedAt": c.finished_at or _now(),
                }
            }
        status = {
            "phase": phase,
            "hostIP": POD_IP,
            "podIP": POD_IP,
            "podIPs": [{"ip": POD_IP}],
            "startTime": (pod.get("status") or {}).get("startTime") or c.started_at,
            "conditions": [
                _condition("PodScheduled", True),
                _condition("Initialized", True),
                _condition("ContainersReady", ready),
                _condition("Ready", ready),
            ],
            "containerStatuses": [
                _container_status(
                    c.container_name, state, image=c.image, ready=ready, restarts=c.restarts
                )
                | {"started": c.exit_code is None}
            ],
        }
        if reason:
            status["reason"] = reason
        key = json.dumps(
            {k: v for k, v in status.items() if k != "conditions"} | {"ready": ready},
            sort_keys=True,
        )
        if key == c.reported:
            return
        self._patch_raw(pod, status)
        c.reported = key

    def _report_start_failure(self, pod: dict[str, Any], message: str, reason: str) -> None:
        name = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", "main")
        now = _now()
        self._patch_raw(
            pod,
            {
                "phase": "Failed",
                "reason": reason,
                "message": message,
                "hostIP": POD_IP,
                "conditions": [_condition("PodScheduled", True), _condition("Ready", False)],
                "containerStatuses": [
                    _container_status(
                        name,
                        {
                            "terminated": {
                                "exitCode": 128,
                                "reason": reason,
                                "message": message,
                                "startedAt": now,
                                "finishedAt": now,
                            }
                        },
                    )
                ],
            },
        )

    def _report_waiting(self, pod: dict[str, Any], message: str) -> None:
        name = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", "main")
        self._patch_raw(
            pod,
            {
                "phase": "Pending",
                "conditions": [_condition("PodScheduled", True), _condition("Ready", False)],
                "containerStatuses": [
                    _container_status(
                        name,
                        {"waiting": {"reason": "CreateContainerConfigError", "message": message}},
                    )
                ],
            },
        )

    def _report_lost(self, pod: dict[str, Any]) -> None:
        self._patch_raw(
            pod,
            {
                "phase": "Failed",
                "reason": "PodRunnerRestarted",
                "message": "the pod runner that ran this pod's container is gone",
                "conditions": [_condition("PodScheduled", True), _condition("Ready", False)],
            },
        )


def _container_status(
    name: str, state: dict[str, Any], *, image: str = "", ready: bool = False, restarts: int = 0
) -> dict[str, Any]:
    """One entry of ``status.containerStatuses`` as a kubelet reports it."""
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": ready,
        "restartCount": restarts,
        "state": state,
    }


def _condition(type_: str, true: bool) -> dict[str, Any]:
    return {"type": type_, "status": "True" if true else "False", "lastTransitionTime": _now()}


def _stable_name(pod: Mapping[str, Any]) -> str:
    """``<hostname>.<subdomain>`` when the Pod has both, else its name."""
    meta, spec = pod["metadata"], pod.get("spec") or {}
    hostname = spec.get("hostname") or meta["name"]
    if spec.get("subdomain"):
        return f"{hostname}.{spec['subdomain']}"
    return str(hostname)


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
