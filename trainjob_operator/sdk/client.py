""":class:`TrainJobClient`: submit, follow and manage TrainJobs from Python.

For notebooks and pipelines what ``trainjob submit``/``logs``/``list``/... are on the command
line (they are built on it)::

    from trainjob_operator.sdk import TrainJobClient

    client = TrainJobClient(namespace="team-a")
    job = client.submit("train.yaml", working_dir=".")
    job = client.wait(job.name, on_progress=lambda j: print(j.status and j.status.phase))
    for line in client.logs(job.name):
        print(line)
    result = client.result(job.name)      # a trainer_runtime.Result, read from storage
    print(result.best_checkpoint)

Every error is a :class:`~trainjob_operator.sdk.errors.TrainJobError` naming the TrainJob and
the cause; nothing raises the API server's HTTP errors as they are.
"""

from __future__ import annotations

import builtins
import copy
import http.client
import json
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from trainer_runtime.result import Result
from trainer_runtime.storage import StorageError, get_storage
from trainjob_operator.admission import pod_template_problems
from trainjob_operator.api.errors import ManifestError
from trainjob_operator.api.manifest import parse_trainjob
from trainjob_operator.api.spec import TrainJobSpec
from trainjob_operator.api.status import Phase
from trainjob_operator.api.trainjob import TrainJob
from trainjob_operator.constants import API_VERSION, KIND, NAME_LABEL, PLURAL, ROLE_LABEL
from trainjob_operator.kube import ApiError, KubeClient, KubeConfig, resource_path, ssl_context
from trainjob_operator.sdk.errors import (
    ClusterUnreachable,
    ConfigError,
    InvalidTrainJob,
    PackagingError,
    PermissionDenied,
    TrainJobError,
    TrainJobExists,
    TrainJobNotFound,
    WaitTimeout,
)
from trainjob_operator.sdk.packaging import (
    MAX_PACKAGE_BYTES,
    Package,
    archive_uri,
    check_entrypoints,
    package_working_dir,
)

__all__ = ["ROLES", "TERMINAL_PHASES", "USER_AGENT", "TrainJobClient", "run_folder"]

TERMINAL_PHASES: tuple[Phase, ...] = (Phase.SUCCEEDED, Phase.FAILED)
"""What :meth:`TrainJobClient.wait` waits for by default."""
ROLES = ("driver", "head", "worker", "validation", "data")
"""The pod roles :meth:`TrainJobClient.logs` reads (the pods' role label)."""
USER_AGENT = "trainjob-sdk"
_PENDING_UPLOAD = "/pending-upload"

Manifest = str | os.PathLike[str] | Mapping[str, Any] | TrainJob | TrainJobSpec


LOG_READ_TIMEOUT_S = 30.0
"""How long a log read that does not follow waits for the API server (a followed log has no
read timeout: the pod may be silent for as long as it likes)."""


def run_folder(job: TrainJob) -> str:
    """The run folder of ``job`` in storage: ``<spec.storage.path>/<name>`` (checkpoints,
    their manifest, the uploaded working folders)."""
    if job.spec.storage is None:
        raise TrainJobError(
            "spec.storage.path is not set: the run's checkpoints are in the pods' default "
            "local folder, which nothing outside the cluster can read",
            name=job.metadata.name,
            namespace=job.metadata.namespace,
            reason="NoStorage",
        )
    return f"{job.spec.storage.path.rstrip('/')}/{job.metadata.name}"


def _pod_order(pod: dict[str, Any]) -> tuple[int, ...]:
    """Sort key: the numbers in the pod name (``-w2`` < ``-w10``, ``-s0-h1`` < ``-s1-h0``)."""
    return tuple(int(n) for n in re.findall(r"\d+", pod["metadata"]["name"][-12:]))


