import tempfile

import torch

import trainer_runtime as tr
from trainer_runtime import (
    Checkpoint,
    CheckpointConfig,
    CheckpointUploadMode,
    RunConfig,
    ScalingConfig,
)
from trainer_runtime.torch import TorchTrainer, prepare_model


def validate(checkpoint: Checkpoint, config: dict) -> dict:
    with checkpoint.as_directory() as d:  # the *committed* copy, read from storage
        state = torch.load(f"{d}/model.pt")
    return {"val_loss": float(state["weight"].abs().sum())}


def train_func(config: dict) -> None:
    net = torch.nn.Linear(4, 1)
    model = prepare_model(net)  # DDP over gloo (CPU) or nccl (GPU); net holds the weights
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    start = 0
    if (ckpt := tr.get_checkpoint()) is not None:  # resume after a failure or a new driver
        with ckpt.as_directory() as d:
            start = torch.load(f"{d}/step.pt")["step"] + 1
    for step in range(start, config["steps"]):
        loss = model(torch.randn(32, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt = None
        if tr.get_context().get_world_rank() == 0:
            d = tempfile.mkdtemp()
            torch.save(net.state_dict(), f"{d}/model.pt")
            torch.save({"step": step}, f"{d}/step.pt")
            ckpt = Checkpoint.from_directory(d)
        tr.report(
            {"step": step, "loss": loss.item()},
            checkpoint=ckpt,
            checkpoint_upload_mode=CheckpointUploadMode.ASYNC,  # returns at once
            validate_fn=validate if ckpt else None,
        )  # runs on the validation pool


def main(num_workers: int = 2, storage_path: str = "/tmp/runs") -> tr.Result:
    result = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.1, "steps": 20},
        scaling_config=ScalingConfig(num_workers=num_workers),  # 0: in this process, no Ray
        run_config=RunConfig(
            name="demo",
            storage_path=storage_path,  # or gs://bucket/prefix, s3://bucket/prefix
            checkpoint_config=CheckpointConfig(
                num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min"
            ),
        ),
    ).fit()
    print(result.metrics, result.checkpoint, result.best_checkpoint)
    return result


if __name__ == "__main__":
    main()
