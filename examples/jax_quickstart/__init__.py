"""A small JAX regression model trained with ``trainer_runtime.jax.JaxTrainer``."""
