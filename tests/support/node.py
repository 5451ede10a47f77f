"""A real single-node Kubernetes 1.20 cluster for tests: containerd, a kubelet, real containers.

Where :mod:`tests.support.envtest` gives an API server without nodes, :class:`Node` runs a whole
cluster on this machine, the way ``kind`` does without Docker: etcd, kube-apiserver,
kube-controller-manager (every default controller), kube-scheduler, containerd (CRI, runc,
cgroupfs), a kubelet, kube-proxy (iptables mode) and a DNS stand-in, all in a network namespace
of their own. Pods are real containers of images built from the repository's ``Dockerfile``
(``scripts/build-images.sh``) and imported into the node's containerd; nothing is pulled.

Provisioning (root, Debian bookworm): :func:`provision_host` runs ``scripts/provision-node.sh``
(packages, kubectl 1.20, the pause and base images, cached in
``${TRAINJOB_NODE_CACHE:-~/.cache/trainjob-operator/node}``), :func:`build_images` runs
``scripts/build-images.sh`` (images keyed by a hash of their inputs); the Kubernetes binaries
come from :func:`tests.support.envtest.ensure_assets`.

Network
    Everything runs in the network namespace ``trainjob-node-<pid>`` (``nsenter --net``; not
    ``ip netns exec``, whose private mount namespace would hide the kubelet's secret mounts from
    containerd). The node's address :data:`NODE_IP` sits on a veth whose peer stays down (what
    is sent there goes nowhere), which also carries the namespace's default route; pods get
    addresses of
    :data:`POD_CIDR` on a CNI bridge, Services of :data:`SERVICE_CIDR`. Those ranges exist only
    in that namespace: no route leaves it and nothing is masqueraded out. The tests reach the API
    server (and any Service or pod, :meth:`Node.forward`) through a pair of ``socat`` processes:
    one listens on 127.0.0.1 here, the other connects inside the namespace, joined by a Unix
    socket in the node's folder.
DNS
    There is no CoreDNS in Debian or PyPI: ``dnsmasq`` answers for ``cluster.local`` from a
    folder of hosts files that a watch of Services and Endpoints keeps current (what CoreDNS's
    kubernetes plugin serves: ``<svc>.<ns>.svc.cluster.local`` -> the ClusterIP, or for a
    headless Service its ready endpoints, and ``<hostname>.<svc>.<ns>.svc.cluster.local`` for
    endpoints with a hostname). It sits behind the ``kube-system/kube-dns`` Service
    (:data:`DNS_SERVICE_IP`, the kubelet's ``clusterDNS``), whose Endpoints point at it.
Machine-specific settings (DESIGN.md, "A real node")
    containerd: ``SystemdCgroup = false`` (cgroup v1 with cgroupfs) and
    ``restrict_oom_score_adj = true`` (root may lack CAP_SYS_RESOURCE, so no ``oom_score_adj``
    can be lowered); kube-apiserver ``--kubelet-preferred-address-types=InternalIP``; the kubelet
    rewrites global sysctls (``vm.overcommit_memory``, ``kernel.panic``...): they are saved
    before and restored after (and restored by the next session after a crash). The kubelet runs
    with ``cpuCFSQuota: false``: CPU limits are scheduling figures only, so pods sized to fit on
    this small node are not throttled to a fraction of a core.
Tear-down
    Pods are deleted through the API and the kubelet stops them; then the kubelet stops (before
    anything kills containers, or it would recreate them), every remaining task is killed, and
    the processes, the namespace and the session folder go. containerd's image store stays in the
    cache (``containerd/``), so images are imported once per content hash.

Example::

    assets = ensure_assets()
    cache = provision_host()
    images = build_images()
    with Node(assets, cache, images.values()) as node:
        node.kubectl("get", "nodes")
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import yaml
from kubernetes import client as k8s_client
from kubernetes import watch as k8s_watch

from tests.support.envtest import (
    EnvTestError,
    _http_get,
    _tail,
    _write_rsa_key_pair,
)
from tests.support.lifecycle import StartStop
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parents[2]
NODE_CACHE_ENV = "TRAINJOB_NODE_CACHE"
KEEP_ENV = "TRAINJOB_NODE_KEEP"
IMAGES_ENV = "TRAINJOB_NODE_IMAGES"

NODE_NAME = "trainjob-node"
NODE_IP = "10.250.0.2"
POD_CIDR = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"
DNS_SERVICE_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
API_PORT = 6443
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
"""Global sysctls the kubelet sets at startup (``setupKernelTunables``), saved and restored."""

CNI_BIN_DIR = "/usr/lib/cni"
"""Where Debian's containernetworking-plugins puts the plugins."""

_LOG_TAIL_LINES = 40


class NodeError(EnvTestError):
    """Provisioning, starting or stopping the node failed."""