class TrainJobClient:
    """TrainJobs in one namespace of one cluster.

    Args:
        namespace: the namespace (else the context's, else ``default``).
        context: a kubeconfig context (else the current one).
        kubeconfig: a kubeconfig file (else ``$KUBECONFIG``, else ``~/.kube/config``).
        kube: an existing :class:`~trainjob_operator.kube.KubeClient` (tests, in-cluster use);
            ``context`` and ``kubeconfig`` are then ignored.

    Raises:
        ConfigError: no kubeconfig file, or no such context in it.
    """

    def __init__(
        self,
        namespace: str | None = None,
        context: str | None = None,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        kube: KubeClient | None = None,
    ) -> None:
        context_namespace = None
        if kube is None:
            config, context_namespace = _load_kubeconfig(kubeconfig, context)
            kube = KubeClient(config, attempts=3, timeout=30.0, user_agent=USER_AGENT)
        self.kube = kube
        self.namespace: str = namespace or context_namespace or "default"

    # ------------------------------------------------------------------ errors

    def _error(self, exc: ApiError, name: str | None, action: str) -> TrainJobError:
        """The SDK error for an API answer."""
        ns = self.namespace
        message = str(exc.body.get("message", "")) or exc.reason
        if exc.status == 0:
            return ClusterUnreachable(
                f"cannot {action}: the API server {self.kube.config.host} does not answer "
                f"({message})",
                name=name,
                namespace=ns,
            )
        if exc.status == 401:
            return ConfigError(
                f"cannot {action}: the API server refused the kubeconfig's credentials "
                "(expired token? log in again)",
                name=name,
                namespace=ns,
                reason="Unauthorized",
            )
        if exc.status == 403:
            return PermissionDenied(
                f"cannot {action}: forbidden by RBAC ({message})", name=name, namespace=ns
            )
        if exc.status == 404:
            found = exc.body.get("details")
            details: dict[str, Any] = found if isinstance(found, dict) else {}
            if details.get("kind") == "namespaces":
                return TrainJobNotFound(
                    f"cannot {action}: namespace {ns!r} does not exist",
                    name=name,
                    namespace=ns,
                    reason="NamespaceNotFound",
                )
            if details.get("kind") == PLURAL or (name and exc.body.get("reason")):
                return TrainJobNotFound(
                    f"not found in namespace {ns!r}", name=name, namespace=ns, reason="NotFound"
                )
            return ClusterUnreachable(
                f"cannot {action}: the cluster does not serve TrainJobs (is the TrainJob CRD "
                "installed? helm install trainjob-operator charts/trainjob-operator)",
                name=name,
                namespace=ns,
                reason="NoCRD",
            )
        if exc.status == 409:
            return TrainJobExists(
                f"already exists in namespace {ns!r} (delete it or choose another metadata.name)",
                name=name,
                namespace=ns,
            )
        if exc.status in (400, 422):
            return InvalidTrainJob(
                [message.removeprefix("admission webhook ")], name=name, namespace=ns
            )
        return TrainJobError(
            f"cannot {action}: HTTP {exc.status} {exc.reason}: {message}",
            name=name,
            namespace=ns,
            reason=exc.reason or "ApiError",
        )

    def _request(self, name: str | None, action: str, method: str, path: str, **kw: Any) -> Any:
        try:
            return self.kube.request(method, path, **kw)
        except ApiError as exc:
            raise self._error(exc, name, action) from exc

    # ------------------------------------------------------------------ reading

    def get_object(self, name: str) -> dict[str, Any]:
        """The TrainJob as the API server returns it (status, conditions and all)."""
        obj: dict[str, Any] = self._request(
            name, "read it", "GET", resource_path(KIND, self.namespace, name)
        )
        return obj

    def get(self, name: str) -> TrainJob:
        """The TrainJob ``name``. Raises :class:`TrainJobNotFound`."""
        return _to_model(self.get_object(name))

    def list(self) -> builtins.list[TrainJob]:
        """Every TrainJob of the namespace, oldest first."""
        data = self._request(None, "list TrainJobs", "GET", resource_path(KIND, self.namespace))
        items = [_to_model(dict(item, apiVersion=API_VERSION, kind=KIND)) for item in data["items"]]
        return sorted(items, key=lambda j: (j.metadata.creation_timestamp or "", j.name))

    def events(self, name: str) -> builtins.list[dict[str, Any]]:
        """The Kubernetes Events of the TrainJob, oldest first."""
        query = {"fieldSelector": f"involvedObject.kind={KIND},involvedObject.name={name}"}
        data = self._request(
            name, "read its Events", "GET", resource_path("Event", self.namespace), query=query
        )
        events: builtins.list[dict[str, Any]] = data.get("items", [])
        return sorted(events, key=_event_order)

    def pods(self, name: str, role: str | None = None) -> builtins.list[dict[str, Any]]:
        """The TrainJob's pods (of one role), in rank order."""
        selector = f"{NAME_LABEL}={name}" + (f",{ROLE_LABEL}={role}" if role else "")
        data = self._request(
            name,
            "list its pods",
            "GET",
            resource_path("Pod", self.namespace),
            query={"labelSelector": selector},
        )
        pods: builtins.list[dict[str, Any]] = data.get("items", [])
        return sorted(pods, key=_pod_order)

    # ------------------------------------------------------------------ submitting

    def submit(
        self,
        manifest: Manifest,
        working_dir: str | os.PathLike[str] | None = None,
        *,
        name: str | None = None,
        entrypoint_in_image: bool = False,
        max_package_bytes: int = MAX_PACKAGE_BYTES,
    ) -> TrainJob:
        """Create a TrainJob.

        Args:
            manifest: a YAML file (one TrainJob), a dict, a :class:`TrainJob`, or a
                :class:`TrainJobSpec` (then ``name`` is required).
            working_dir: a folder to ship as ``spec.runtimeEnv.workingDir``: packaged
                (:func:`~trainjob_operator.sdk.packaging.package_working_dir`), checked to hold
                the entrypoints' modules, uploaded content-addressed to
                ``<spec.storage.path>/<name>/_code/<sha256>.zip``.
            name: sets ``metadata.name``.
            entrypoint_in_image: the entrypoints are in the image, not in ``working_dir``:
                skip that check.
            max_package_bytes: refuse a larger package.

        The checks run before anything is written: the manifest (as ``trainjob validate``),
        the package, then a server-side dry run (namespace, RBAC, the admission webhook, a
        TrainJob of that name). Only then is the package uploaded and the TrainJob created.

        Raises:
            InvalidTrainJob: the manifest fails the checks (here or the API server's).
            PackagingError: the working dir is too large, lacks an entrypoint, or cannot be
                uploaded.
            TrainJobExists: a TrainJob of that name exists.
            PermissionDenied: RBAC refused the create.
            TrainJobNotFound: the namespace does not exist.
            ClusterUnreachable: the API server does not answer.
        """
        body = self._manifest_body(manifest, name)
        runtime_env = (body.get("spec") or {}).get("runtimeEnv")
        if working_dir is not None and isinstance(runtime_env, dict):
            # Replaced by the upload's URI below; until then, excludes meant for the working
            # dir are not "excludes without a folder to apply to".
            runtime_env.setdefault("workingDir", _PENDING_UPLOAD)
        job = self._check(body)
        name = job.metadata.name
        package: Package | None = None
        if working_dir is not None:
            try:
                package = package_working_dir(
                    working_dir,
                    job.spec.runtime_env.excludes if job.spec.runtime_env else (),
                    max_bytes=max_package_bytes,
                )
                if not entrypoint_in_image:
                    entrypoints = {"spec.entrypoint": job.spec.entrypoint}
                    if job.spec.validation is not None:
                        entrypoints["spec.validation.entrypoint"] = job.spec.validation.entrypoint
                    check_entrypoints(package, entrypoints)
            except PackagingError as exc:
                raise PackagingError(
                    str(exc)
                    + (
                        " (pass entrypoint_in_image=True / --entrypoint-in-image when the "
                        "module is in the image)"
                        if exc.reason == "EntrypointMissing"
                        else ""
                    ),
                    name=name,
                    namespace=self.namespace,
                    reason=exc.reason,
                ) from None
            if job.spec.storage is None:
                raise PackagingError(
                    "--working-dir needs spec.storage.path (gs://, s3:// or a volume every pod "
                    "mounts): the working dir is uploaded there",
                    name=name,
                    namespace=self.namespace,
                    reason="NoStorage",
                )
            uri = archive_uri(job.spec.storage.path, name, package)
            runtime_env = body["spec"].setdefault("runtimeEnv", {})
            runtime_env["workingDir"] = uri
            job = self._check(body)
        # Everything the server checks, without creating anything.
        self._create(body, dry_run=True)
        if package is not None:
            self._upload(package, job)
        return _to_model(self._create(body, dry_run=False))

    def _manifest_body(self, manifest: Manifest, name: str | None) -> dict[str, Any]:
        if isinstance(manifest, TrainJob):
            body = manifest.to_dict()
            body.pop("status", None)
        elif isinstance(manifest, TrainJobSpec):
            if not name:
                raise InvalidTrainJob(["metadata.name: a TrainJobSpec needs name="])
            body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}}
            body["spec"] = manifest.to_dict()
        elif isinstance(manifest, Mapping):
            body = copy.deepcopy(dict(manifest))
        else:
            path = Path(manifest)
            try:
                docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
            except (OSError, UnicodeDecodeError) as exc:
                raise InvalidTrainJob(
                    [f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}"]
                ) from None
            except yaml.YAMLError as exc:
                raise InvalidTrainJob([f"{path}: not valid YAML: {exc}"]) from None
            if len(docs) != 1:
                raise InvalidTrainJob(
                    [f"{path}: expected one TrainJob document, found {len(docs)}"]
                )
            body = docs[0]
        if not isinstance(body, dict):
            raise InvalidTrainJob(["a TrainJob must be a mapping"])
        metadata = body.setdefault("metadata", {})
        if name:
            metadata["name"] = name
        declared = metadata.get("namespace")
        if declared and declared != self.namespace:
            raise InvalidTrainJob(
                [
                    f"metadata.namespace: the manifest says {declared!r} but the client's "
                    f"namespace is {self.namespace!r} (remove it from the manifest, or use "
                    f"--namespace {declared})"
                ],
                name=metadata.get("name"),
            )
        metadata["namespace"] = self.namespace
        for key in ("resourceVersion", "uid", "creationTimestamp", "generation"):
            metadata.pop(key, None)
        body.pop("status", None)
        return body

    def _check(self, body: dict[str, Any]) -> TrainJob:
        name = (body.get("metadata") or {}).get("name")
        try:
            job = parse_trainjob(body)
        except ManifestError as exc:
            raise InvalidTrainJob(
                [e.format() for e in exc.errors], name=name, namespace=self.namespace
            ) from None
        problems = pod_template_problems(job)
        if problems:
            raise InvalidTrainJob(problems, name=name, namespace=self.namespace)
        return job

    def _create(self, body: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
        name = body["metadata"]["name"]
        created: dict[str, Any] = self._request(
            name,
            "create it",
            "POST",
            resource_path(KIND, self.namespace),
            body=body,
            query={"dryRun": "All"} if dry_run else None,
        )
        return created

    def _upload(self, package: Package, job: TrainJob) -> None:
        uri = (job.spec.runtime_env.working_dir if job.spec.runtime_env else None) or ""
        try:
            storage = get_storage(uri)
            if not storage.exists(uri):  # content-addressed: the same files are there already
                storage.write_bytes(uri, package.data)
        except (StorageError, OSError, ImportError) as exc:
            error = PackagingError(
                f"cannot upload the working dir to {uri}: {exc}",
                name=job.metadata.name,
                namespace=self.namespace,
                reason="UploadFailed",
            )
            error.invalid_input = False  # the storage failed, not the input
            raise error from exc

    # ------------------------------------------------------------------ following

    def wait(
        self,
        name: str,
        until: Collection[Phase | str] = TERMINAL_PHASES,
        timeout: float | None = None,
        on_progress: Callable[[TrainJob], None] | None = None,
        poll_interval: float = 2.0,
    ) -> TrainJob:
        """Wait until the TrainJob's phase is one of ``until``; returns it then.

        ``on_progress`` is called with the TrainJob each time it changed (and once at first).
        Raises :class:`WaitTimeout` after ``timeout`` seconds (its ``last`` is the TrainJob
        as last seen), :class:`TrainJobNotFound` when it is deleted meanwhile.
        """
        wanted = {str(p) for p in until}
        deadline = None if timeout is None else time.monotonic() + timeout
        seen_version = None
        while True:
            obj = self.get_object(name)
            job = _to_model(obj)
            version = obj["metadata"].get("resourceVersion")
            if version != seen_version:
                seen_version = version
                if on_progress is not None:
                    on_progress(job)
            phase = job.status.phase if job.status else None
            if phase is not None and str(phase) in wanted:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                error = WaitTimeout(
                    f"still {phase or 'Pending'} after {timeout:g}s (waiting for "
                    f"{', '.join(sorted(wanted))})",
                    name=name,
                    namespace=self.namespace,
                )
                error.last = job
                raise error
            time.sleep(
                poll_interval
                if deadline is None
                else max(0.0, min(poll_interval, deadline - time.monotonic()))
            )

    def logs(
        self,
        name: str,
        follow: bool = False,
        role: str = "driver",
        rank: int = 0,
        *,
        tail_lines: int | None = None,
        poll_interval: float = 2.0,
    ) -> Iterator[str]:
        """The log lines of one of the TrainJob's pods.

        ``role``: driver (the run's progress), head, worker or validation; ``rank``: which pod
        of the role, in rank order (workers: ``<job>-w<rank>``; TPU: slice by slice).
        ``follow``: stream until the container ends (waiting for it to start first, while the
        TrainJob is not finished).
        """
        if role not in ROLES:
            raise TrainJobError(
                f"role {role!r}: expected one of {', '.join(ROLES)}",
                name=name,
                namespace=self.namespace,
                reason="BadRole",
            )
        while True:
            pods = self.pods(name, role)
            pod = pods[rank] if 0 <= rank < len(pods) else None
            waiting = pod is None or _waiting_to_start(pod)
            if not waiting:
                assert pod is not None
                yield from self._pod_log(name, pod, follow, tail_lines)
                return
            if not follow:
                job = self.get(name)
                phase = job.status.phase if job.status else None
                raise TrainJobNotFound(
                    f"no {role} pod of rank {rank} is running (phase {phase or 'Pending'}, "
                    f"{len(pods)} {role} pod(s)); -f waits for it",
                    name=name,
                    namespace=self.namespace,
                    reason="NoPod",
                )
            job = self.get(name)
            if job.status and job.status.phase in TERMINAL_PHASES and pod is None:
                raise TrainJobNotFound(
                    f"it is {job.status.phase} and its {role} pod of rank {rank} is gone",
                    name=name,
                    namespace=self.namespace,
                    reason="NoPod",
                )
            time.sleep(poll_interval)

    def _pod_log(
        self, name: str, pod: dict[str, Any], follow: bool, tail_lines: int | None
    ) -> Iterator[str]:
        pod_name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]["name"]
        query = {"container": container}
        if follow:
            query["follow"] = "true"
        if tail_lines is not None:
            query["tailLines"] = str(tail_lines)
        path = resource_path("Pod", self.namespace, pod_name, "log")
        config = self.kube.config
        url = urllib.parse.urlsplit(config.host)
        # A followed log can be silent for as long as the pod is: no read timeout then.
        timeout = None if follow else LOG_READ_TIMEOUT_S
        conn: http.client.HTTPConnection
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(
                url.hostname or "", url.port, timeout=timeout, context=ssl_context(config)
            )
        else:
            conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
        headers = {"User-Agent": USER_AGENT}
        token = config.current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request(
                "GET",
                url.path.rstrip("/") + path + "?" + urllib.parse.urlencode(query),
                headers=headers,
            )
            resp = conn.getresponse()
            if resp.status != 200:
                raw = resp.read()
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                raise self._error(ApiError(resp.status, body, f"GET {path}"), name, "read logs")
            while True:
                line = resp.readline()
                if not line:
                    return
                yield line.decode("utf-8", "replace").rstrip("\n")
        except OSError as exc:
            raise ClusterUnreachable(
                f"reading the logs of pod {pod_name} stopped: {exc}",
                name=name,
                namespace=self.namespace,
            ) from exc
        finally:
            conn.close()

    # ------------------------------------------------------------------ results

    def result(self, name: str) -> Result:
        """The run's :class:`trainer_runtime.Result`, read from storage
        (``Result.from_path(<spec.storage.path>/<name>)``): its checkpoints (committed ones
        only), their metrics and validation, the best one. Needs read access to the storage
        (e.g. ``gcloud auth application-default login`` for gs://)."""
        job = self.get(name)
        folder = run_folder(job)
        try:
            return Result.from_path(folder)
        except (RuntimeError, OSError, ValueError, ImportError) as exc:
            raise TrainJobError(
                f"cannot read its run folder {folder}: {exc}",
                name=name,
                namespace=self.namespace,
                reason="NoResult",
            ) from exc

    # ------------------------------------------------------------------ life cycle

    def _patch_spec(self, name: str, spec: dict[str, Any], action: str) -> TrainJob:
        obj = self._request(
            name,
            action,
            "PATCH",
            resource_path(KIND, self.namespace, name),
            body={"spec": spec},
            content_type="application/merge-patch+json",
        )
        return _to_model(obj)

    def suspend(self, name: str) -> TrainJob:
        """Set ``spec.suspend``: the operator deletes the pods, the checkpoints stay."""
        return self._patch_spec(name, {"suspend": True}, "suspend it")

    def resume(self, name: str) -> TrainJob:
        """Clear ``spec.suspend``: the pods come back and training resumes from the latest
        checkpoint."""
        return self._patch_spec(name, {"suspend": False}, "resume it")

    def delete(self, name: str) -> None:
        """Delete the TrainJob (its pods and Services go with it; storage is kept).
        Raises :class:`TrainJobNotFound` when it does not exist."""
        self._request(
            name,
            "delete it",
            "DELETE",
            resource_path(KIND, self.namespace, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
        )


def _waiting_to_start(pod: dict[str, Any]) -> bool:
    """Whether the pod's container has not started (no logs to read yet)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    if not statuses:
        return True
    state = statuses[0].get("state") or {}
    return "waiting" in state and not statuses[0].get("lastState", {}).get("terminated")


def _to_model(obj: Mapping[str, Any]) -> TrainJob:
    """A TrainJob from the API server; a status this version cannot parse is left out (a
    newer operator may publish fields this client does not know)."""
    try:
        return parse_trainjob(obj)
    except ManifestError:
        stripped = {k: v for k, v in obj.items() if k != "status"}
        return parse_trainjob(stripped)


def _load_kubeconfig(
    path: str | os.PathLike[str] | None, context: str | None
) -> tuple[KubeConfig, str | None]:
    """The kubeconfig's ``context`` (or current context) and that context's namespace."""
    if path is None:
        path = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    file = Path(path) if path else Path.home() / ".kube" / "config"
    if not file.is_file():
        raise ConfigError(
            f"no kubeconfig at {file} (pass --kubeconfig, set KUBECONFIG, or log in to the "
            "cluster, e.g. gcloud container clusters get-credentials)",
            reason="NoKubeconfig",
        )
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the kubeconfig {file}: {exc}") from None
    contexts = {c.get("name"): c.get("context") or {} for c in data.get("contexts") or []}
    name = context or data.get("current-context")
    if not name:
        raise ConfigError(
            f"the kubeconfig {file} has no current context (pass --context; contexts: "
            f"{', '.join(sorted(map(str, contexts))) or 'none'})",
            reason="NoContext",
        )
    if name not in contexts:
        raise ConfigError(
            f"no context {name!r} in the kubeconfig {file} (contexts: "
            f"{', '.join(sorted(map(str, contexts))) or 'none'})",
            reason="NoContext",
        )
    try:
        config = KubeConfig.from_kubeconfig(file, context=name)
    except (KeyError, StopIteration, ValueError, OSError) as exc:
        raise ConfigError(f"context {name!r} of {file} is incomplete: {exc!r}") from None
    return config, contexts[name].get("namespace")


def _event_order(event: dict[str, Any]) -> tuple[str, int]:
    """Oldest first: by time (whole seconds), then by ``resourceVersion``, which etcd raises with
    every write, so two Events of one second keep the order they were written in (the API
    server lists them by name, which is random)."""
    meta = event.get("metadata") or {}
    when = event.get("lastTimestamp") or event.get("eventTime") or meta.get("creationTimestamp")
    version = str(meta.get("resourceVersion") or "0")
    return str(when or ""), int(version) if version.isdigit() else 0
