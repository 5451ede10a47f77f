"""The cluster verbs without a cluster: their parsers, the kubectl plugin entry point, the
tables they print, and how API answers become SDK errors (the CLI's one line and exit 2)."""

from __future__ import annotations

import datetime as dt
import io
import tomllib
from pathlib import Path
from typing import Any

import pytest

from trainjob_operator import cli
from trainjob_operator.api import parse_trainjob
from trainjob_operator.cluster_cli import StatusFeed, _RemoteStatus, list_rows, status_lines
from trainjob_operator.kube import ApiError, KubeClient, KubeConfig
from trainjob_operator.launcher.progress import ProgressDisplay
from trainjob_operator.sdk import (
    ClusterUnreachable,
    InvalidTrainJob,
    PermissionDenied,
    TrainJobClient,
    TrainJobExists,
    TrainJobNotFound,
)

REPO = Path(__file__).resolve().parents[2]


def test_kubectl_trainjob_is_the_same_entry_point() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-trainjob"] == scripts["trainjob"] == "trainjob_operator.cli:main"


@pytest.mark.parametrize(
    "verb", ["submit", "logs", "list", "status", "checkpoints", "suspend", "resume", "delete"]
)
def test_every_verb_takes_the_kubectl_options(verb: str) -> None:
    argv = [verb] + (["m.yaml"] if verb == "submit" else [] if verb == "list" else ["job"])
    args = cli.build_parser().parse_args([*argv, "-n", "ns", "--context", "c", "--kubeconfig", "k"])
    assert (args.namespace, args.context, args.kubeconfig) == ("ns", "c", "k")


def _client() -> TrainJobClient:
    return TrainJobClient(namespace="ns", kube=KubeClient(KubeConfig(host="https://127.0.0.1:1")))


@pytest.mark.parametrize(
    ("status", "body", "error", "words"),
    [
        (0, {"reason": "Unreachable", "message": "refused"}, ClusterUnreachable, "does not answer"),
        (403, {"message": "user alice cannot create"}, PermissionDenied, "forbidden by RBAC"),
        (404, {"details": {"kind": "namespaces"}}, TrainJobNotFound, "namespace 'ns' does not"),
        (
            404,
            {"reason": "NotFound", "details": {"kind": "trainjobs"}},
            TrainJobNotFound,
            "not found",
        ),
        (404, {"message": "the server could not find"}, ClusterUnreachable, "CRD installed"),
        (409, {"reason": "AlreadyExists"}, TrainJobExists, "already exists"),
        (
            400,
            {"message": 'admission webhook "validate.trainjob.dev" denied the request: spec.x: y'},
            InvalidTrainJob,
            'TrainJob ns/j: "validate.trainjob.dev" denied the request: spec.x: y',
        ),
    ],
)
def test_api_answers_become_errors_naming_the_trainjob(
    status: int, body: dict[str, object], error: type[Exception], words: str
) -> None:
    exc = _client()._error(ApiError(status, body, "POST /x"), "j", "create it")
    assert isinstance(exc, error)
    assert str(exc).startswith("TrainJob ns/j: ") and words in str(exc), str(exc)


def _job(**status: object) -> dict[str, object]:
    return {
        "apiVersion": "trainjob.dev/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "j", "namespace": "ns", "creationTimestamp": "2026-12-07T01:00:00Z"},
        "spec": {"entrypoint": "m:f", "checkpoint": {"scoreAttribute": "val_loss"}},
        "status": status,
    }


def test_list_rows() -> None:
    job = parse_trainjob(
        _job(
            phase="Running",
            progress={"step": 4, "metrics": {"loss": 0.5, "epoch": 4, "lr": 0.1}},
            bestCheckpoint={"path": "/r/j/checkpoint_000003", "score": 0.25},
        )
    )
    now = dt.datetime(2026, 12, 7, 3, 0, tzinfo=dt.UTC)
    assert list_rows([job], now)[1] == [
        "j",
        "Running",
        "4",
        "loss=0.5 epoch=4",
        "checkpoint_000003 val_loss=0.25",
        "2h",
    ]


def test_status_lines_show_conditions_restarts_and_events() -> None:
    obj = _job(
        phase="Restarting",
        message="restarting after the head pod failed",
        conditions=[{"type": "Ready", "status": "False", "reason": "Restarting", "message": "m"}],
        restarts=1,
        restartHistory=[{"attempt": 1, "reason": "HeadFailed", "message": "exit 137", "time": "t"}],
    )
    events = [
        {"type": "Warning", "reason": "HeadFailed", "message": "exit 137", "lastTimestamp": "t"}
    ]
    lines = status_lines(obj, events)
    assert lines[0] == "TrainJob ns/j: Restarting"
    assert "  Ready=False Restarting: m" in lines
    assert "  attempt 1 t HeadFailed (counted): exit 137" in lines
    assert lines[-1] == "  t Warning HeadFailed: exit 137"


