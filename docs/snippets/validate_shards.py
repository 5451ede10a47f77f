import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


@ray.remote(num_cpus=0)
def score_shard(path: str, shard: int) -> float: ...


def validate(checkpoint, config):
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    shard_task = score_shard.options(scheduling_strategy=here)
    losses = ray.get([shard_task.remote(checkpoint.path, i) for i in range(config["shards"])])
    return {"val_loss": sum(losses) / len(losses)}
