"""A small, dependency-free Kubernetes REST client (JSON in, JSON out).

Used by the operator and by the in-pod driver. It sends manifests byte for
byte (no client-side models), keeps one HTTP/1.1 connection alive per thread
(a TLS handshake costs several times a small request), retries transient
errors (429, 5xx, connection errors) with backoff, and raises
:class:`ApiError` with the server's status, reason and message otherwise.
"""

from __future__ import annotations

import atexit
import base64
import http.client
import importlib.metadata
import json
import os
import random
import shutil
import ssl
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainjob_operator.constants import GROUP, KIND, PLURAL, VERSION

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


def _package_version() -> str:
    try:
        return importlib.metadata.version("trainjob-operator")
    except importlib.metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0+unknown"


#: The ``User-Agent`` of the operator's requests. The API server names the writer of each
#: field after the part before the ``/`` (``managedFields[].manager``: ``kubectl get
#: --show-managed-fields`` shows who wrote the status), and its audit log and API priority and
#: fairness see it too; client-go sends ``<binary>/<version>`` the same way.
OPERATOR_USER_AGENT = f"trainjob-operator/{_package_version()}"
#: The ``User-Agent`` of the in-pod driver's requests (its status updates).
DRIVER_USER_AGENT = f"trainjob-driver/{_package_version()}"

_PRIVATE_DIRS: list[str] = []


def _remove_private_dirs() -> None:
    for folder in _PRIVATE_DIRS:
        shutil.rmtree(folder, ignore_errors=True)


def _private_file(name: str, content: bytes) -> str:
    """``content`` in a file only this user can read, in a temporary folder removed when the
    process exits (TLS libraries read certificates and keys from files only)."""
    if not _PRIVATE_DIRS:
        atexit.register(_remove_private_dirs)
    folder = tempfile.mkdtemp(prefix="trainjob-kube-")  # mode 0700
    _PRIVATE_DIRS.append(folder)
    path = os.path.join(folder, name)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(content)
    return path