def test_the_feed_prints_each_change_once() -> None:
    tracker = _RemoteStatus("val_loss")
    out = io.StringIO()
    display = ProgressDisplay(tracker, out, out, live=False, workers=2, score_attribute="val_loss")
    feed = StatusFeed(display, tracker, "uid-1")
    running = {"phase": "Running", "progress": {"step": 0}}
    event = {
        "metadata": {"uid": "e1"},
        "involvedObject": {"uid": "uid-1"},
        "reason": "R",
        "message": "m",
        "type": "Warning",
    }
    old_event = {"metadata": {"uid": "e0"}, "involvedObject": {"uid": "uid-0"}, "reason": "Old"}
    feed.update(running, [event, old_event])
    feed.update(running, [event])
    feed.update(running, [event])
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    # No Event told the move to Running by the next poll: a line of its own.
    assert lines == ["warning R: m", "Running"]


def _event(uid: str, reason: str, message: str, kind: str = "Normal") -> dict[str, object]:
    return {
        "metadata": {"uid": uid},
        "involvedObject": {"uid": "uid-1"},
        "reason": reason,
        "message": message,
        "type": kind,
    }


def test_the_feed_tells_each_phase_change_once() -> None:
    """The operator's Event of a phase change (posted alongside the status write, so a poll
    may see one without the other) is the line; the final line tells the terminal phase."""
    tracker = _RemoteStatus("val_loss")
    out = io.StringIO()
    display = ProgressDisplay(tracker, out, out, live=False, workers=2, score_attribute="val_loss")
    feed = StatusFeed(display, tracker, "uid-1")
    starting = {"phase": "Starting", "message": "waiting for pods: 0/2 workers ready"}
    created = _event("e1", "Created", "TrainJob accepted; Starting: " + starting["message"])
    feed.update(starting, [])  # the status came first
    feed.update(starting, [created])
    running = {"phase": "Running", "message": "2/2 workers ready"}
    feed.update(running, [created])
    feed.update(running, [created])  # no Event by now: the phase line
    feed.update(running, [created, _event("e2", "Running", "2/2 workers ready")])  # late
    restarting = {"phase": "Restarting", "message": "restart 1 of 1: the driver exited 1"}
    failed = _event("e3", "DriverFailed", restarting["message"], "Warning")
    feed.update(restarting, [failed])
    report = {"epoch": 1, "train_loss": 0.4}
    both = {**report, "val_accuracy": 0.9, "val_loss": 0.3}
    ckpt = {"path": "/r/j/checkpoint_000001", "step": 1, "metrics": both}
    ended = {
        "phase": "Failed",
        "message": "the driver exited 1",
        "progress": {"step": 1, "metrics": report},
        "latestCheckpoint": ckpt,
        "bestCheckpoint": {**ckpt, "score": 0.3},
        "validations": {"done": 1},
    }
    feed.update(ended, [_event("e4", "DriverFailed", "the driver exited 1", "Warning")])
    display.close(ended)
    lines = [line.split("] ", 1)[1] for line in out.getvalue().splitlines()]
    assert lines == [
        "Created: TrainJob accepted; Starting: waiting for pods: 0/2 workers ready",
        "Running: 2/2 workers ready",
        "warning DriverFailed: restart 1 of 1: the driver exited 1",
        # the reported metrics when committed, the validation's (score first) when validated
        "checkpoint_000001 committed (step 1: epoch=1 train_loss=0.4)",
        "checkpoint_000001 validated: val_loss=0.3 val_accuracy=0.9 (best so far)",
        "Failed: the driver exited 1",
    ]


def test_dashboard_refusals_say_the_fix_and_the_port_forward_keeps_the_kubeconfig() -> None:
    from trainjob_operator.cluster_cli import dashboard_refusal, port_forward_command

    job: dict[str, Any] = _job(phase="Running")
    assert dashboard_refusal(job) == (
        "TrainJob ns/j: it has no dashboard Service; add one (its pods keep running): "
        "kubectl -n ns patch trainjob j --type merge -p "
        """'{"spec":{"ray":{"dashboard":{"service":true}}}}'"""
    )
    job["spec"] = {"ray": {"dashboard": {"service": True}}}
    job["status"]["phase"] = "Succeeded"
    assert "its dashboard Service is not there (phase Succeeded)" in str(dashboard_refusal(job))
    job["status"]["dashboard"] = {"service": "j-dashboard"}
    assert dashboard_refusal(job) is None
    assert port_forward_command("kubectl", "ns", {"service": "j-dashboard"}, 9000) == [
        "kubectl",
        "-n",
        "ns",
        "port-forward",
        "svc/j-dashboard",
        "9000:8265",
    ]
    assert port_forward_command(
        "/bin/kubectl", "ns", {"service": "s"}, 8265, context="c", kubeconfig="k"
    )[:5] == ["/bin/kubectl", "--kubeconfig", "k", "--context", "c"]


