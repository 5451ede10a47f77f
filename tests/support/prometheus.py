"""A real Prometheus server (Debian's ``prometheus`` package) for the metrics tests, and the
queries the chart ships (its PrometheusRule's alerts, its Grafana dashboards' panels).

``make test-tools`` installs the package with apt-get when run as root; without it, the tests
that need it are skipped with that reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import free_port
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "charts" / "trainjob-operator" / "dashboards"

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = (
    "Prometheus is not installed (Debian's prometheus package: `make test-tools` installs it "
    "with apt-get when run as root)"
)

#: What a dashboard's template variables stand for in a test query: every value.
_VARIABLES = {"$namespace": ".*", "$trainjob": ".*"}
#: Metric names in a PromQL expression (the project's metrics all start with trainjob_).
METRIC_NAME = re.compile(r"\btrainjob_[a-z_]+\b")


class PrometheusServer:
    """``prometheus`` scraping static targets every second, with its data in ``folder``."""

    def __init__(self, folder: Path, targets: dict[str, list[str]]) -> None:
        assert PROMETHEUS is not None, MISSING
        self.port = free_port()
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": hosts}]}
                for job, hosts in targets.items()
            ],
        }
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = folder / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.console.templates=/dev/null",
                "--web.console.libraries=/dev/null",
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for("Prometheus ready", self._ready, timeout=60, every=0.2)
        except BaseException:
            self.stop()
            raise

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector ``expr`` evaluates to now, or at Unix time ``at`` (AssertionError
        on a query error)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode()}") from exc
        assert body["status"] == "success", f"{expr}: {body}"
        result = body["data"]["result"]
        assert isinstance(result, list), f"{expr}: not a vector: {body['data']}"
        return result

    def wait_for_scrapes(self, job: str, count: int = 3) -> None:
        """Wait until every target of ``job`` was scraped successfully ``count`` times."""

        def scraped() -> bool:
            ups = self.query(f'count_over_time(up{{job="{job}"}}[1m])')
            healthy = self.query(f'up{{job="{job}"}} == 1')
            return (
                bool(ups)
                and len(healthy) == len(ups)
                and all(float(s["value"][1]) >= count for s in ups)
            )

        wait_for(f"{count} scrapes of {job}", scraped, timeout=60, every=0.5)

    def last_sample(self, selector: str) -> float | None:
        """Unix time of the latest sample of ``selector`` (a plain series selector) in the last
        10 minutes: a target's series go stale once it is gone, so query them at this time.
        (Read from the range vector's own samples: a subquery's steps fall on whole seconds
        and would miss a newer sample.)"""
        series = self.query(f"{selector}[10m]")
        times = [float(t) for s in series for t, _ in s["values"]]
        return max(times) if times else None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)


def dashboard_queries(name: str) -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every panel target of dashboard ``name`` (a JSON file of the
    chart's dashboards/), its template variables replaced by "every value"."""
    board = json.loads((DASHBOARDS / name).read_text())
    found = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in _VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr))
    return found


def metric_names(expr: str) -> set[str]:
    """The project's metric names an expression reads (``_bucket`` etc. kept as written)."""
    return set(METRIC_NAME.findall(expr))
