"""Running a TrainJob: the in-cluster driver and ``trainjob run``.

Depends on the TrainJob API (:mod:`trainjob_operator.api`), the constants, the REST client
(:mod:`trainjob_operator.kube`) and the runtime (:mod:`trainer_runtime`), never on the
operator's renderers, planner or reconciler (``tests/test_import_graph.py`` checks it): the
operator and the driver meet only in the TrainJob and its status.

- :mod:`.trainer`: a TrainJob -> a planned run (entrypoints, workers, storage) -> the
  runtime's TorchTrainer/JaxTrainer;
- :mod:`.status`: :class:`~.status.StatusTracker`, the runtime's view of a run as TrainJob
  status;
- :mod:`.driver`: the driver pod's program (``python -m trainjob_operator.launcher.driver``,
  the command the operator renders): loads its TrainJob, runs it on the job's Ray cluster and
  publishes the status;
- :mod:`.local`: ``trainjob run MANIFEST`` on an embedded local Ray, with :mod:`.progress`, its
  progress display.

Nothing is imported here, so ``import trainjob_operator.launcher`` loads neither Ray nor the
runtime.
"""
