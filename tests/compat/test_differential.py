"""The same user code under ``ray.train`` 2.60 and under ``trainer_runtime``.

Each case runs one train function from ``tests/compat/workloads.py`` with both (only the
import differs: ``config["api"]``) and asserts that what a user can observe is the same:
metrics, which checkpoints are kept and in what order, what ``get_checkpoint()`` returns
when, the exception types, ``Result`` fields.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.compat.workloads import (
    api,
    collective_train,
    data_draw,
    data_train,
    jax_train,
    read_step,
    recording_callback,
    reported_train,
    shared_names_train,
    steps_train,
    upload_fn_train,
    validate,
    validation_without_config,
    world_size_train,
)

os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
APIS = ["ray.train", "trainer_runtime"]
pytestmark = pytest.mark.ray


def _modules(name: str, trainer: str = "dp") -> tuple[ModuleType, Any]:
    """The API module and its trainer: ``dp`` the DataParallelTrainer (the workloads use no
    torch: importing it costs every worker seconds of CPU), ``torch`` or ``jax``."""
    if name == "ray.train":
        import ray.train  # needs pandas, pyarrow, tensorboardX: the test extra installs them

        if trainer == "jax":
            from ray.train.v2.jax import JaxTrainer

            return ray.train, JaxTrainer
        if trainer == "dp":
            from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

            return ray.train, DataParallelTrainer
        from ray.train.torch import TorchTrainer

        return ray.train, TorchTrainer
    import trainer_runtime

    if trainer == "jax":
        from trainer_runtime.jax import JaxTrainer as OurJaxTrainer

        return trainer_runtime, OurJaxTrainer
    if trainer == "dp":
        return trainer_runtime, trainer_runtime.DataParallelTrainer
    from trainer_runtime.torch import TorchTrainer as OurTorchTrainer

    return trainer_runtime, OurTorchTrainer


PREEMPTION_CASES = {
    "test_a_preempted_node_restarts_the_worker_group_elsewhere_from_the_final_checkpoint"
}
"""The cases about preemption, which need Ray Train's preemption watcher."""


@pytest.fixture(autouse=True)
def _no_ray_train_preemption_watcher(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray Train's preemption watcher off (``RAY_TRAIN_ENABLE_PREEMPTION_WATCHER=0``, which
    its driver passes to the controller) in the cases that are not about preemption: an actor
    more per fit() that polls the GCS cost about a quarter of each ray.train fit's CPU here."""
    if request.node.originalname not in PREEMPTION_CASES:
        monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")


def _fit(
    name: str,
    tmp_path: Path,
    fn: Callable[..., Any],
    config: dict[str, Any],
    *,
    workers: int | tuple[int, int] = 2,
    trainer: str = "dp",
    scaling: dict[str, Any] | None = None,
    **run: Any,
) -> Any:
    train, trainer_cls = _modules(name, trainer)
    run = _resolve(name, run)
    extra = {k: run.pop(k) for k in list(run) if k == "validation_config"}
    run_config = train.RunConfig(name="run", storage_path=str(tmp_path / name), **run)
    trainer = trainer_cls(
        fn,
        train_loop_config={"api": name, **config},
        scaling_config=train.ScalingConfig(num_workers=workers, **(scaling or {})),
        run_config=run_config,
        **extra,
    )
    return trainer.fit()


def _both(
    tmp_path: Path, fn: Callable[..., Any], config: dict[str, Any], **kw: Any
) -> dict[str, Any]:
    out = {}
    for name in APIS:
        out[name] = _fit(name, tmp_path, fn, config, **kw)
    return out


def _resolve(name: str, kw: dict[str, Any]) -> dict[str, Any]:
    """Config objects are built per API from ``(class name, args, kwargs)`` recipes."""
    train, _ = _modules(name)
    out = dict(kw)
    for key, value in kw.items():
        if isinstance(value, tuple) and value and isinstance(value[0], str):
            cls_name, args, kwargs = value
            built = {k: _resolve(name, {"_": v})["_"] for k, v in kwargs.items()}
            out[key] = getattr(train, cls_name)(*args, **built)
    return out


def _kept(result: Any) -> list[dict[str, Any]]:
    """The kept checkpoints' metrics in ``best_checkpoints`` order, with each one's step."""
    return [
        {
            **{k: m[k] for k in sorted(m) if k in ("step", "loss", "val_score")},
            "saved": read_step(c),
        }
        for c, m in result.best_checkpoints
    ]


