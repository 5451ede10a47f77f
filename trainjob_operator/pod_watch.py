"""Changes of the pods the operator manages, as reconcile triggers for their TrainJobs.

A plain watch of the API server (one per namespace the operator serves, or one for all
namespaces) in place of kopf's pod watch. A pod event asks for little: a
reconcile of the TrainJob its ``trainjob.dev/name`` label names, when the pod changed or went
away. A pod being added asks for nothing: only the operator creates these pods, and the
reconcile that created one already planned with it (:func:`read_watch_line`). kopf handled
every event with its whole machinery (the JSON parsed into a body, a worker task and queue per
pod with a batching window, the handler's invocation context and a per-object logger), for
the ``ADDED`` echo of each of the operator's own creates too: four per new TrainJob, most of
the pod events of a burst of new TrainJobs. Here an ``ADDED`` line is not parsed at all: its
``resourceVersion`` is read off the bytes.

The protocol is the API's (as kopf's and client-go's reflector follow it): LIST for a
``resourceVersion`` (from the API server's watch cache), WATCH from it with bookmarks, resume
from the last version seen when the server ends a stream, LIST again when that version has
expired (410 Gone). Changes missed across such a gap are made up by ``on_relist`` (the
operator then reconciles every TrainJob at its next timer tick). Failed requests are retried
with the delays of :data:`RETRY_DELAYS`; the bearer token is re-read for every request
(:meth:`KubeConfig.current_token`), so a rotated ServiceAccount token is picked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client import Counter

from trainjob_operator.constants import NAME_LABEL
from trainjob_operator.kube import OPERATOR_USER_AGENT, KubeConfig, ssl_context

logger = logging.getLogger("trainjob_operator")

#: How long the API server keeps one watch request open; the watch then resumes from the
#: last ``resourceVersion`` it saw (bookmarks keep that recent while nothing changes).
WATCH_TIMEOUT_SECONDS = 300
#: Waits between failed attempts (unreachable, 5xx, 401/403...), the last one repeated.
RETRY_DELAYS = (1.0, 2.0, 5.0, 10.0, 30.0)
#: How the API server (Go's encoding/json, compact, ``type`` first) starts an ``ADDED`` line.
_ADDED = b'{"type":"ADDED",'
#: The first ``resourceVersion`` of a line: the object's own (its ``metadata`` comes first, and
#: in it ``resourceVersion`` comes before labels, annotations and managed fields).
_RESOURCE_VERSION = re.compile(rb'"resourceVersion":"([0-9]+)"')
_READ_CHUNK = 256 * 1024

POD_EVENTS = Counter(
    "trainjob_pod_watch_events_total",
    "Watch events of the pods the operator manages, by type",
    ["type"],
)
for _type in ("ADDED", "MODIFIED", "DELETED"):  # exported from the start (0)
    POD_EVENTS.labels(_type)

OnChange = Callable[[str, str], None]


@dataclass(frozen=True)
class WatchLine:
    """What one line of a pod watch stream says."""

    type: str
    #: the version to resume from after this line (None: the line does not move it)
    resource_version: str | None = None
    #: (namespace, TrainJob name) to reconcile, when the line asks for it
    trainjob: tuple[str, str] | None = None
    #: the ``Status`` of an ``ERROR`` line
    error: dict[str, Any] | None = None


def read_watch_line(line: bytes) -> WatchLine:
    """Read one line of a watch of managed pods.

    ``ADDED`` asks for no reconcile (see the module docstring) and, when it has the API
    server's usual form, is not parsed: only its ``resourceVersion`` is taken. ``MODIFIED``
    (scheduled, running, failed, being evicted) and ``DELETED`` of a pod labelled with its
    TrainJob ask for a reconcile of that TrainJob. ``BOOKMARK`` only moves the version.
    """
    if line.startswith(_ADDED):
        found = _RESOURCE_VERSION.search(line)
        if found is not None:
            return WatchLine("ADDED", found.group(1).decode("ascii"))
    event = json.loads(line)
    kind = str(event.get("type"))
    obj = event.get("object") or {}
    if kind == "ERROR":
        return WatchLine(kind, error=obj)
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(NAME_LABEL)
    namespace = meta.get("namespace")
    asks = kind in ("MODIFIED", "DELETED") and bool(job) and bool(namespace)
    return WatchLine(
        kind,
        meta.get("resourceVersion"),
        (str(namespace), str(job)) if asks else None,
    )


def watch_scopes(namespaces: list[str] | None) -> list[str | None]:
    """The watches to run for the namespaces the operator serves: one per namespace name, or
    a single one for all namespaces (None) when it serves all of them or is given a pattern
    (``team-*``, as kopf accepts; matched here by :func:`namespace_matcher`)."""
    if not namespaces or any(_is_pattern(n) for n in namespaces):
        return [None]
    return list(dict.fromkeys(namespaces))


def namespace_matcher(namespaces: list[str] | None) -> Callable[[str], bool]:
    """Whether a namespace is one the operator serves (names or ``fnmatch`` patterns)."""
    if not namespaces:
        return lambda _namespace: True
    names = tuple(namespaces)
    return lambda namespace: any(fnmatch.fnmatchcase(namespace, n) for n in names)


def _is_pattern(namespace: str) -> bool:
    return any(c in namespace for c in "*?[")


class WatchRefused(Exception):
    """The API server answered a LIST or WATCH with an error other than 410 Gone."""


class _Gone(Exception):
    """The version to resume from has expired: LIST again."""


async def _lines(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The lines of a response, however long (aiohttp's ``readline`` stops at 128 KiB)."""
    buffer = b""
    async for data in content.iter_chunked(_READ_CHUNK):
        buffer += data
        start = 0
        end = buffer.find(b"\n")
        while end >= 0:
            if end > start:
                yield buffer[start:end]
            start = end + 1
            end = buffer.find(b"\n", start)
        buffer = buffer[start:]
    if buffer.strip():
        yield buffer


