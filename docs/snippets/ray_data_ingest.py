"""Ray Data ingestion: the trainer splits ``train`` among its workers, ``valid`` goes whole to each.

tests/runtime/test_datasets.py runs ``main()`` on the test session's Ray cluster with two workers.
"""

import ray.data
import torch

import trainer_runtime
from trainer_runtime import DataConfig, RunConfig, ScalingConfig
from trainer_runtime.torch import TorchTrainer


def train_fn(config):
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(config["epochs"]):
        # This worker's part of Ray Data's streaming_split; each pass executes the dataset
        # again (one epoch), streaming batches while the model trains.
        shard = trainer_runtime.get_dataset_shard("train")
        rows = 0
        for batch in shard.iter_torch_batches(batch_size=16, dtypes=torch.float32):
            x, y = batch["x"].unsqueeze(1), batch["y"].unsqueeze(1)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows += len(x)
        # Not in datasets_to_split: every worker reads all of it.
        valid = trainer_runtime.get_dataset_shard("valid")
        val_rows = sum(len(b["x"]) for b in valid.iter_batches(batch_size=32))
        trainer_runtime.report({"epoch": epoch, "rows": rows, "val_rows": val_rows})


def to_xy(batch):
    batch["x"] = batch["id"] / 100.0
    batch["y"] = 2 * batch["x"] + 1
    return batch


def main(storage_path, num_workers=2):
    train = ray.data.range(256).map_batches(to_xy)
    valid = ray.data.range(64).map_batches(to_xy)
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"epochs": 2},
        scaling_config=ScalingConfig(num_workers=num_workers),
        run_config=RunConfig(name="ray-data", storage_path=storage_path),
        datasets={"train": train, "valid": valid},
        dataset_config=DataConfig(datasets_to_split=["train"]),
    )
    return trainer.fit()