def test_top_k_by_score_keeps_the_same_checkpoints_in_the_same_order(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """Top 2 by ``loss`` of ten checkpoints reported in both upload modes, taking turns (one
    run per API: the best two are one of each mode, the ones they push out of both), and
    ``Result.from_path`` of the run."""
    losses = [0.5, 0.2, 0.9, 0.1, 0.7, 0.6, 0.05, 0.8, 0.15, 0.3]
    results = _both(
        tmp_path,
        steps_train,
        {"steps": len(losses), "losses": losses, "modes": ["SYNC", "ASYNC"]},
        checkpoint_config=(
            "CheckpointConfig",
            (),
            {
                "num_to_keep": 2,
                "checkpoint_score_attribute": "loss",
                "checkpoint_score_order": "min",
            },
        ),
    )
    ray_result, ours = results["ray.train"], results["trainer_runtime"]
    assert _kept(ours) == _kept(ray_result)
    assert [k["saved"] for k in _kept(ray_result)] == [3, 6]  # ASYNC's, then SYNC's
    assert ours.metrics["step"] == ray_result.metrics["step"] == 9
    assert read_step(ours.checkpoint) == read_step(ray_result.checkpoint)
    best = (ray_result.get_best_checkpoint("loss", "min"), ours.get_best_checkpoint("loss", "min"))
    assert read_step(best[0]) == read_step(best[1]) == 6
    # Result.from_path (os.PathLike, as Ray accepts) of the run: the same checkpoints in both.
    rebuilt = {}
    for name, result in results.items():
        train, _ = _modules(name)
        rebuilt[name] = _kept(train.Result.from_path(Path(result.path)))
        with pytest.raises(RuntimeError):
            train.Result.from_path(str(tmp_path / "no-such-run"))
    assert rebuilt["trainer_runtime"] == rebuilt["ray.train"]
    # Every checkpoint the run kept, worst first: the latest (step 9) too, which fit() leaves
    # out of best_checkpoints.
    assert [k["saved"] for k in rebuilt["ray.train"]] == [9, 3, 6]


def test_resume_after_a_failure_and_get_checkpoint(tmp_path: Path, ray_cluster: Any) -> None:
    """On the TorchTrainer: ``get_checkpoint()`` is the latest reported checkpoint after each
    report; a failure within ``max_failures`` restarts the group from the latest one."""
    seen = {}
    for name in APIS:
        log = tmp_path / f"{name}.log"
        config = {"steps": 4, "fail_at": 2, "fail_marker": str(tmp_path / f"{name}.failed")}
        result = _fit(
            name,
            tmp_path,
            steps_train,
            {**config, "log": str(log)},
            trainer="torch",
            failure_config=("FailureConfig", (), {"max_failures": 1}),
        )
        seen[name] = ([json.loads(line) for line in log.read_text().splitlines()], result)
    (ray_log, ray_result), (our_log, ours) = seen["ray.train"], seen["trainer_runtime"]
    # The first attempt saw none, then each report's; the second resumed from step 1.
    assert our_log == ray_log == [[None, 0, 1], [1, 2, 3]]
    assert ours.metrics["step"] == ray_result.metrics["step"] == 3


def test_a_failing_train_function_raises_the_same_exceptions(
    tmp_path: Path, ray_cluster: Any
) -> None:
    errors = {}
    for name in APIS:
        train, _ = _modules(name)
        with pytest.raises(train.TrainingFailedError) as info:
            _fit(name, tmp_path, steps_train, {"steps": 3, "always_fail": True})
        errors[name] = (train, info.value)
    for train, error in errors.values():
        assert isinstance(error, train.WorkerGroupError)
        assert not isinstance(error, train.ControllerError)
        assert set(error.worker_failures) == {0}  # only the rank that raised
        assert isinstance(error.worker_failures[0], ZeroDivisionError)


def test_validation_without_a_trainer_config_is_the_same_value_error(
    tmp_path: Path, ray_cluster: Any
) -> None:
    for name in APIS:
        train, _ = _modules(name)
        with pytest.raises(train.WorkerGroupError) as info:
            _fit(name, tmp_path, validation_without_config, {}, workers=1)
        failure = info.value.worker_failures[0]
        assert isinstance(failure, ValueError), (name, failure)
        assert "`validation_config` was not set on the trainer" in str(failure)


def test_validation_metrics_join_the_checkpoints_and_rank_them(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """``report(validation=True)`` (the trainer's ValidationConfig and its task_config) and
    ``report(validation=ValidationTaskConfig(...))`` taking turns in one run per API."""
    results = _both(
        tmp_path,
        steps_train,
        {"steps": 4, "validation": "mixed"},
        validation_config=(
            "ValidationConfig",
            (validate,),
            {"task_config": ("ValidationTaskConfig", (), {"fn_kwargs": {"scale": 10.0}})},
        ),
        checkpoint_config=(
            "CheckpointConfig",
            (),
            {"num_to_keep": 2, "checkpoint_score_attribute": "val_score"},
        ),
    )
    kept = _kept(results["ray.train"])
    assert _kept(results["trainer_runtime"]) == kept
    # Step 3's task kwargs (offset) merged with the trainer's (scale): 10 * (3 + 3); step 2
    # by the trainer's alone: 10 * 2, kept over step 1's equal 10 * (1 + 1) as the later.
    assert kept == [
        {"step": 2, "val_score": 20.0, "saved": 2},
        {"step": 3, "val_score": 60.0, "saved": 3},
    ]


def test_shared_names_shared_folders_empty_checkpoints_and_the_return_value(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """Every rank's shard merged into one checkpoint under a ``checkpoint_dir_name``, ranks
    storing one file name (identical content) into it, ranks reporting one local folder
    holding every rank's shard, an empty checkpoint folder, and ``Result.return_value``
    (rank 0's)."""
    seen = {}
    for name in APIS:
        result = _fit(name, tmp_path, shared_names_train, {"shared": str(tmp_path / f"{name}-sh")})
        kept = []
        first_folder = None  # the step-0 checkpoint's folder name
        for checkpoint, metrics in result.best_checkpoints:
            with checkpoint.as_directory() as folder:
                files = sorted(
                    (p.name, p.read_bytes()[:20].decode())
                    for p in Path(folder).iterdir()
                    if not p.name.startswith(".")
                )
            kept.append((metrics["step"], files))
            if metrics["step"] == 0:
                first_folder = Path(checkpoint.path).name
        seen[name] = {"kept": kept, "return_value": result.return_value, "named": first_folder}
    assert seen["trainer_runtime"] == seen["ray.train"]
    assert seen["ray.train"]["return_value"] == {"rank": 0, "answer": [42, "x"]}
    assert [step for step, _ in seen["ray.train"]["kept"]] == [0, 1, 2]
    shards = [("checkpoint.pkl", "the same on every ra"), ("shard_0.txt", "0:0")]
    assert seen["ray.train"]["kept"][0] == (0, [*shards, ("shard_1.txt", "0:1")])
    assert seen["ray.train"]["named"] == "ckpt_shards"
    assert seen["ray.train"]["kept"][2] == (2, [])


def test_elastic_scaling_configs_are_refused_with_ray_trains_sentences() -> None:
    """Each of our messages starts with Ray Train's sentence (users match its text)."""
    bad: list[dict[str, Any]] = [
        {"num_workers": (3, 2)},
        {"num_workers": (-1, 2)},
        {"num_workers": -1},
        {"num_workers": (1, 2, 3)},
        {"num_workers": "2"},
        {"num_workers": (1, 2), "elastic_resize_monitor_interval_s": -1.0},
        {"num_workers": (1, 3), "label_selector": [{"pool": "a"}] * 2},
    ]
    for kwargs in bad:
        messages = {}
        for name in APIS:
            train, _ = _modules(name)
            with pytest.raises(ValueError) as info:
                train.ScalingConfig(**kwargs)
            messages[name] = str(info.value)
        assert messages["trainer_runtime"].startswith(messages["ray.train"]), messages
    for name in APIS:
        train, _ = _modules(name)
        config = train.ScalingConfig(num_workers=(2, 4))
        assert (config.elasticity_enabled, config.min_workers, config.max_workers) == (True, 2, 4)


def test_an_elastic_run_starts_with_as_many_workers_as_fit(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """``num_workers=(1, 4)`` of 3 CPUs each on the session's 6 CPUs: 2 workers, both."""
    for name in APIS:
        result = _fit(
            name,
            tmp_path,
            world_size_train,
            {},
            workers=(1, 4),
            scaling={"resources_per_worker": {"CPU": 3}},
        )
        assert result.metrics == {"world_size": 2, "rank": 0}, name
        assert read_step(result.checkpoint) == 0, name


def test_local_mode_runs_the_same_function_in_this_process(
    tmp_path: Path, ray_cluster: Any
) -> None:
    results = _both(tmp_path, steps_train, {"steps": 3, "losses": [3.0, 2.0, 1.0]}, workers=0)
    assert results["trainer_runtime"].metrics == results["ray.train"].metrics
    assert read_step(results["trainer_runtime"].checkpoint) == 2


def _checkpoint_then_metrics_only(config: dict[str, Any]) -> None:
    """``{"a": 1}`` with a checkpoint from rank 0, then ``{"a": 2}`` without a checkpoint."""
    train = api(config)
    checkpoint = None
    if train.get_context().get_world_rank() == 0:
        folder = tempfile.mkdtemp(prefix="compat_")
        (Path(folder) / "state.json").write_text(json.dumps({"step": 0}))
        checkpoint = train.Checkpoint.from_directory(folder)
    train.report({"a": 1}, checkpoint=checkpoint)
    train.report({"a": 2})


def test_result_metrics_are_the_latest_checkpoints_not_the_last_reports(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """A report with a checkpoint, then one without: Result.metrics is the checkpoint's
    report's. (A run with no checkpoint at all has none: asserted on the collectives' run.)"""
    results = _both(tmp_path, _checkpoint_then_metrics_only, {})
    ray_result, ours = results["ray.train"], results["trainer_runtime"]
    assert ours.metrics == ray_result.metrics == {"a": 1}
    assert read_step(ours.checkpoint) == read_step(ray_result.checkpoint) == 0


def test_local_mode_result_metrics_are_the_last_reports(tmp_path: Path, ray_cluster: Any) -> None:
    # Ray Train's local mode (num_workers=0): Result.metrics is the last report()'s metrics,
    # checkpoint or not. (Its Result.checkpoint is the last report's, None here; ours stays
    # the latest committed one: a documented difference.)
    results = _both(tmp_path, _checkpoint_then_metrics_only, {}, workers=0)
    ray_result, ours = results["ray.train"], results["trainer_runtime"]
    assert ours.metrics == ray_result.metrics == {"a": 2}
    assert ray_result.checkpoint is None
    assert read_step(ours.checkpoint) == 0


def _logged(tmp_path: Path, name: str) -> list[Any]:
    path = tmp_path / f"{name}.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


UPLOAD_CASES = [
    ["SYNC", True, None],
    ["ASYNC", True, None],
    ["SYNC", True, True],
    ["ASYNC", True, False],
    ["SYNC", False, True],
    ["ASYNC", False, None],
]
"""(checkpoint_upload_mode, a checkpoint_upload_fn or not, delete_local_checkpoint_after_upload)
of each case, in the order one run reports them."""


def test_checkpoint_upload_fn_and_delete_after_upload(tmp_path: Path, ray_cluster: Any) -> None:
    """Who stores the checkpoint (a checkpoint_upload_fn or the runtime), what
    get_checkpoint() returns after each report, and which reported folders are deleted: each
    case of :data:`UPLOAD_CASES` three reports long, one case after another in one run."""
    steps = 3
    kept = {}
    for name in APIS:
        config = {"steps": steps, "cases": UPLOAD_CASES, "log": str(tmp_path / f"{name}.log")}
        result = _fit(
            name,
            tmp_path,
            upload_fn_train,
            config,
            checkpoint_config=("CheckpointConfig", (), {"num_to_keep": 2}),
        )
        kept[name] = _kept(result)
    ours, rays = _logged(tmp_path, "trainer_runtime"), _logged(tmp_path, "ray.train")
    assert len(ours) == len(rays) == len(UPLOAD_CASES)
    assert kept["trainer_runtime"] == kept["ray.train"]
    cases = zip(UPLOAD_CASES, ours, rays, strict=True)
    for index, ((mode, _, _), our_case, ray_case) in enumerate(cases):
        case = (index, UPLOAD_CASES[index])
        assert our_case["sources_left"] == ray_case["sources_left"], case
        steps_of_case = list(range(index * steps, (index + 1) * steps))
        if mode == "SYNC":
            assert our_case["seen"] == ray_case["seen"] == steps_of_case, case
        else:  # stored in the background: how far the uploads got depends on timing, in both
            for seen in (our_case["seen"], ray_case["seen"]):
                pairs = zip(steps_of_case, seen, strict=True)
                assert all(s is None or s <= step for step, s in pairs), case


def test_an_upload_fn_returning_another_folder_is_the_same_value_error(
    tmp_path: Path, ray_cluster: Any
) -> None:
    for name in APIS:
        train, _ = _modules(name)
        with pytest.raises(train.WorkerGroupError) as info:
            _fit(
                name,
                tmp_path,
                upload_fn_train,
                {"steps": 1, "upload_fn": True, "bad_upload": True, "log": str(tmp_path / "x")},
                workers=1,
            )
        failure = info.value.worker_failures[0]
        assert isinstance(failure, ValueError), (name, failure)
        assert "returned a checkpoint outside the experiment directory" in str(failure)


def test_get_all_reported_checkpoints_lists_the_same_checkpoints(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """Kept by loss (num_to_keep=2, the latest kept too); the first and the last reports
    validated, the two between not: one run lists validated and unvalidated checkpoints."""
    for name in APIS:
        _fit(
            name,
            tmp_path,
            reported_train,
            {
                "losses": [0.5, 0.2, 0.1, 0.9],
                "validate_steps": [0, 3],
                "log": str(tmp_path / f"{name}.log"),
            },
            checkpoint_config=(
                "CheckpointConfig",
                (),
                {
                    "num_to_keep": 2,
                    "checkpoint_score_attribute": "loss",
                    "checkpoint_score_order": "min",
                },
            ),
            validation_config=("ValidationConfig", (validate,), {}),
        )
    ours, rays = _logged(tmp_path, "trainer_runtime"), _logged(tmp_path, "ray.train")
    assert ours == rays
    assert [step for step, _, _ in rays[0]] == [3, 1, 2]  # kept, worst first, latest kept
    validated = [step for step, metrics, _ in rays[0] if "val_score" in metrics]
    assert validated == [3], rays


def test_collectives_give_every_rank_the_same_data(tmp_path: Path, ray_cluster: Any) -> None:
    """Also, as in test_result_metrics_are_the_latest_checkpoints_not_the_last_reports: a run
    that reported no checkpoint has no Result.metrics (None, not its last report's)."""
    results = {
        name: _fit(name, tmp_path, collective_train, {"log": str(tmp_path / f"{name}.log")})
        for name in APIS
    }
    ours = sorted(_logged(tmp_path, "trainer_runtime"), key=lambda x: x["rank"])
    rays = sorted(_logged(tmp_path, "ray.train"), key=lambda x: x["rank"])
    assert ours == rays
    assert [x["got"]["from"] for x in rays] == [0, 0] and [x["again"] for x in rays] == [0, 0]
    ray_result, our_result = results["ray.train"], results["trainer_runtime"]
    assert our_result.metrics == ray_result.metrics is None
    assert our_result.checkpoint is None and ray_result.checkpoint is None


def test_user_callbacks_see_the_same_reports_and_exceptions(
    tmp_path: Path, ray_cluster: Any
) -> None:
    for name in APIS:
        marker = tmp_path / f"{name}.failed"
        _fit(
            name,
            tmp_path,
            steps_train,
            {"steps": 3, "fail_at": 1, "fail_marker": str(marker)},
            failure_config=("FailureConfig", (), {"max_failures": 1}),
            callbacks=[recording_callback(name, str(tmp_path / f"{name}.log"))],
        )
    ours, rays = _logged(tmp_path, "trainer_runtime"), _logged(tmp_path, "ray.train")
    assert ours == rays
    assert ["after_exception", {"0": "RuntimeError"}] in rays


def test_jax_trainer_on_cpu_gives_the_same_result(tmp_path: Path, ray_cluster: Any) -> None:
    results = _both(tmp_path, jax_train, {}, trainer="jax")
    ray_result, ours = results["ray.train"], results["trainer_runtime"]
    assert ours.metrics == ray_result.metrics == {"step": 1, "value": 12.0}
    assert _kept(ours) == _kept(ray_result)


def test_a_preempted_node_restarts_the_worker_group_elsewhere_from_the_final_checkpoint(
    tmp_path: Path,
) -> None:
    """Rank 1's Ray node drained for preemption mid-run (its own multi-node cluster per API,
    in a separate process: ``tests/compat/preemption_main.py``). With Ray Train's defaults
    both restart the group in place, off the drained node, from the checkpoint the train
    function took on the notice, and ``fit()`` succeeds; with ``max_preemption_failures=0``
    both raise ``PreemptionError`` naming rank 1's node."""
    from tests.faults.preemption_main import run_scenario

    # One process per API at the same time: each scenario mostly waits (drains, deadlines).
    with ThreadPoolExecutor(len(APIS)) as pool:
        runs = {
            api: pool.submit(run_scenario, "tests.compat.preemption_main", tmp_path, api)
            for api in APIS
        }
        seen = {api: run.result()[api] for api, run in runs.items()}

    def default_outcome(run: dict[str, Any]) -> dict[str, Any]:
        (kept,) = run["kept"]  # the one checkpoint, taken on the notice
        assert kept["saved"] == kept["step"], run
        resumed = run["resumed"]  # rank -> its node and first step in the restarted group
        assert run["drained_node"] not in [r["node"] for r in resumed.values()], run
        return {
            "outcome": run["outcome"],
            "kept_preempted_ranks": kept["preempted_ranks"],
            "resumed_from_it": {r["start"] for r in resumed.values()} == {kept["step"] + 1},
            "resumed_ranks": sorted(resumed),
        }

    def no_retries_outcome(run: dict[str, Any]) -> dict[str, Any]:
        return {
            "outcome": run["outcome"],
            "preempted_ranks": run["preempted_ranks"],
            "names_the_drained_node": run["preempted_node_ids"] == [run["drained_node"]],
        }

    ray_train, ours = seen["ray.train"], seen["trainer_runtime"]
    assert default_outcome(ours["default"]) == default_outcome(ray_train["default"]), seen
    assert default_outcome(ours["default"]) == {
        "outcome": None,
        "kept_preempted_ranks": [1],
        "resumed_from_it": True,
        "resumed_ranks": ["rank0", "rank1"],
    }
    assert no_retries_outcome(ours["no_retries"]) == no_retries_outcome(ray_train["no_retries"])
    assert no_retries_outcome(ours["no_retries"]) == {
        "outcome": "PreemptionError",
        "preempted_ranks": [1],
        "names_the_drained_node": True,
    }
    # By design (README): ours ends the attempt at the commit; Ray Train waits for the deadline.
    assert ours["no_retries"]["drain_timed_out"] is False

    # relax_collectives_on_preemption: rank 1 hangs and its node is drained; with the option
    # rank 0 is told without it, rank 1's node is removed, and rank 0 commits the checkpoint
    # it took on the notice; without it rank 0 waits for rank 1 until the deadline and
    # nothing is committed.
    def relax_outcome(run: dict[str, Any]) -> dict[str, Any]:
        # Ray's Result.from_path raises RuntimeError for a run that committed no checkpoint
        # (it writes its snapshot file with the first one); ours lists none (README).
        kept = [] if run["kept"] == "RuntimeError" else run["kept"]
        return {
            "outcome": run["outcome"],
            "preempted_ranks": run["preempted_ranks"],
            "kept": [(k["preempted_ranks"], k["saved"] == k["step"]) for k in kept],
            "told_and_removed": run["removed_node"] == run["drained_node"],
        }

    for run_name in ("relaxed", "strict"):
        assert relax_outcome(ours[run_name]) == relax_outcome(ray_train[run_name]), (run_name, seen)
    assert relax_outcome(ours["relaxed"]) == {
        "outcome": "PreemptionError",
        "preempted_ranks": [1],
        "kept": [([1], True)],
        "told_and_removed": True,
    }
    assert ours["strict"]["kept"] == [] and ours["strict"]["removed_node"] is None


def _data_summary(log: Path) -> dict[str, Any]:
    """What each attempt's ranks read, per epoch: per-rank row counts, whether the ranks'
    rows are disjoint and cover the dataset, the shards' types, the whole ``valid`` dataset
    on every rank, the driver's DataContext, and whether the epochs drew other numbers
    (the dataset was executed again)."""
    records = [json.loads(line) for line in log.read_text().splitlines()]
    out: dict[str, Any] = {}
    for first in (True, False):
        attempt = [r for r in records if r["first_attempt"] is first]
        epochs: dict[int, list[dict[str, Any]]] = {}
        for r in attempt:
            epochs.setdefault(r["epoch"], []).append(r)
        summary = {}
        for epoch, recs in sorted(epochs.items()):
            ids = [i for r in recs for i in r["ids"]]
            summary[epoch] = {
                "ranks": sorted(r["rank"] for r in recs),
                "counts": sorted(len(r["ids"]) for r in recs),
                "disjoint_and_whole": sorted(ids) == list(range(40)),
                "valid_whole": all(r["valid"] == list(range(10)) for r in recs),
                "valid_counts": sorted(len(r["valid"]) for r in recs),
                "valid_union": sorted(i for r in recs for i in r["valid"]) == list(range(10)),
                "types": sorted({tuple(r["types"]) for r in recs}),
                "context": sorted({r["context"] for r in recs}),
            }
        if not first and len(epochs) == 2:
            draws = [sorted(d for r in epochs[e] for d in r["draws"]) for e in (0, 1)]
            summary["re_executed"] = draws[0] != draws[1]
        out["failed_attempt" if first else "last_attempt"] = summary
    return out


def test_ray_data_ingestion_splits_and_reexecutes_the_same(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """``datasets=`` + ``DataConfig(datasets_to_split=["train"])`` + ``get_dataset_shard``:
    equal streaming splits of ``train``, ``valid`` whole on every worker, each epoch a new
    execution, the driver's DataContext in the workers, and a new split after a restart. On
    the DataParallelTrainer (TorchTrainer's base, which handles ``datasets``): a TorchTrainer
    cost about 30 CPU-seconds more (torch in every worker) and checked nothing more."""
    import ray.data
    from ray.data import DataContext

    summaries = {}
    ctx = DataContext.get_current()
    ctx.set_config("compat_marker", "driver")
    try:
        for name in APIS:
            train, trainer_cls = _modules(name, "dp")
            log = tmp_path / f"{name}.log"
            datasets = {
                "train": ray.data.range(40, override_num_blocks=4).map(data_draw),
                "valid": ray.data.range(10),
            }
            trainer_cls(
                data_train,
                train_loop_config={
                    "api": name,
                    "epochs": 2,
                    "log": str(log),
                    "fail_dir": str(tmp_path / f"{name}.failed"),
                },
                scaling_config=train.ScalingConfig(num_workers=2),
                run_config=train.RunConfig(
                    name="run",
                    storage_path=str(tmp_path / name),
                    failure_config=train.FailureConfig(max_failures=1),
                ),
                datasets=datasets,
                dataset_config=train.DataConfig(datasets_to_split=["train"]),
            ).fit()
            summaries[name] = _data_summary(log)
    finally:
        ctx.remove_config("compat_marker")
    ours, theirs = summaries["trainer_runtime"], summaries["ray.train"]
    assert ours == theirs
    epoch = {
        "ranks": [0, 1],
        "counts": [20, 20],
        "disjoint_and_whole": True,
        "valid_whole": True,
        "valid_counts": [10, 10],
        "valid_union": False,
        "types": [("StreamSplitDataIterator", "DataIteratorImpl")],
        "context": ["driver"],
    }
    assert ours == {
        "failed_attempt": {0: epoch},
        "last_attempt": {0: epoch, 1: epoch, "re_executed": True},
    }


def test_ray_data_with_jax_trainer_splits_every_dataset_by_default(
    tmp_path: Path, ray_cluster: Any
) -> None:
    """``JaxTrainer(datasets=...)`` with the default ``DataConfig()``: every dataset split."""
    import ray.data

    summaries = {}
    for name in APIS:
        train, trainer_cls = _modules(name, "jax")
        log = tmp_path / f"{name}.log"
        trainer_cls(
            data_train,
            train_loop_config={
                "api": name,
                "epochs": 2,
                "log": str(log),
                "fail_dir": str(tmp_path / "unused"),
                "fail_once": False,
            },
            scaling_config=train.ScalingConfig(num_workers=2),
            run_config=train.RunConfig(name="run", storage_path=str(tmp_path / name)),
            datasets={
                "train": ray.data.range(40, override_num_blocks=4).map(data_draw),
                "valid": ray.data.range(10),
            },
        ).fit()
        summaries[name] = _data_summary(log)
    ours, theirs = summaries["trainer_runtime"], summaries["ray.train"]
    assert ours == theirs
    epoch = {
        "ranks": [0, 1],
        "counts": [20, 20],
        "disjoint_and_whole": True,
        "valid_whole": False,
        "valid_counts": [5, 5],
        "valid_union": True,
        "types": [("StreamSplitDataIterator", "StreamSplitDataIterator")],
        "context": [None],
    }
    assert ours == {"failed_attempt": {}, "last_attempt": {0: epoch, 1: epoch, "re_executed": True}}
