"""Submit a folder's code to the cluster, follow it, read the result (trainjob_operator.sdk)."""

from trainjob_operator.sdk import TrainJobClient, TrainJobError


def main() -> None:
    client = TrainJobClient(namespace="team-a")  # context=, kubeconfig= as kubectl has them
    try:
        job = client.submit("train.yaml", working_dir=".")  # or a dict, a TrainJob, a TrainJobSpec
    except TrainJobError as exc:  # names the TrainJob and the cause; nothing was created
        raise SystemExit(str(exc)) from None
    job = client.wait(
        job.name,
        timeout=3600,
        on_progress=lambda j: print(j.status.phase if j.status else "Pending"),
    )
    for line in client.logs(job.name, role="driver", tail_lines=20):
        print(line)
    result = client.result(job.name)  # a trainer_runtime.Result, read from spec.storage.path
    print(result.best_checkpoint, result.metrics)


if __name__ == "__main__":
    main()
