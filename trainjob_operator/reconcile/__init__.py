"""Level-based reconciliation of a TrainJob: pure planning (``plan``) and thin I/O (``apply``)."""