def test_the_guides_sdk_snippet_imports() -> None:
    import importlib.util

    path = REPO / "docs" / "snippets" / "sdk_client.py"
    spec = importlib.util.spec_from_file_location("snippet_sdk_client", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.main)


def test_ctrl_c_stops_following_not_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainjob_operator import cluster_cli

    obj = _job(phase="Running")

    class Client:
        namespace = "ns"

        def get(self, name: str) -> object:
            return parse_trainjob(obj)

        def get_object(self, name: str) -> dict[str, object]:
            return obj

        def events(self, name: str) -> list[dict[str, object]]:
            return []

    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_cli.time, "sleep", interrupt)
    out, err = io.StringIO(), io.StringIO()
    assert cluster_cli.follow(Client(), "j", out, err, live=False) == 130  # type: ignore[arg-type]
    assert err.getvalue() == (
        "Stopped following TrainJob ns/j; it keeps running. Follow it again: trainjob logs -n ns "
        "j -f; stop it: trainjob delete -n ns j (or trainjob suspend -n ns j to keep its pods' "
        "capacity free and resume later).\n"
    )


def test_checkpoints_lists_the_run_folder_in_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trainjob checkpoints`` and ``TrainJobClient.result`` read what a run committed (a
    local-mode run here; on a cluster the driver writes the same folder)."""
    import tempfile

    from trainer_runtime import (
        Checkpoint,
        CheckpointConfig,
        DataParallelTrainer,
        RunConfig,
        ScalingConfig,
        report,
    )
    from trainjob_operator import cluster_cli

    def train(config: dict[str, object]) -> None:
        for step in range(2):
            folder = tempfile.mkdtemp()
            Path(folder, "w.txt").write_text("x")
            report({"val_loss": 1.0 / (step + 1)}, checkpoint=Checkpoint.from_directory(folder))

    storage = tmp_path / "runs"
    DataParallelTrainer(
        train,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(
            name="j",
            storage_path=str(storage),
            checkpoint_config=CheckpointConfig(
                checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    body = _job()
    body["spec"] = {
        "entrypoint": "m:f",
        "checkpoint": {"scoreAttribute": "val_loss", "scoreOrder": "min"},
        "storage": {"path": str(storage)},
    }
    client = _client()
    monkeypatch.setattr(client, "get", lambda name: parse_trainjob(body))
    monkeypatch.setattr(cluster_cli, "_client", lambda args: client)
    result = client.result("j")
    assert [c.name for c in result.checkpoints] == ["checkpoint_000000", "checkpoint_000001"]
    args = cli.build_parser().parse_args(["checkpoints", "j"])
    assert args.func(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Run folder: {storage}/j"
    assert out[1].split() == ["CHECKPOINT", "STEP", "VALIDATION", "METRICS", "PATH"]
    assert out[2].split()[:4] == ["checkpoint_000000", "0", "committed", "val_loss=1"]
    assert out[-2] == f"Best: {storage}/j/checkpoint_000001"
    assert out[-1].startswith(f"Latest: {storage}/j/checkpoint_000001 ")


def test_events_of_one_second_keep_the_order_they_were_written_in() -> None:
    """The API server lists Events by name (random); whole-second timestamps tie. Seen in CI:
    'Running' shown before 'Created' by submit --follow."""
    from trainjob_operator.sdk.client import _event_order

    def event(name: str, reason: str, when: str, version: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "resourceVersion": version},
            "reason": reason,
            "lastTimestamp": when,
        }

    listed = [
        event("my-job.aaa", "Running", "2026-12-07T07:00:02Z", "1205"),
        event("my-job.zzz", "Created", "2026-12-07T07:00:02Z", "1190"),
        event("my-job.bbb", "Succeeded", "2026-12-07T07:00:09Z", "1100"),  # a later second wins
    ]
    ordered = [e["reason"] for e in sorted(listed, key=_event_order)]
    assert ordered == ["Created", "Running", "Succeeded"]
