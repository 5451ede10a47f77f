# --8<-- [start:fanout]
import json
import tempfile
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import trainer_runtime as tr


@ray.remote(num_cpus=0)  # no Ray resources: the shards share the validation's pod
def score_shard(folder: str, shard: int) -> float:
    model = json.loads(Path(folder, "model.json").read_text())  # load your model
    return abs(model["weight"] - shard)  # and score it on shard `shard` of your data


def validate(checkpoint: tr.Checkpoint, config: dict) -> dict:
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    shard_task = score_shard.options(scheduling_strategy=here)
    with tempfile.TemporaryDirectory() as folder:
        checkpoint.to_directory(folder)  # downloaded once, read by every shard on this node
        losses = ray.get([shard_task.remote(folder, i) for i in range(config["shards"])])
    return {"val_loss": sum(losses) / len(losses)}
    # --8<-- [end:fanout]


def train_func(config: dict) -> None:
    for step in range(config["steps"]):
        folder = tempfile.mkdtemp()
        Path(folder, "model.json").write_text(json.dumps({"weight": step}))
        tr.report({"step": step}, checkpoint=tr.Checkpoint.from_directory(folder))


def main(storage_path: str = "/tmp/runs", shards: int = 3) -> tr.Result:
    validation = tr.ValidationConfig(
        validate_fn=validate, validate_config={"shards": shards}, timeout_s=120
    )
    return tr.DataParallelTrainer(
        train_func,
        train_loop_config={"steps": 2},
        scaling_config=tr.ScalingConfig(num_workers=1),
        run_config=tr.RunConfig(
            name="shards", storage_path=storage_path, validation_config=validation
        ),
    ).fit()
