"""The test suite's runner: ``make test`` (everything) and ``make test-quick`` (the inner loop).

``python -m tests.suite`` runs the whole suite as four pytest tiers, chosen by marker
(:mod:`tests.conftest` marks each test by what it needs), and overlaps what can overlap on a
2-core machine:

* ``unit``: no Ray, no Kubernetes, no image (``not (ray or k8s or node or slow)``), after
  ruff and mypy. This plus the checks is ``--quick``.
* ``ray``: a real local Ray, real processes (torchrun, ``trainjob run``), ``ray.train`` side by
  side (``ray or slow``), over two pytest-xdist workers.
* ``k8s``: a real kube-apiserver + etcd (envtest), kube-scheduler placement, the chart applied.
* ``node``: the real single-node cluster, images built from the Dockerfile.

Two lanes run side by side: the light one (ruff, mypy, ``unit``, ``k8s``, then ``node``) and
the heavy one (``ray``, which keeps both cores busy). ``node`` starts when ``k8s`` ends, so that
its set-up (the node, the chart, fake-gcs-server: a minute and more) runs while ``ray`` still
does, but its scenarios, which load both cores too, wait for ``ray``'s end
(:func:`tests.support.waiting.wait_for_suite_gate`): the two together overload 2 cores (Ray
nodes then time out starting). Provisioning (the Kubernetes binaries, the node's host side, the
images; minutes from an empty cache, nothing when cached) runs in the background from the
start, so ``unit`` and ``ray`` run while it builds; ``k8s`` waits for the binaries and ``node``
for the images. A tier's time in the closing table leaves out what it waited for another.

The tiers' output goes to ``.test-logs/<tier>.log`` and is printed whole as each tier ends;
the run ends with a table of each tier's time against its budget and one closing line
(``N passed, N failed, N skipped``). A tier over its budget is reported, not failed: these
machines are shared and noisy (docs/development/testing.md says what to do about it).

``--tier NAME`` (repeatable) runs only those tiers; arguments after ``--`` go to every pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / ".test-logs"

QUICK_MARKERS = "not (ray or k8s or node or slow)"


@dataclass(frozen=True)
class Tier:
    """One pytest run of the suite."""

    name: str
    markers: str
    budget_min: float
    lane: int  # tiers of one lane run one after another; lanes run side by side
    needs: str = ""  # "" | "kubernetes" | "node": what provisioning must have made first
    xdist_workers: int = 0  # pytest-xdist processes (0: none)
    after: str = ""  # a tier whose end this one's heavy part waits for (its set-up does not)


TIERS: tuple[Tier, ...] = (
    # Lane 0, light: after ruff and mypy; k8s once the Kubernetes binaries exist; then node,
    # which sets its cluster up while ray runs and starts its scenarios once ray ended.
    Tier("unit", QUICK_MARKERS, 5.0, lane=0),
    Tier("k8s", "k8s and not node", 8.0, lane=0, needs="kubernetes"),
    Tier("node", "node", 11.0, lane=0, needs="node", after="ray"),
    # Lane 1, heavy: the Ray tier keeps both cores busy (Ray clusters, real processes) from
    # the start, while the images build.
    Tier("ray", "(ray or slow) and not (k8s or node)", 16.0, lane=1, xdist_workers=2),
)
CHECKS: tuple[tuple[str, list[str]], ...] = (
    ("ruff", [sys.executable, "-m", "ruff", "check", "."]),
    ("ruff format", [sys.executable, "-m", "ruff", "format", "--check", "."]),
    ("mypy", [sys.executable, "-m", "mypy"]),
)


def _stamp() -> str:
    return time.strftime("%H:%M:%S")


_print_lock = threading.Lock()


def say(message: str) -> None:
    """One progress line, whole even when lanes print at once."""
    with _print_lock:
        print(f"[suite {_stamp()}] {message}", flush=True)


@dataclass
class Result:
    """What one tier (or check) did."""

    name: str
    seconds: float = 0.0
    returncode: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0

    @property
    def ok(self) -> bool:
        # pytest's 5: every test of the tier was deselected or skipped at collection.
        return self.returncode in (0, 5)


@dataclass
class Provisioning:
    """The Kubernetes binaries, then the node's host side and images, in a thread of their own;
    the tiers that need them wait on :meth:`wait`."""

    want_node: bool
    log: Path
    done: dict[str, threading.Event] = field(
        default_factory=lambda: {"kubernetes": threading.Event(), "node": threading.Event()}
    )
    error: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        threading.Thread(target=self._run, name="provisioning", daemon=True).start()

    def wait(self, what: str) -> str | None:
        """Block until ``what`` is provisioned; returns why not, or None."""
        self.done[what].wait()
        return self.error.get(what)

    def _run(self) -> None:
        sys.path.insert(0, str(REPO))
        from tests.support import EnvTestError, ensure_assets
        from tests.support.node import build_images, provision_host, unsupported_reason

        started = time.monotonic()
        with self.log.open("w") as out:
            try:
                say("provisioning: the Kubernetes binaries (a build of minutes when not cached)")
                ensure_assets(output=out)
                self.seconds["kubernetes"] = time.monotonic() - started
                say(f"provisioning: Kubernetes binaries ready ({self.seconds['kubernetes']:.0f}s)")
            except (EnvTestError, OSError) as e:
                self.error["kubernetes"] = self.error["node"] = f"Kubernetes binaries: {e}"
            self.done["kubernetes"].set()
            reason = unsupported_reason()
            if not self.want_node or "kubernetes" in self.error or reason is not None:
                say(f"provisioning: no node images ({reason or 'not needed'})")
                self.done["node"].set()
                return
            try:
                say("provisioning: the node's host side and the images from the Dockerfile")
                provision_host(output=out)
                build_images(output=out, jax=True)
                self.seconds["node"] = time.monotonic() - started
                say(f"provisioning: node images ready ({self.seconds['node']:.0f}s in all)")
            except (EnvTestError, OSError) as e:
                self.error["node"] = f"node provisioning: {e}"
            self.done["node"].set()


def _counts(junit: Path) -> tuple[int, int, int, int]:
    """(passed, failed, skipped, errors) from pytest's JUnit XML."""
    if not junit.is_file():
        return 0, 0, 0, 0
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = failed = skipped = errors = 0
    for suite in suites:
        tests += int(suite.get("tests", 0))
        failed += int(suite.get("failures", 0))
        skipped += int(suite.get("skipped", 0))
        errors += int(suite.get("errors", 0))
    return tests - failed - skipped - errors, failed, skipped, errors


