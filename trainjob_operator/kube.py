"""A small, dependency-free Kubernetes REST client (JSON in, JSON out).

Used by the operator and by the in-pod driver. It sends manifests byte for
byte (no client-side models), retries transient errors (429, 5xx, connection
errors) with backoff, and raises :class:`ApiError` with the server's status,
reason and message otherwise.
"""

from __future__ import annotations

import base64
import json
import os
import random
import ssl
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# (group, version, plural) of the kinds the operator manages.
RESOURCES: dict[str, tuple[str, str, str]] = {
    "Pod": ("", "v1", "pods"),
    "Service": ("", "v1", "services"),
    "ConfigMap": ("", "v1", "configmaps"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Event": ("", "v1", "events"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    "TrainJob": ("trainjob.dev", "v1alpha1", "trainjobs"),
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
    """Where the API server is and how to authenticate."""

    host: str
    token: str | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    insecure: bool = False

    @classmethod
    def in_cluster(cls) -> KubeConfig:
        """The pod's service account."""
        host = os.environ["KUBERNETES_SERVICE_HOST"]
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        return cls(
            host=f"https://{host}:{port}",
            token=(SERVICE_ACCOUNT_DIR / "token").read_text().strip(),
            ca_file=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        )

    @classmethod
    def from_kubeconfig(cls, path: str | os.PathLike[str] | None = None) -> KubeConfig:
        """The current context of a kubeconfig file (``$KUBECONFIG`` or ``~/.kube/config``)."""
        path = (
            path
            or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
            or os.path.expanduser("~/.kube/config")
        )
        data = yaml.safe_load(Path(path).read_text())
        ctx_name = data.get("current-context")
        ctx = next(c["context"] for c in data["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in data["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in data["users"] if u["name"] == ctx["user"])

        def materialise(value: str | None, data_value: str | None, suffix: str) -> str | None:
            if value:
                return value
            if data_value:
                fd, name = tempfile.mkstemp(suffix=suffix)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(base64.b64decode(data_value))
                return name
            return None

        return cls(
            host=cluster["server"],
            token=user.get("token"),
            ca_file=materialise(
                cluster.get("certificate-authority"),
                cluster.get("certificate-authority-data"),
                ".crt",
            ),
            client_cert=materialise(
                user.get("client-certificate"), user.get("client-certificate-data"), ".crt"
            ),
            client_key=materialise(user.get("client-key"), user.get("client-key-data"), ".key"),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        )

    @classmethod
    def load(cls) -> KubeConfig:
        """In-cluster when running in a pod, else the kubeconfig."""
        if os.environ.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
            return cls.in_cluster()
        return cls.from_kubeconfig()


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
    """JSON over HTTPS to one API server."""

    def __init__(self, config: KubeConfig, attempts: int = 5, timeout: float = 30.0) -> None:
        self.config = config
        self.attempts = attempts
        self.timeout = timeout
        context = ssl.create_default_context(cafile=config.ca_file)
        if config.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if config.client_cert:
            context.load_cert_chain(config.client_cert, config.client_key)
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
        )

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
    ) -> Any:
        """Send one request; retry transient failures; raise ApiError otherwise.

        Raises:
            ApiError: the server's answer (or ``Unreachable`` after the retries).
            ValueError: ``body`` holds a NaN or infinite float (never sent).
        """
        url = self.config.host + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else _encode(body, f"{method} {path}")
        delay = 0.2
        for attempt in range(1, self.attempts + 1):
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Accept", "application/json")
            if data is not None:
                req.add_header("Content-Type", content_type)
            if self.config.token:
                req.add_header("Authorization", f"Bearer {self.config.token}")
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    raw = resp.read()
                    return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                raw = exc.read()
                try:
                    payload: Any = json.loads(raw)
                except ValueError:
                    payload = raw.decode("utf-8", "replace")
                if exc.code in (429, 500, 502, 503, 504) and attempt < self.attempts:
                    time.sleep(delay * (0.5 + random.random()))
                    delay *= 2
                    continue
                raise ApiError(exc.code, payload, f"{method} {path}") from None
            except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
                if attempt == self.attempts:
                    raise ApiError(
                        0, {"reason": "Unreachable", "message": str(exc)}, f"{method} {path}"
                    ) from exc
                time.sleep(delay * (0.5 + random.random()))
                delay *= 2
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
        self, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of ``kind`` (each with ``kind`` filled in)."""
        query = {"labelSelector": label_selector} if label_selector else None
        data = self.request("GET", resource_path(kind, namespace), query=query)
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

    def delete(self, kind: str, namespace: str, name: str) -> bool:
        """Delete (background propagation); False when it was already gone."""
        try:
            self.request(
                "DELETE",
                resource_path(kind, namespace, name),
                {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            )
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
