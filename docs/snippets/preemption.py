import json
import tempfile
from pathlib import Path

import trainer_runtime as tr


def train_func(config):
    start = 0
    if (ckpt := tr.get_checkpoint()) is not None:
        with ckpt.as_directory() as d:
            start = json.loads(Path(d, "state.json").read_text())["step"] + 1
    saved = False
    for step in range(start, config["steps"]):
        ...  # one training step
        if tr.get_preemption_info() is not None and not saved:  # every rank calls it
            d = tempfile.mkdtemp()
            Path(d, "state.json").write_text(json.dumps({"step": step}))
            tr.report({"step": step}, checkpoint=tr.Checkpoint.from_directory(d))
            saved = True  # the attempt ends once this checkpoint is committed
        else:
            tr.report({"step": step})