class PodWatch:
    """One watch of the managed pods of ``namespace`` (None: all namespaces).

    ``on_change(namespace, trainjob)`` is called, on the event loop, for each pod change that
    asks for a reconcile (:func:`read_watch_line`) in a namespace ``accepts``; ``on_relist()``
    after a LIST that replaced an expired version (not after the first LIST: at start-up the
    TrainJob watch's own listing reconciles every TrainJob).
    """

    def __init__(
        self,
        config: KubeConfig,
        namespace: str | None,
        label_selector: str,
        on_change: OnChange,
        on_relist: Callable[[], None],
        accepts: Callable[[str], bool] = lambda _namespace: True,
    ) -> None:
        self.config = config
        self.namespace = namespace
        self.label_selector = label_selector
        self.on_change = on_change
        self.on_relist = on_relist
        self.accepts = accepts
        self.path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        self.resource_version: str | None = None
        #: set once the first LIST answered (the watch is then not missing any change)
        self.listed = asyncio.Event()

    @property
    def where(self) -> str:
        """The namespace watched, for log lines."""
        return f"namespace {self.namespace}" if self.namespace else "all namespaces"

    def _url(self, query: dict[str, str]) -> str:
        return f"{self.config.host.rstrip('/')}{self.path}?{urllib.parse.urlencode(query)}"

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": OPERATOR_USER_AGENT}
        token = self.config.current_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def list_pods(self, session: aiohttp.ClientSession) -> None:
        """LIST the managed pods (from the watch cache) for the version to watch from."""
        query = {"labelSelector": self.label_selector, "resourceVersion": "0"}
        async with session.get(
            self._url(query),
            headers=self._headers(),
            timeout=aiohttp.ClientTimeout(total=60),
        ) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise WatchRefused(f"LIST {self.path}: HTTP {resp.status}: {body[:500]!r}")
        self.resource_version = str(json.loads(body)["metadata"]["resourceVersion"])

    async def watch_once(self, session: aiohttp.ClientSession) -> None:
        """One WATCH request from :attr:`resource_version`, until the server ends it.

        Raises:
            _Gone: the version expired (410), as the HTTP status or an ``ERROR`` line.
            WatchRefused: any other error answer.
        """
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "labelSelector": self.label_selector,
            "resourceVersion": str(self.resource_version),
            "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS),
        }
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=30, sock_read=WATCH_TIMEOUT_SECONDS + 60
        )
        async with session.get(self._url(query), headers=self._headers(), timeout=timeout) as resp:
            if resp.status == 410:
                raise _Gone()
            if resp.status != 200:
                body = await resp.read()
                raise WatchRefused(f"WATCH {self.path}: HTTP {resp.status}: {body[:500]!r}")
            async for line in _lines(resp.content):
                self.handle(read_watch_line(line))

    def handle(self, event: WatchLine) -> None:
        """Act on one line: move the version, trigger a reconcile, or raise on an error."""
        POD_EVENTS.labels(event.type).inc()
        if event.type == "ERROR":
            error = event.error or {}
            if error.get("code") == 410:
                raise _Gone()
            raise WatchRefused(f"WATCH {self.path}: {error.get('message') or error}")
        if event.resource_version:
            self.resource_version = event.resource_version
        if event.trainjob is not None and self.accepts(event.trainjob[0]):
            self.on_change(*event.trainjob)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """LIST, then WATCH for ever (until cancelled), resuming and re-listing as needed."""
        failures = 0
        while True:
            try:
                if self.resource_version is None:
                    relist = self.listed.is_set()
                    await self.list_pods(session)
                    self.listed.set()
                    if relist:
                        logger.info("Pod watch (%s) listed again after a gap", self.where)
                        self.on_relist()
                await self.watch_once(session)
                failures = 0
            except _Gone:
                logger.info("Pod watch (%s): version expired (410), listing again", self.where)
                self.resource_version = None
            except Exception as exc:  # noqa: BLE001 - a watch that stops would go unnoticed
                # Unreachable, refused, a malformed answer, a failing callback: logged and
                # tried again (the watch resumes from the last version it saw).
                delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
                failures += 1
                logger.warning(
                    "Pod watch (%s) failed, again in %.0f s: %s: %s",
                    self.where,
                    delay,
                    type(exc).__name__,
                    exc,
                )
                await asyncio.sleep(delay)


@contextlib.asynccontextmanager
async def pod_watches(
    config: KubeConfig,
    namespaces: list[str] | None,
    label_selector: str,
    on_change: OnChange,
    on_relist: Callable[[], None],
) -> AsyncIterator[list[PodWatch]]:
    """Run the pod watches for ``namespaces`` (None or empty: all) inside the ``async with``;
    cancelled and closed when it ends."""
    secure = urllib.parse.urlsplit(config.host).scheme == "https"
    connector = aiohttp.TCPConnector(ssl=ssl_context(config) if secure else False)
    accepts = namespace_matcher(namespaces)
    watches = [
        PodWatch(config, scope, label_selector, on_change, on_relist, accepts)
        for scope in watch_scopes(namespaces)
    ]
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(w.run(session), name=f"pod watch {w.where}") for w in watches]
        try:
            yield watches
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task


__all__ = [
    "POD_EVENTS",
    "RETRY_DELAYS",
    "WATCH_TIMEOUT_SECONDS",
    "PodWatch",
    "WatchLine",
    "WatchRefused",
    "namespace_matcher",
    "pod_watches",
    "read_watch_line",
    "watch_scopes",
]