# (group, version, plural) of the kinds the operator manages.
RESOURCES: dict[str, tuple[str, str, str]] = {
    "Pod": ("", "v1", "pods"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Event": ("", "v1", "events"),
    "Secret": ("", "v1", "secrets"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "Lease": ("coordination.k8s.io", "v1", "leases"),
    KIND: (GROUP, VERSION, PLURAL),
}


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"message": str(body)}
        self.reason = str(self.body.get("reason", ""))
        super().__init__(f"{what}: HTTP {status} {self.reason}: {self.body.get('message', '')}")


@dataclass
class KubeConfig:
    """Where the API server is and how to authenticate.

    ``token_file``: a bearer token file re-read whenever it changes (the kubelet rotates a
    pod's projected ServiceAccount token, which expires): :meth:`current_token` re-reads it
    and updates ``token``, which every :class:`KubeClient` request calls, so ``token`` stays
    current for whoever else reads it (kopf's login, called again after a 401).
    """

    host: str
    token: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    insecure: bool = False
    token_file: str | None = None
    _token_stamp: tuple[int, int] | None = field(default=None, init=False, repr=False)

    def current_token(self) -> str | None:
        """The bearer token to send now: ``token_file`` re-read when it changed, else ``token``.

        A file that cannot be read keeps the last token (the next request tries again).
        """
        if not self.token_file:
            return self.token
        try:
            st = os.stat(self.token_file)  # follows the kubelet's ..data symlink swap
            stamp = (st.st_ino, st.st_mtime_ns)
            if stamp != self._token_stamp:
                self.token = Path(self.token_file).read_text().strip()
                self._token_stamp = stamp
        except OSError:
            pass
        return self.token

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        """The pod's service account (its projected token re-read as the kubelet rotates it)."""
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        config = cls(
            host=f"https://{host}:{port}",
            ca_file=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
            token_file=str(SERVICE_ACCOUNT_DIR / "token"),
        )
        config.current_token()
        return config

    @classmethod
    def from_kubeconfig(
        cls, path: str | os.PathLike[str] | None = None, context: str | None = None
    ) -> KubeConfig:
        """A context of a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config``): ``context``,
        else the file's current context."""
        path = (
            path
            or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            or os.path.expanduser("~/.kube/config")
        )
        data = yaml.safe_load(Path(path).read_text())
        ctx_name = context or data.get("current-context")
        ctx = next(c["context"] for c in data["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in data["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in data["users"] if u["name"] == ctx["user"])

        def materialise(value: str | None, data_value: str | None, name: str) -> str | None:
            if value:
                return value
            if data_value:
                return _private_file(name, base64.b64decode(data_value))
            return None

        config = cls(
            host=cluster["server"],
            token=user.get("token"),
            ca_file=materialise(
                cluster.get("certificate-authority"),
                cluster.get("certificate-authority-data"),
                "ca.crt",
            ),
            client_cert=materialise(
                user.get("client-certificate"), user.get("client-certificate-data"), "client.crt"
            ),
            client_key=materialise(
                user.get("client-key"), user.get("client-key-data"), "client.key"
            ),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
            token_file=user.get("tokenFile"),
        )
        config.current_token()
        return config

    @classmethod
    def load(cls) -> KubeConfig:
        """In-cluster when running in a pod, else the kubeconfig."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
            return cls.in_cluster()
        return cls.from_kubeconfig()


def ssl_context(config: KubeConfig) -> ssl.SSLContext:
    """The TLS settings of ``config``: its CA, its client certificate, or no verification
    when ``insecure`` (shared by :class:`KubeClient` and the operator's pod watch)."""
    context = ssl.create_default_context(cafile=config.ca_file)
    if config.insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if config.client_cert:
        context.load_cert_chain(config.client_cert, config.client_key)
    return context


def resource_path(
    kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None
) -> str:
    """The REST path of a kind (optionally one object and a subresource)."""
    group, version, plural = RESOURCES[kind]
    base = f"/api/{version}" if not group else f"/apis/{group}/{version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    if name:
        path += f"/{name}"
    if subresource:
        path += f"/{subresource}"
    return path


def _encode(body: Any, what: str) -> bytes:
    """``body`` as strict JSON: a NaN or infinite float (which Python's json would write as the
    bare tokens ``NaN``/``Infinity``, rejected by the API server) is a ValueError here."""
    try:
        return json.dumps(body, allow_nan=False).encode()
    except ValueError as exc:
        raise ValueError(
            f"{what}: the body holds a NaN or infinite float, which JSON and the API server "
            f"reject ({exc}); send it as a string or null"
        ) from None


class KubeClient:
    """JSON over HTTPS to one API server; safe to share between threads.

    Each thread keeps its own kept-alive connection. A connection the server closed while
    idle (``RemoteDisconnected``, reset) is reopened and the request re-sent at once, without
    counting as a failed attempt: every call the operator and driver make is idempotent
    (create answers 409, delete 404, patches are merge patches).
    """

    def __init__(
        self,
        config: KubeConfig,
        attempts: int = 5,
        timeout: float = 30.0,
        user_agent: str = OPERATOR_USER_AGENT,
    ) -> None:
        self.config = config
        self.attempts = attempts
        self.timeout = timeout
        self.user_agent = user_agent
        url = urllib.parse.urlsplit(config.host)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(
                f"API server address {config.host!r}: expected https://HOST[:PORT] "
                "(or http:// for a local insecure port)"
            )
        self._scheme = url.scheme
        self._hostname = url.hostname
        self._port = url.port
        self._base_path = url.path.rstrip("/")
        self._ssl = ssl_context(config) if url.scheme == "https" else None
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._ssl is not None:
                conn = http.client.HTTPSConnection(
                    self._hostname, self._port, timeout=self.timeout, context=self._ssl
                )
            else:
                conn = http.client.HTTPConnection(self._hostname, self._port, timeout=self.timeout)
            self._local.conn = conn
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close this thread's connection (others close when their threads end)."""
        self._drop_connection()

    def _send(
        self, method: str, target: str, data: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        """One exchange on this thread's connection; a stale kept-alive one is reopened once."""
        for fresh in (False, True):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
            except (http.client.HTTPException, OSError):
                self._drop_connection()
                if reused and not fresh:
                    continue  # the server closed the idle connection: reconnect, re-send
                raise
            if resp.will_close:
                self._drop_connection()
            return resp.status, raw
        raise AssertionError("unreachable")  # pragma: no cover

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        decode: bool = True,
    ) -> Any:
        """Send one request; retry transient failures; raise ApiError otherwise.

        Returns the answer's JSON body, or None without parsing it when ``decode`` is False
        (a create that only needs to succeed: parsing a Pod's answer costs more CPU than
        sending it). Errors are parsed either way.

        Raises:
            ApiError: the server's answer (or ``Unreachable`` after the retries).
            ValueError: ``body`` holds a NaN or infinite float (never sent).
        """
        target = self._base_path + path
        if query:
            target += "?" + urllib.parse.urlencode(query)
        data = None if body is None else _encode(body, f"{method} {path}")
        headers = {"Accept": "application/json", "User-Agent": self.user_agent}
        if data is not None:
            headers["Content-Type"] = content_type
        token = self.config.current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            try:
                status, raw = self._send(method, target, data, headers)
            except (http.client.HTTPException, OSError) as exc:
                if attempt == self.attempts:
                    raise ApiError(
                        0,
                        {"reason": "Unreachable", "message": f"{type(exc).__name__}: {exc}"},
                        f"{method} {path}",
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
                continue
            if 200 <= status < 300:
                return json.loads(raw) if raw and decode else None
            try:
                payload: Any = json.loads(raw)
            except ValueError:
                payload = raw.decode("utf-8", "replace")
            if status in (429, 500, 502, 503, 504) and attempt < self.attempts:
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
                continue
            raise ApiError(status, payload, f"{method} {path}")
        raise AssertionError("unreachable")  # pragma: no cover

    # -- conveniences -------------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """One object, or None when it does not exist."""
        try:
            obj: dict[str, Any] = self.request("GET", resource_path(kind, namespace, name))
            return obj
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(
        self,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
        from_cache: bool = False,
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` (each with ``kind`` filled in).

        ``from_cache``: answer from the API server's watch cache (``resourceVersion=0``)
        instead of a quorum read from etcd: far cheaper when a namespace holds many
        objects, possibly a moment stale (as an informer's view is).
        """
        query: dict[str, str] = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if from_cache:
            query["resourceVersion"] = "0"
        data = self.request("GET", resource_path(kind, namespace), query=query or None)
        items: list[dict[str, Any]] = data.get("items", [])
        for item in items:
            item.setdefault("kind", kind)
        return items

    def create(self, obj: dict[str, Any], namespace: str) -> dict[str, Any] | None:
        """Create ``obj``; None when it already exists (409: idempotent)."""
        try:
            created: dict[str, Any] = self.request(
                "POST", resource_path(obj["kind"], namespace), obj
            )
            return created
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    def ensure(self, obj: dict[str, Any], namespace: str) -> bool:
        """Create ``obj`` unless it exists: True when this call created it, False on 409.

        Like :meth:`create`, without reading the created object back (the reconciler's
        creates and Events only need to succeed)."""
        try:
            self.request("POST", resource_path(obj["kind"], namespace), obj, decode=False)
            return True
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise

    def delete(
        self, kind: str, namespace: str, name: str, grace_seconds: int | None = None
    ) -> bool:
        """Delete (background propagation; with ``grace_seconds``, that grace period instead of
        the object's own); False when it was already gone."""
        options: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if grace_seconds is not None:
            options["gracePeriodSeconds"] = grace_seconds
        try:
            self.request("DELETE", resource_path(kind, namespace, name), options)
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise

    def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """JSON merge patch."""
        result: dict[str, Any] = self.request(
            "PATCH",
            resource_path(kind, namespace, name, subresource),
            patch,
            content_type="application/merge-patch+json",
        )
        return result