# --------------------------------------------------------------------------------------------
# Provisioning
# --------------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``${TRAINJOB_NODE_CACHE:-~/.cache/trainjob-operator/node}``."""
    env = os.environ.get(NODE_CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "trainjob-operator" / "node"


def unsupported_reason() -> str | None:
    """Why this machine cannot run the node (None when it can, possibly after provisioning)."""
    if sys.platform != "linux":
        return "the real-node tier needs Linux"
    if os.geteuid() != 0:
        return "the real-node tier needs root (containerd, network namespaces, cgroups)"
    if shutil.which("apt-get") is None and shutil.which("containerd") is None:
        return "the real-node tier is provisioned with apt-get (Debian bookworm)"
    for tool in ("nsenter", "ip", "flock"):
        if shutil.which(tool) is None:
            return f"{tool} not found"
    if not Path("/sys/fs/cgroup/memory").is_dir():
        return "the real-node tier expects cgroup v1 (cgroupfs) with the memory controller"
    return None


def _run_script(args: list[str], output: TextIO | None, timeout: float) -> str:
    """Run a provisioning script, streaming its stderr+stdout; return its last stdout line."""
    out = output if output is not None else sys.stderr
    tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL_LINES)
    proc = subprocess.Popen(
        ["bash", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        cwd=REPO,
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.daemon = True
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line)
            out.write(line)
            out.flush()
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        raise NodeError(f"{' '.join(args)} failed ({rc}); last lines:\n{''.join(tail)}")
    return tail[-1].strip() if tail else ""


def provision_host(output: TextIO | None = None, timeout: float = 1800.0) -> Path:
    """``scripts/provision-node.sh``: packages, kubectl, the pause and base images (cached)."""
    return Path(_run_script([str(REPO / "scripts" / "provision-node.sh")], output, timeout))


@dataclass(frozen=True)
class Image:
    """An image built by ``scripts/build-images.sh``."""

    key: str
    name: str
    archive: Path
    size: int


def build_images(
    output: TextIO | None = None, *, jax: bool = False, timeout: float = 3600.0
) -> dict[str, Image]:
    """``scripts/build-images.sh``: key (``operator``, ``runtime``, ``examples``, ``fake-gcs``,
    ``runtime-jax``) -> image; builds only what its cache lacks.

    ``$TRAINJOB_NODE_IMAGES`` set to an ``images.json`` of an earlier build: those images, as
    they are (while iterating on tests; the images then lag behind the sources)."""
    if os.environ.get(IMAGES_ENV):
        manifest = Path(os.environ[IMAGES_ENV])
    else:
        args = [str(REPO / "scripts" / "build-images.sh"), "--python", sys.executable]
        if jax:
            args.append("--jax")
        manifest = Path(_run_script(args, output, timeout))
    data = json.loads(manifest.read_text())
    return {
        key: Image(key, entry["image"], Path(entry["archive"]), int(entry["size"]))
        for key, entry in data.items()
    }


# --------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------


def _write_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and the API server's serving certificate (for every name it is reached by)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "trainjob-node-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    names: list[x509.GeneralName] = [
        x509.DNSName(n)
        for n in (
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{CLUSTER_DOMAIN}",
            "localhost",
        )
    ]
    names += [
        x509.IPAddress(ipaddress.ip_address(ip)) for ip in ("127.0.0.1", NODE_IP, API_SERVICE_IP)
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = folder / "ca.crt"
    cert_file = folder / "apiserver.crt"
    key_file = folder / "apiserver.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return ca_file, cert_file, key_file


# --------------------------------------------------------------------------------------------
# DNS stand-in
# --------------------------------------------------------------------------------------------


def dns_records(service: Mapping[str, Any], endpoints: Mapping[str, Any] | None) -> list[str]:
    """The hosts-file lines CoreDNS's kubernetes plugin would answer for one Service."""
    meta = service["metadata"]
    fqdn = f"{meta['name']}.{meta['namespace']}.svc.{CLUSTER_DOMAIN}"
    cluster_ip = (service.get("spec") or {}).get("clusterIP")
    if cluster_ip and cluster_ip != "None":
        return [f"{cluster_ip} {fqdn}"]
    lines: list[str] = []
    for subset in (endpoints or {}).get("subsets") or []:
        for address in subset.get("addresses") or []:
            ip = address.get("ip")
            if not ip:
                continue
            lines.append(f"{ip} {fqdn}")
            if address.get("hostname"):
                lines.append(f"{ip} {address['hostname']}.{fqdn}")
    return sorted(set(lines))


class DnsRecords:
    """Keeps a dnsmasq ``--hostsdir`` folder current with a watch of Services and Endpoints.

    One file per Service (``<namespace>.<name>``), replaced atomically (dnsmasq re-reads a
    file of that folder when it changes); a deleted Service leaves an empty file.
    """

    def __init__(self, api: k8s_client.ApiClient, folder: Path) -> None:
        self.api = api
        self.folder = folder
        self._staging = folder.parent / f".{folder.name}.staging"
        self._staging.mkdir(parents=True, exist_ok=True)
        self._services: dict[tuple[str, str], dict[str, Any]] = {}
        self._endpoints: dict[tuple[str, str], dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []

    def start(self) -> DnsRecords:
        core = k8s_client.CoreV1Api(self.api)
        for kind, lister, store in (
            ("services", core.list_service_for_all_namespaces, self._services),
            ("endpoints", core.list_endpoints_for_all_namespaces, self._endpoints),
        ):
            thread = threading.Thread(
                target=self._watch, args=(lister, store), name=f"dns-{kind}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, lister: Callable[..., Any], store: dict[tuple[str, str], Any]) -> None:
        while not self._stop.is_set():
            try:
                listing = lister(_preload_content=False, _request_timeout=30)
                body = json.loads(listing.data)
                with self._lock:
                    seen = set()
                    for item in body.get("items") or []:
                        key = (item["metadata"]["namespace"], item["metadata"]["name"])
                        seen.add(key)
                        store[key] = item
                        self._write(key)
                    for key in set(store) - seen:
                        del store[key]
                        self._write(key)
                version = body["metadata"]["resourceVersion"]
                w = k8s_watch.Watch()
                for event in w.stream(
                    lister,
                    resource_version=version,
                    timeout_seconds=60,
                    _request_timeout=90,
                    allow_watch_bookmarks=False,
                ):
                    if self._stop.is_set():
                        w.stop()
                        return
                    obj = self.api.sanitize_for_serialization(event["object"])
                    if event["type"] == "ERROR":
                        break
                    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                    with self._lock:
                        if event["type"] == "DELETED":
                            store.pop(key, None)
                        else:
                            store[key] = obj
                        self._write(key)
            except Exception as e:  # noqa: BLE001 - keep serving; relist after any failure
                if self._stop.is_set():
                    return
                self.errors.append(repr(e))
                time.sleep(1.0)

    def _write(self, key: tuple[str, str]) -> None:
        service = self._services.get(key)
        lines = dns_records(service, self._endpoints.get(key)) if service else []
        name = f"{key[0]}.{key[1]}"
        target = self.folder / name
        text = "".join(f"{line}\n" for line in lines)
        with contextlib.suppress(OSError):
            if target.read_text() == text:
                return
        staged = self._staging / name
        staged.write_text(text)
        os.replace(staged, target)


# --------------------------------------------------------------------------------------------
# The node
# --------------------------------------------------------------------------------------------


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


class Node(StartStop):
    """A single-node cluster; see the module's documentation.

    Args:
        assets: the folder with etcd and the Kubernetes binaries (``ensure_assets()``).
        cache: the folder ``scripts/provision-node.sh`` filled (``provision_host()``).
        images: docker-archive files to import into the node's containerd (imported once).
        startup_timeout: seconds each component gets to become ready.
    """

    def __init__(
        self,
        assets: Path,
        cache: Path,
        images: Iterable[Image] = (),
        *,
        startup_timeout: float = 180.0,
    ) -> None:
        self.assets = Path(assets)
        self.cache = Path(cache)
        self.images = list(images)
        self.startup_timeout = startup_timeout
        self.netns = f"trainjob-node-{os.getpid()}"
        self.token = os.urandom(16).hex()
        self.dir: Path | None = None
        self.host = ""
        self.ca_file = Path()
        self.kubeconfig = Path()
        self.kubectl_bin = self.cache / "bin" / "kubectl"
        self._procs: list[_Process] = []
        self._lock_file: IO[str] | None = None
        self._sysctls: dict[str, str] = {}
        self._dns: DnsRecords | None = None
        self._api: k8s_client.ApiClient | None = None
        self._forwards: dict[tuple[str, int], int] = {}
        self._started = False
        self._cert = Path()
        self._key = Path()
        self._inner_kubeconfig = Path()
        self._etcd_data: Path | None = None
        self._start_time = time.time()
        self.timings: dict[str, float] = {}

    # -- public ---------------------------------------------------------------------------

    @property
    def containerd_socket(self) -> Path:
        return self._require_dir() / "containerd" / "containerd.sock"

    def api_client(self) -> k8s_client.ApiClient:
        """An admin ``kubernetes.client.ApiClient`` (TLS verified) through the bridge."""
        configuration = k8s_client.Configuration()
        configuration.host = self.host
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {self.token}"}
        configuration.proxy = None
        return k8s_client.ApiClient(configuration)

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the node's kubectl 1.20 with the admin kubeconfig."""
        result = subprocess.run(
            [str(self.kubectl_bin), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        if check and result.returncode != 0:
            raise NodeError(
                f"kubectl {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}"
            )
        return result

    def ctr(self, *args: str, timeout: float = 600.0) -> str:
        """``ctr -n k8s.io ...`` against the node's containerd; returns stdout."""
        result = subprocess.run(
            ["ctr", f"--address={self.containerd_socket}", "--namespace=k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if result.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def in_netns(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a command in the node's network namespace."""
        return subprocess.run(
            ["nsenter", f"--net={self._netns_path}", "--", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def forward(self, ip: str, port: int) -> int:
        """A port of 127.0.0.1 here that reaches ``ip:port`` inside the node's network (a pod
        IP, a ClusterIP, the node's own address)."""
        key = (ip, port)
        if key not in self._forwards:
            self._forwards[key] = self._bridge(f"fwd-{ip}-{port}", f"TCP:{ip}:{port}")
        return self._forwards[key]

    def logs(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The tails of every component's log."""
        return "\n".join(
            f"--- {p.log_path} (last {lines} lines) ---\n{_tail(p.log_path, lines)}"
            for p in self._procs
        )

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> Node:
        if self._started:
            return self
        atexit.register(self.stop)
        started = time.monotonic()
        self._start_time = time.time()
        try:
            self._lock()
            self._restore_stale_sysctls()
            self.dir = Path(tempfile.mkdtemp(prefix="trainjob-node-"))
            (self.dir / "pid").write_text(str(os.getpid()))
            self._save_sysctls()
            self._make_netns()
            self._phase("network", started)
            self._write_configs()
            self._start_etcd()
            self._start_apiserver()
            self._phase("apiserver", started)
            self._api = self.api_client()
            self._start("kube-controller-manager", self._kcm_args())
            self._start("kube-scheduler", self._scheduler_args())
            self._start_containerd()
            self._phase("containerd", started)
            self._import_images()
            self._phase("images", started)
            self._start_dns()
            self._start("kube-proxy", self._proxy_args())
            self._start("kubelet", self._kubelet_args())
            self._wait_ready()
            self._phase("ready", started)
            self._started = True
        except BaseException:
            with contextlib.suppress(Exception):
                sys.stderr.write(self.logs())
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Delete every pod (the kubelet stops them), then stop everything, restore sysctls."""
        atexit.unregister(self.stop)
        if self._dns is not None:
            self._dns.stop()
        if self._started:
            with contextlib.suppress(Exception):
                self._drain()
        self._started = False
        # The kubelet first: it would recreate killed containers.
        self._stop_named("kubelet")
        with contextlib.suppress(Exception):
            self._kill_tasks()
        for name in ("containerd", "kube-proxy", "kube-scheduler", "kube-controller-manager"):
            self._stop_named(name)
        self._stop_all()
        if self._etcd_data is not None:
            shutil.rmtree(self._etcd_data, ignore_errors=True)
            self._etcd_data = None
        if self._api is not None:
            self._api.close()
            self._api = None
        with contextlib.suppress(Exception):
            self._delete_netns()
        # Pods' network namespaces (containerd's cni-*) of sandboxes killed above.
        for path in Path("/run/netns").glob("cni-*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime >= self._start_time:
                    subprocess.run(["ip", "netns", "delete", path.name], capture_output=True)
        self._restore_sysctls()
        if self.dir is not None:
            # Mounts the kubelet left (secrets, tmpfs of emptyDir.medium=Memory).
            self._unmount_under(self.dir)
            if os.environ.get(KEEP_ENV) != "1":
                shutil.rmtree(self.dir, ignore_errors=True)
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- helpers: machine state ------------------------------------------------------------

    @property
    def _netns_path(self) -> str:
        return f"/run/netns/{self.netns}"

    def _require_dir(self) -> Path:
        if self.dir is None:
            raise NodeError("the node is not started")
        return self.dir

    def _phase(self, name: str, started: float) -> None:
        self.timings[name] = round(time.monotonic() - started, 1)

    def _lock(self) -> None:
        """One node per machine (the kubelet's cgroups and sysctls are machine-wide)."""
        import fcntl

        self.cache.mkdir(parents=True, exist_ok=True)
        self._lock_file = (self.cache / ".node.lock").open("w")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            sys.stderr.write("another test session runs the node; waiting for it\n")
            fcntl.flock(self._lock_file, fcntl.LOCK_EX)
        self._cleanup_stale_sessions()

    def _cleanup_stale_sessions(self) -> None:
        """Remove what a crashed session left: its containers' shims, namespaces, folders."""
        for folder in Path(tempfile.gettempdir()).glob("trainjob-node-*"):
            try:
                pid = int((folder / "pid").read_text())
            except (OSError, ValueError):
                continue
            if _alive(pid):
                continue
            # Its containers' shims (found by their containerd socket) and anything else
            # started with its folder (dnsmasq changes credentials, which clears PDEATHSIG).
            for proc_pid, cmdline in _processes():
                if str(folder) in cmdline:
                    with contextlib.suppress(OSError):
                        os.killpg(proc_pid, signal.SIGKILL)
                    with contextlib.suppress(OSError):
                        os.kill(proc_pid, signal.SIGKILL)
            # Its pods' network namespaces (containerd's cni-*, made after the folder).
            started = folder.stat().st_mtime - 60
            for path in Path("/run/netns").glob("cni-*"):
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime >= started:
                        subprocess.run(["ip", "netns", "delete", path.name], capture_output=True)
            self._unmount_under(folder)
            shutil.rmtree(folder, ignore_errors=True)
            subprocess.run(["ip", "netns", "delete", f"trainjob-node-{pid}"], capture_output=True)

    def _saved_sysctls_file(self) -> Path:
        return self.cache / "sysctls.json"

    def _restore_stale_sysctls(self) -> None:
        """A session that died without tear-down left its saved values: put them back first."""
        saved = self._saved_sysctls_file()
        if saved.is_file():
            with contextlib.suppress(ValueError, OSError):
                _write_sysctls(json.loads(saved.read_text()))
            saved.unlink(missing_ok=True)

    def _save_sysctls(self) -> None:
        values = {name: _read_sysctl(name) for name in KUBELET_SYSCTLS}
        self._sysctls = {k: v for k, v in values.items() if v is not None}
        self._saved_sysctls_file().write_text(json.dumps(self._sysctls))

    def _restore_sysctls(self) -> None:
        if self._sysctls:
            _write_sysctls(self._sysctls)
            self._sysctls = {}
        self._saved_sysctls_file().unlink(missing_ok=True)

    def _make_netns(self) -> None:
        ns = self.netns
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        _check(["ip", "netns", "add", ns])
        for cmd in (
            ["ip", "link", "set", "lo", "up"],
            # A veth whose peer stays down: what is routed there goes nowhere.
            ["ip", "link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"],
            ["ip", "addr", "add", f"{NODE_IP}/24", "dev", "node0"],
            ["ip", "link", "set", "node0", "up"],
            # Service IPs need a route before kube-proxy's DNAT; it leads nowhere.
            ["ip", "route", "add", "default", "dev", "node0"],
            ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"],
            ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1"],
        ):
            _check(["ip", "netns", "exec", ns, *cmd])

    def _delete_netns(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.netns], capture_output=True)

    @staticmethod
    def _unmount_under(folder: Path) -> None:
        prefix = str(folder.resolve()) + "/"
        with contextlib.suppress(OSError):
            mounts = [
                line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
            ]
            for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
                subprocess.run(["umount", "-l", mount], capture_output=True)

    # -- helpers: processes -----------------------------------------------------------------

    def _start(
        self,
        name: str,
        args: list[str],
        *,
        binary: str | None = None,
        netns: bool = True,
        wrap_pdeathsig: bool = True,
    ) -> _Process:
        d = self._require_dir()
        log_path = d / "logs" / f"{name}.log"
        log_path.parent.mkdir(exist_ok=True)
        log_file = log_path.open("ab")
        exe = binary or str(self.assets / name)
        cmd = [exe, *args]
        if netns:
            cmd = ["nsenter", f"--net={self._netns_path}", "--", *cmd]
        setpriv = shutil.which("setpriv")
        if wrap_pdeathsig and setpriv and threading.current_thread() is threading.main_thread():
            cmd = [setpriv, "--pdeathsig", "TERM", "--", *cmd]
        log_file.write(f"$ {' '.join(cmd)}\n".encode())
        log_file.flush()
        popen = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=d,
            start_new_session=True,
        )
        proc = _Process(name, popen, log_path, log_file)
        self._procs.append(proc)
        return proc

    def _failure(self, proc: _Process, what: str) -> NodeError:
        return NodeError(f"{proc.name} {what}\n{self.logs()}")

    def _wait(self, proc: _Process, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.1
        while True:
            if proc.popen.poll() is not None:
                raise self._failure(proc, f"exited with status {proc.popen.returncode} {what}")
            with contextlib.suppress(Exception):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise self._failure(proc, f"not ready after {self.startup_timeout:.0f}s ({what})")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def _stop_named(self, name: str, grace: float = 15.0) -> None:
        for p in self._procs:
            if p.name == name:
                _terminate(p, grace)

    def _stop_all(self) -> None:
        procs, self._procs = self._procs, []
        for p in reversed(procs):
            _terminate(p, 10.0)
            p.log_file.close()

    def _bridge(self, name: str, target: str) -> int:
        """socat 127.0.0.1:<port> here -> a Unix socket -> socat in the namespace -> target."""
        d = self._require_dir()
        sock = d / "bridges" / f"{name}.sock"
        sock.parent.mkdir(exist_ok=True)
        inner = self._start(
            f"socat-{name}-inner",
            ["-lf", "/dev/null", f"UNIX-LISTEN:{sock},fork,mode=600", target],
            binary=shutil.which("socat") or "socat",
        )
        self._wait(inner, f"listening on {sock}", sock.exists)
        port = free_port()
        outer = self._start(
            f"socat-{name}-outer",
            [f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork", f"UNIX-CONNECT:{sock}"],
            binary=shutil.which("socat") or "socat",
            netns=False,
        )

        def listening() -> bool:
            import socket as socket_module

            with socket_module.create_connection(("127.0.0.1", port), timeout=1.0):
                return True

        self._wait(outer, f"listening on 127.0.0.1:{port}", listening)
        return port

    # -- configuration ----------------------------------------------------------------------

    def _write_configs(self) -> None:
        d = self._require_dir()
        pki = d / "pki"
        pki.mkdir()
        self.ca_file, self._cert, self._key = _write_certificates(pki)
        _write_rsa_key_pair(pki / "sa.key", pki / "sa.pub")
        tokens = pki / "tokens.csv"
        tokens.write_text(f'{self.token},trainjob-node-admin,uid-admin,"system:masters"\n')
        tokens.chmod(0o600)
        # Components reach the API server inside the namespace; tests through the bridge.
        self._inner_kubeconfig = self._write_kubeconfig(
            d / "inner.kubeconfig", f"https://{NODE_IP}:{API_PORT}"
        )
        (d / "resolv.conf").write_text("")  # the kubelet adds no search paths of this machine
        cni = d / "cni"
        (cni / "net.d").mkdir(parents=True)
        (cni / "net.d" / "10-trainjob.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "trainjob",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": "cni0",
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": POD_CIDR}]],
                                "routes": [{"dst": "0.0.0.0/0"}],
                                "dataDir": str(cni / "ipam"),
                            },
                        },
                        {"type": "portmap", "capabilities": {"portMappings": True}},
                    ],
                },
                indent=1,
            )
        )

    def _write_kubeconfig(self, path: Path, server: str) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "node",
                    "cluster": {"server": server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "node", "context": {"cluster": "node", "user": "admin"}}],
            "current-context": "node",
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    def write_kubeconfig(self, path: Path | str) -> Path:
        """A kubeconfig for the admin, through the bridge (for clients on this machine)."""
        return self._write_kubeconfig(Path(path), self.host)

    # -- components -------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        data = Path(tempfile.mkdtemp(prefix="trainjob-node-etcd-", dir=_etcd_parent()))
        self._etcd_data = data
        proc = self._start(
            "etcd",
            [
                "--name=node",
                f"--data-dir={data}",
                "--listen-client-urls=http://127.0.0.1:2379",
                "--advertise-client-urls=http://127.0.0.1:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=node=http://127.0.0.1:2380",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-outputs=stderr",
                "--log-level=warn",
            ],
        )

        def ready() -> bool:
            result = self.in_netns("socat", "-T2", "-", "TCP:127.0.0.1:2379", timeout=5)
            return result.returncode == 0

        self._wait(proc, "waiting for etcd's port", ready)

    def _start_apiserver(self) -> None:
        d = self._require_dir()
        pki = d / "pki"
        proc = self._start(
            "kube-apiserver",
            [
                "--etcd-servers=http://127.0.0.1:2379",
                "--bind-address=0.0.0.0",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={API_PORT}",
                "--insecure-port=0",
                f"--tls-cert-file={self._cert}",
                f"--tls-private-key-file={self._key}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                # It cannot resolve the node's host name from inside the namespace.
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
            ],
        )
        port = self._bridge("apiserver", f"TCP:{NODE_IP}:{API_PORT}")
        self.host = f"https://127.0.0.1:{port}"
        self.kubeconfig = self.write_kubeconfig(d / "kubeconfig")

        def ready() -> bool:
            status, _ = _http_get(f"{self.host}/readyz", token=self.token, timeout=5.0)
            return status == 200

        self._wait(proc, "waiting for kube-apiserver /readyz", ready)

    def _kcm_args(self) -> list[str]:
        d = self._require_dir()
        return [
            f"--kubeconfig={self._inner_kubeconfig}",
            "--leader-elect=false",
            "--port=0",
            "--secure-port=0",
            f"--service-account-private-key-file={d / 'pki' / 'sa.key'}",
            f"--root-ca-file={self.ca_file}",
            "--use-service-account-credentials=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allocate-node-cidrs=false",
            "--profiling=false",
        ]

    def _scheduler_args(self) -> list[str]:
        return [
            f"--kubeconfig={self._inner_kubeconfig}",
            "--leader-elect=false",
            "--port=0",
            "--secure-port=0",
            "--profiling=false",
        ]

    def _start_containerd(self) -> None:
        d = self._require_dir()
        root = self.cache / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        pause = (self.cache / "images" / "pause.name").read_text().strip()
        config = f"""version = 2
root = "{root}"
state = "{d / "containerd" / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "containerd" / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{d / "cni" / "net.d"}"
"""
        path = d / "containerd" / "config.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(config)
        # Tasks of containers left in the persistent root by an earlier session are gone with
        # its state folder; the kubelet removes their sandboxes when it syncs.
        proc = self._start(
            "containerd",
            [f"--config={path}", "--log-level=warn"],
            binary=shutil.which("containerd") or "containerd",
        )
        self._wait(proc, "waiting for its socket", lambda: bool(self.ctr("version", timeout=10)))

    def _import_images(self) -> None:
        names = set(self.ctr("images", "list", "-q").split())
        pause = (self.cache / "images" / "pause.name").read_text().strip()
        pause_archive = next((self.cache / "images").glob(f"pause-{pause.rsplit(':', 1)[1]}.tar"))
        wanted = [(pause, pause_archive), *((i.name, i.archive) for i in self.images)]
        # Other builds of these images (the store is kept between sessions): removed, and
        # containerd's garbage collector frees their layers.
        keep = {name for name, _ in wanted}
        ours = ("localhost/trainjob-", "localhost/fake-gcs-server:", "sha256:")
        for name in sorted(names - keep):
            if name.startswith(ours):
                with contextlib.suppress(NodeError):
                    self.ctr("images", "remove", "--sync", name, timeout=300)
        for name, archive in wanted:
            if name in names:
                continue
            t0 = time.monotonic()
            self.ctr("images", "import", str(archive), timeout=1800)
            if name not in set(self.ctr("images", "list", "-q").split()):
                raise NodeError(f"importing {archive} did not give the image {name}")
            self.timings[f"import {name}"] = round(time.monotonic() - t0, 1)

    def _start_dns(self) -> None:
        d = self._require_dir()
        hosts = d / "dns-hosts"
        hosts.mkdir()
        proc = self._start(
            "dnsmasq",
            [
                "--keep-in-foreground",
                "--log-facility=-",
                "--user=root",
                "--pid-file=",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                f"--hostsdir={hosts}",
                f"--listen-address={NODE_IP}",
                "--bind-interfaces",
                f"--local=/{CLUSTER_DOMAIN}/",
                "--local-ttl=1",
                "--cache-size=0",
            ],
            binary=shutil.which("dnsmasq") or "/usr/sbin/dnsmasq",
        )
        assert self._api is not None
        self._dns = DnsRecords(self._api, hosts).start()
        core = k8s_client.CoreV1Api(self._api)
        ports = [("dns", "UDP"), ("dns-tcp", "TCP")]
        core.create_namespaced_service(
            "kube-system",
            {
                "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
                "spec": {
                    "clusterIP": DNS_SERVICE_IP,
                    "ports": [{"name": n, "port": 53, "protocol": p} for n, p in ports],
                },
            },
        )
        core.create_namespaced_endpoints(
            "kube-system",
            {
                "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
                "subsets": [
                    {
                        "addresses": [{"ip": NODE_IP}],
                        "ports": [{"name": n, "port": 53, "protocol": p} for n, p in ports],
                    }
                ],
            },
        )
        dns_name = f"kube-dns.kube-system.svc.{CLUSTER_DOMAIN}"
        self._wait(proc, "answering", lambda: bool(self._resolve(dns_name)))

    def _resolve(self, name: str) -> str:
        """Ask the DNS stand-in (inside the namespace) for ``name``'s address."""
        code = (
            "import socket,struct,sys\n"
            "n=sys.argv[1]\n"
            "q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00'"
            "+b''.join(bytes([len(p)])+p.encode() for p in n.split('.'))"
            "+b'\\x00\\x00\\x01\\x00\\x01'\n"
            "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2)\n"
            f"s.sendto(q,('{NODE_IP}',53));r=s.recv(512)\n"
            "print('.'.join(map(str,r[-4:])) if struct.unpack('>H',r[6:8])[0] else '')\n"
        )
        result = self.in_netns(sys.executable, "-c", code, name, timeout=10)
        return result.stdout.strip()

    def _proxy_args(self) -> list[str]:
        return [
            f"--kubeconfig={self._inner_kubeconfig}",
            f"--hostname-override={NODE_NAME}",
            f"--bind-address={NODE_IP}",
            "--proxy-mode=iptables",
            f"--cluster-cidr={POD_CIDR}",
            # Leave the (machine-wide) conntrack settings alone.
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--profiling=false",
        ]

    def _kubelet_args(self) -> list[str]:
        d = self._require_dir()
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": NODE_IP,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": True},
                "webhook": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": str(d / "resolv.conf"),
            # CPU limits do not throttle: pods sized to fit 2 cores still get whole cores.
            "cpuCFSQuota": False,
            # Nothing can be pulled again: never garbage-collect images.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
            },
            "serializeImagePulls": False,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "nodeStatusUpdateFrequency": "5s",
            "runtimeRequestTimeout": "10m",
            "containerLogMaxSize": "20Mi",
            "maxPods": 50,
        }
        path = d / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        return [
            f"--config={path}",
            f"--kubeconfig={self._inner_kubeconfig}",
            "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{self.containerd_socket}",
            f"--node-ip={NODE_IP}",
            f"--hostname-override={NODE_NAME}",
            f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'kubelet-pki'}",
            "--v=1",
        ]

    def _wait_ready(self) -> None:
        assert self._api is not None
        core = k8s_client.CoreV1Api(self._api)
        [kubelet] = [p for p in self._procs if p.name == "kubelet"]

        def node_ready() -> bool:
            node = core.read_node(NODE_NAME, _request_timeout=5)
            return any(
                c.type == "Ready" and c.status == "True" for c in node.status.conditions or []
            )

        self._wait(kubelet, "waiting for the node to be Ready", node_ready)

        def default_account() -> bool:
            core.read_namespaced_service_account("default", "default", _request_timeout=5)
            secrets = core.list_namespaced_secret("default", _request_timeout=5).items
            return any(s.type == "kubernetes.io/service-account-token" for s in secrets)

        self._wait(kubelet, "waiting for the default ServiceAccount's token", default_account)

    # -- tear-down --------------------------------------------------------------------------

    def _drain(self, timeout: float = 120.0, grace: int = 5) -> None:
        """Delete every pod through the API and wait until containerd runs none (the kubelet
        stops them, tearing down their networks). The controller manager is stopped first and
        pods are deleted again as long as something (an operator) recreates them.

        Pods whose deletion someone asked for earlier with a longer grace period (a finished
        TrainJob's pods given ``terminationGracePeriodSeconds: 90``) are not waited for: this
        kubelet does not shorten a kill in progress, and :meth:`stop` kills what still runs."""
        assert self._api is not None
        self._stop_named("kube-controller-manager")
        core = k8s_client.CoreV1Api(self._api)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = core.list_pod_for_all_namespaces(_request_timeout=10).items
            for pod in pods:
                if pod.metadata.deletion_timestamp is not None:
                    continue
                with contextlib.suppress(k8s_client.ApiException):
                    core.delete_namespaced_pod(
                        pod.metadata.name,
                        pod.metadata.namespace,
                        grace_period_seconds=grace,
                        _request_timeout=10,
                    )
            if not self._running_tasks():
                return
            if pods and all(
                p.metadata.deletion_timestamp is not None
                and (p.metadata.deletion_grace_period_seconds or 0) > grace
                for p in pods
            ):
                return
            time.sleep(2.0)

    def _running_tasks(self) -> list[str]:
        out = self.ctr("tasks", "list", timeout=30)
        return [line.split()[0] for line in out.splitlines()[1:] if "RUNNING" in line]

    def _kill_tasks(self) -> None:
        """Kill whatever still runs, then delete tasks and containers (no kubelet by now)."""
        out = self.ctr("tasks", "list", timeout=30)
        for line in out.splitlines()[1:]:
            task = line.split()[0]
            with contextlib.suppress(NodeError):
                self.ctr("tasks", "kill", "--signal", "SIGKILL", "--all", task, timeout=30)
        deadline = time.monotonic() + 30
        while self._running_tasks() and time.monotonic() < deadline:
            time.sleep(0.5)
        for line in self.ctr("tasks", "list", timeout=30).splitlines()[1:]:
            with contextlib.suppress(NodeError):
                self.ctr("tasks", "delete", "--force", line.split()[0], timeout=30)
        for container in self.ctr("containers", "list", "-q", timeout=30).split():
            with contextlib.suppress(NodeError):
                self.ctr("containers", "delete", container, timeout=30)


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------


def _check(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise NodeError(f"{' '.join(cmd)} failed: {result.stderr.strip()}")


def _read_sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def _write_sysctls(values: Mapping[str, str]) -> None:
    for name, value in values.items():
        with contextlib.suppress(OSError):
            Path("/proc/sys", *name.split(".")).write_text(value)


def _terminate(p: _Process, grace: float) -> None:
    if p.popen.poll() is None:
        with contextlib.suppress(OSError):
            os.killpg(p.popen.pid, signal.SIGTERM)
        try:
            p.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            yield int(entry.name), cmdline


def _etcd_parent() -> str | None:
    shm = "/dev/shm"
    with contextlib.suppress(OSError):
        if os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 1 << 30:
            return shm
    return None