def failure_lines(junit: Path, limit: int = 600) -> list[str]:
    """One line per failed or erroring test of pytest's JUnit XML: its id and the start of its
    message (the assertion, the exception), so the end of a long log still says what failed.
    Tests failing with the same message (a module fixture's error) share one line."""
    if not junit.is_file():
        return []
    seen: dict[tuple[str, str], list[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        for outcome in ("failure", "error"):
            element = case.find(outcome)
            if element is None:
                continue
            message = " ".join((element.get("message") or element.text or "").split())
            if len(message) > limit:
                message = message[:limit] + " [...]"
            test = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
            seen.setdefault((outcome, message), []).append(test)
    lines = []
    for (outcome, message), tests in seen.items():
        more = f" and {len(tests) - 1} more" if len(tests) > 1 else ""
        lines.append(f"{tests[0]}{more} ({outcome}): {message}")
    return lines


@dataclass
class Gates:
    """One file per tier of the run that another waits for, created when that tier ends
    (whatever its outcome); its path goes to the waiting tier as ``TRAINJOB_SUITE_GATE``."""

    files: dict[str, Path] = field(default_factory=dict)
    opened_at: dict[str, float] = field(default_factory=dict)  # time.monotonic()

    @classmethod
    def for_tiers(cls, tiers: Sequence[Tier]) -> Gates:
        names = {t.name for t in tiers}
        gates = cls({t.after: LOGS / f".{t.after}.ended" for t in tiers if t.after in names})
        for path in gates.files.values():
            path.unlink(missing_ok=True)
        return gates

    def open(self, name: str) -> None:
        if name in self.files:
            self.opened_at[name] = time.monotonic()
            self.files[name].touch()


def run_tier(
    tier: Tier,
    extra: Sequence[str],
    provisioning: Provisioning | None,
    gates: Gates | None = None,
) -> Result:
    """Run one tier's pytest, its output to ``.test-logs/<tier>.log``; print it at the end.
    Its time leaves out what it waited for the tier it comes after (``gates``)."""
    try:
        return _run_tier(tier, extra, provisioning, gates or Gates())
    finally:
        if gates is not None:
            gates.open(tier.name)


def _run_tier(
    tier: Tier, extra: Sequence[str], provisioning: Provisioning | None, gates: Gates
) -> Result:
    result = Result(tier.name)
    env = dict(os.environ)
    gate = gates.files.get(tier.after)
    if gate is not None:
        from tests.support.waiting import SUITE_GATE_ENV

        env[SUITE_GATE_ENV] = str(gate)
    if tier.needs and provisioning is not None:
        why = provisioning.wait(tier.needs)
        if why is not None:
            # Its tests fail at once with this error (tests.support.raise_if_provisioning_failed)
            # instead of building again; the tests that need no cluster still run.
            say(f"{tier.name}: provisioning failed ({why.splitlines()[0]}); not retried")
            from tests.support.envtest import PROVISION_ERROR_ENV

            env[PROVISION_ERROR_ENV] = why
    log = LOGS / f"{tier.name}.log"
    junit = LOGS / f"{tier.name}.xml"
    junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", tier.markers, f"--junitxml={junit}"]
    cmd += ["-o", "junit_family=xunit1", "-p", "no:cacheprovider"]
    if tier.xdist_workers:
        # Scheduled by tests/conftest.py's pytest_xdist_make_scheduler (by module, or by test).
        cmd += ["-n", str(tier.xdist_workers)]
    cmd += list(extra)
    say(f"{tier.name}: started ({shlex.join(cmd[1:])})")
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
    ended = time.monotonic()
    result.seconds = ended - max(started, gates.opened_at.get(tier.after, started))
    result.returncode = proc.returncode
    result.passed, result.failed, result.skipped, result.errors = _counts(junit)
    with _print_lock:
        print(f"\n{'=' * 30} tier {tier.name}: output {'=' * 30}", flush=True)
        print(log.read_text(errors="replace"), end="", flush=True)
        print(f"{'=' * 30} tier {tier.name}: end {'=' * 30}\n", flush=True)
    say(
        f"{tier.name}: {'ok' if result.ok else f'FAILED (exit {proc.returncode})'}, "
        f"{result.passed} passed, {result.failed + result.errors} failed, "
        f"{result.skipped} skipped in {result.seconds / 60:.1f} min"
    )
    return result


def run_checks() -> Result:
    """ruff, ruff format and mypy, one after another: one result, ``checks``."""
    result = Result("checks")
    for name, cmd in CHECKS:
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
        seconds = time.monotonic() - started
        result.seconds += seconds
        output = (proc.stdout + proc.stderr).strip()
        say(f"{name}: {'ok' if proc.returncode == 0 else 'FAILED'} ({seconds:.0f}s)")
        if proc.returncode != 0:
            result.returncode = proc.returncode
            result.failed += 1
            with _print_lock:
                print(output, flush=True)
        else:
            result.passed += 1
    return result


BUDGETS = {t.name: t.budget_min for t in TIERS}


def over_budget(result: Result) -> bool:
    """Whether a tier took longer than its budget (the checks have none)."""
    budget = BUDGETS.get(result.name)
    return budget is not None and result.seconds / 60 > budget


def table(results: Sequence[Result], wall: float) -> str:
    """The closing table: each tier's time, its budget, its counts."""
    lines = [
        "| tier | minutes | budget | passed | failed | skipped |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        budget = BUDGETS.get(r.name)
        over = over_budget(r)
        lines.append(
            f"| {r.name} | {r.seconds / 60:.1f}{' (over)' if over else ''} | "
            f"{'' if budget is None else f'{budget:.0f}'} | {r.passed} | "
            f"{r.failed + r.errors} | {r.skipped} |"
        )
    lines.append(f"| all (wall clock) | {wall / 60:.1f} | | | | |")
    return "\n".join(lines)


def _lanes(
    tiers: Sequence[Tier],
    extra: Sequence[str],
    provisioning: Provisioning | None,
    checks: bool,
    gates: Gates | None = None,
) -> list[list[Callable[[], Result]]]:
    """The jobs of each lane, in order (the checks first in lane 0)."""
    lanes: list[list[Callable[[], Result]]] = [[run_checks] if checks else []]
    for tier in tiers:
        while len(lanes) <= tier.lane:
            lanes.append([])
        job: Callable[[], Result] = lambda t=tier: run_tier(  # noqa: E731
            t, extra, provisioning, gates
        )
        lanes[tier.lane].append(job)
    return [lane for lane in lanes if lane]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the suite; returns the exit status (0 only when every check and tier passed)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in args_list:
        extra = args_list[args_list.index("--") + 1 :]
        args_list = args_list[: args_list.index("--")]
    parser = argparse.ArgumentParser(prog="python -m tests.suite", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="ruff, mypy, the unit tier")
    parser.add_argument("--tier", action="append", choices=[t.name for t in TIERS])
    parser.add_argument("--no-checks", action="store_true", help="skip ruff and mypy")
    args = parser.parse_args(args_list)

    names = ["unit"] if args.quick else (args.tier or [t.name for t in TIERS])
    tiers = [t for t in TIERS if t.name in names]
    LOGS.mkdir(exist_ok=True)
    started = time.monotonic()
    say(f"tiers: {', '.join(t.name for t in tiers)}; logs in {LOGS.relative_to(REPO)}/")

    provisioning = None
    if any(t.needs for t in tiers):
        from tests.cluster.conftest import SKIP_ENVS
        from tests.k8s.conftest import SKIP_ENV

        want_node = any(t.needs == "node" for t in tiers) and not any(
            os.environ.get(v) == "1" for v in SKIP_ENVS
        )
        skip_all = os.environ.get(SKIP_ENV) == "1"
        provisioning = Provisioning(want_node=want_node, log=LOGS / "provision.log")
        if skip_all:
            for event in provisioning.done.values():
                event.set()
        else:
            provisioning.start()

    gates = Gates.for_tiers(tiers)
    lanes = _lanes(tiers, extra, provisioning, checks=not args.no_checks, gates=gates)
    lane_results: list[list[Result]] = [[] for _ in lanes]

    def run_lane(index: int) -> None:
        for job in lanes[index]:
            lane_results[index].append(job())

    threads = [
        threading.Thread(target=run_lane, args=(i,), name=f"lane-{i}") for i in range(len(lanes))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    by_name = {r.name: r for lane in lane_results for r in lane}
    results = [by_name[name] for name in ["checks", *names] if name in by_name]

    wall = time.monotonic() - started
    if provisioning is not None and provisioning.seconds:
        parts = ", ".join(f"{k} {v / 60:.1f} min" for k, v in provisioning.seconds.items())
        say(f"provisioning took: {parts} (from the start of the run)")
    print(table(results, wall), flush=True)
    over = [r.name for r in results if over_budget(r)]
    if over:
        say(
            f"over budget: {', '.join(over)}: see docs/development/testing.md, 'Keeping the "
            "suite fast' (the slowest tests are at the end of each tier's log)"
        )
    failed = [r.name for r in results if not r.ok]
    tests = [r for r in results if r.name != "checks"]  # the closing line counts tests
    passed = sum(r.passed for r in tests)
    failures = sum(r.failed + r.errors for r in tests)
    skipped = sum(r.skipped for r in tests)
    if failed:
        for result in tests:
            for line in failure_lines(LOGS / f"{result.name}.xml"):
                say(f"failed in {result.name}: {line}")
        say(f"FAILED: {', '.join(failed)}")
    # The closing line CI reads.
    print(f"{passed} passed, {failures} failed, {skipped} skipped", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
