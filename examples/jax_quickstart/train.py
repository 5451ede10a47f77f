"""The JAX quickstart: a small MLP regression trained data-parallel with ``jax.jit``.

Used by ``examples/jax.yaml`` (``trainjob run``; config keys ``steps``, ``lr``,
``batch_size``) and ``examples/tpu-v6e-4x4.yaml``. Each JAX process makes its share of every
global batch; the batch is one array sharded over all devices of all processes
(``jax.make_array_from_process_local_data``) and the parameters are replicated, so ``jax.jit``
averages the gradients across processes (gloo on CPU, ICI/DCN on TPU). Plain JAX: the
optimizer is a few lines of Adam, the checkpoint is ``np.save`` of every array.

Resumable: every ``checkpoint_every`` steps rank 0 saves the parameters, the optimizer state
and the step; a restarted or re-run job continues after the latest committed checkpoint.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

import trainer_runtime as tr
from trainer_runtime import Checkpoint

Params = dict[str, Any]

FEATURES = 8
HIDDEN = 32


def make_batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``y = sin(x @ a) + 0.5 * (x @ b)`` with a little noise."""
    coeffs = np.random.default_rng(1234)  # the same target function everywhere
    a = coeffs.normal(size=FEATURES).astype(np.float32) / np.sqrt(FEATURES)
    b = coeffs.normal(size=FEATURES).astype(np.float32) / np.sqrt(FEATURES)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype(np.float32)
    y = np.sin(x @ a) + 0.5 * (x @ b) + 0.01 * rng.normal(size=n).astype(np.float32)
    return x, y.astype(np.float32)


def init_params(seed: int = 0) -> dict[str, np.ndarray]:
    """An 8-32-1 MLP."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.normal(size=(FEATURES, HIDDEN)) / np.sqrt(FEATURES)).astype(np.float32),
        "b1": np.zeros(HIDDEN, np.float32),
        "w2": (rng.normal(size=(HIDDEN, 1)) / np.sqrt(HIDDEN)).astype(np.float32),
        "b2": np.zeros(1, np.float32),
    }


def predict(params: Params, x: Any) -> Any:
    """The MLP's output for a batch ``x`` (shape ``[n, FEATURES]``)."""
    import jax.numpy as jnp

    hidden = jnp.tanh(x @ params["w1"] + params["b1"])
    return (hidden @ params["w2"] + params["b2"])[:, 0]


def loss_fn(params: Params, x: Any, y: Any) -> Any:
    """Mean squared error."""
    import jax.numpy as jnp

    return jnp.mean((predict(params, x) - y) ** 2)


def save_checkpoint(folder: Path, step: int, arrays: dict[str, dict[str, np.ndarray]]) -> None:
    """``np.save`` every array (``params/w1.npy``, ``m/w1.npy``...) and ``meta.json``."""
    for group, tree in arrays.items():
        (folder / group).mkdir(parents=True, exist_ok=True)
        for name, value in tree.items():
            np.save(folder / group / f"{name}.npy", value)
    (folder / "meta.json").write_text(json.dumps({"step": step}))


def load_checkpoint(folder: Path) -> tuple[int, dict[str, dict[str, np.ndarray]]]:
    """The step and arrays :func:`save_checkpoint` wrote."""
    step = int(json.loads((folder / "meta.json").read_text())["step"])
    arrays = {
        group.name: {f.stem: np.load(f) for f in sorted(group.glob("*.npy"))}
        for group in sorted(folder.iterdir())
        if group.is_dir()
    }
    return step, arrays


def train_func(config: dict[str, Any]) -> None:
    """Train for ``config['steps']`` steps (Adam, ``lr``, global ``batch_size``)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    steps = int(config.get("steps", 100))
    lr = float(config.get("lr", 0.01))
    batch_size = int(config.get("batch_size", 128))
    checkpoint_every = int(config.get("checkpoint_every", 10))
    rank = tr.get_context().get_world_rank()

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, P())
    sharded = NamedSharding(mesh, P("data"))
    local_batch = max(1, batch_size // jax.process_count())
    local_batch -= local_batch % jax.local_device_count()  # whole rows per local device
    if local_batch == 0:
        raise ValueError(
            f"batch_size={batch_size} is too small for {jax.device_count()} devices; "
            f"use at least {jax.device_count()}"
        )

    params = init_params()
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(v) for k, v in params.items()}
    start = 0
    checkpoint = tr.get_checkpoint()
    if checkpoint is not None:  # resume after the saved step
        with checkpoint.as_directory() as folder:
            saved_step, arrays = load_checkpoint(Path(folder))
        params, m, v = arrays["params"], arrays["m"], arrays["v"]
        start = saved_step + 1

    def to_global(tree: dict[str, np.ndarray]) -> Params:
        return {k: jax.make_array_from_process_local_data(replicated, a) for k, a in tree.items()}

    state = (to_global(params), to_global(m), to_global(v))

    @jax.jit
    def train_step(state: Any, t: Any, x: Any, y: Any) -> Any:
        p, m1, v1 = state
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        m1 = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m1, grads)
        v1 = jax.tree.map(lambda a, g: 0.999 * a + 0.001 * g * g, v1, grads)
        scale = jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
        p = jax.tree.map(lambda w, a, b: w - lr * scale * a / (jnp.sqrt(b) + 1e-8), p, m1, v1)
        return (p, m1, v1), loss

    def host(array: Any) -> np.ndarray:
        return np.asarray(array.addressable_data(0))

    for step in range(start, steps):
        x, y = make_batch(local_batch, seed=step * 1000 + jax.process_index())
        gx = jax.make_array_from_process_local_data(sharded, x)
        gy = jax.make_array_from_process_local_data(sharded, y)
        state, loss = train_step(state, jnp.float32(step + 1), gx, gy)
        ckpt = None
        checkpoint_step = (step + 1) % checkpoint_every == 0 or step + 1 == steps
        if checkpoint_step and rank == 0:  # replicated: one copy; every rank calls report()
            out = Path(tempfile.mkdtemp(prefix="jax_quickstart_"))
            p, m1, v1 = state
            save_checkpoint(
                out,
                step,
                {
                    "params": {k: host(a) for k, a in p.items()},
                    "m": {k: host(a) for k, a in m1.items()},
                    "v": {k: host(a) for k, a in v1.items()},
                },
            )
            ckpt = Checkpoint.from_directory(out)
        tr.report(
            {"step": step, "loss": float(host(loss)), "processes": jax.process_count()},
            checkpoint=ckpt,
        )


def validate_func(checkpoint: Checkpoint, config: dict[str, Any]) -> dict[str, Any]:
    """Score a committed checkpoint on held-out data: ``val_loss`` (MSE) at ``val_step``."""
    import jax.numpy as jnp

    with checkpoint.as_directory() as folder:
        step, arrays = load_checkpoint(Path(folder))
    x, y = make_batch(int(config.get("samples", 1024)), seed=2**31 - 1)  # not a training seed
    params = {k: jnp.asarray(a) for k, a in arrays["params"].items()}
    return {"val_loss": float(loss_fn(params, jnp.asarray(x), jnp.asarray(y))), "val_step": step}
