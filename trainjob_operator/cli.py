"""The ``trainjob`` command line.

Subcommands:

- ``trainjob validate MANIFEST...``: check TrainJob manifests against the API models;
- ``trainjob crd``: print the TrainJob CustomResourceDefinition;
- ``trainjob run MANIFEST``: run a TrainJob on this machine (implemented in
  :mod:`trainjob_operator.launcher.local`);
- ``trainjob operator``: run the operator (implemented in :mod:`trainjob_operator.operator_main`);
- ``trainjob submit|logs|list|status|checkpoints|suspend|resume|delete|dashboard``: TrainJobs on
  a cluster (implemented in :mod:`trainjob_operator.cluster_cli`, on the Python SDK
  :mod:`trainjob_operator.sdk`). The same entry point is installed as ``kubectl-trainjob``:
  ``kubectl trainjob logs NAME -f``.

Every subcommand's implementation is imported when it runs (``validate`` and ``crd`` from
:mod:`trainjob_operator.manifest_cli`), not at the top of this module: ``trainjob --help``
loads no API models, and ``validate`` and ``crd`` work without Ray, kopf or a cluster. Each
implementation is a function ``(args: argparse.Namespace) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from trainjob_operator import leader

__all__ = ["build_parser", "main"]

EXIT_OK = 0
EXIT_INVALID = 2
"""Exit status for invalid manifests, usage errors and unavailable subcommands."""


# --------------------------------------------------------------------------- subcommands
# Implemented elsewhere; imported only when the subcommand runs.


def _lazy(target: str, what: str, extra: str) -> Callable[[argparse.Namespace], int]:
    """A command that imports ``module:function`` when called and delegates to it."""

    def command(args: argparse.Namespace) -> int:
        module_name, _, func_name = target.partition(":")
        try:
            module = importlib.import_module(module_name)
            func: Callable[[argparse.Namespace], int] = getattr(module, func_name)
        except ImportError as exc:
            missing_dependency = getattr(exc, "name", None) not in (None, module_name)
            install = (
                f"; install 'trainjob-operator[{extra}]'" if extra and missing_dependency else ""
            )
            print(f"trainjob {what}: not available ({exc}){install}", file=sys.stderr)
            return EXIT_INVALID
        except AttributeError:
            print(f"trainjob {what}: not available ({target} is missing)", file=sys.stderr)
            return EXIT_INVALID
        return int(func(args))

    return command


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "run",
        help="run a TrainJob on this machine (embedded local Ray)",
        description=(
            "Run the TrainJob's train function on an embedded local Ray: workers as actors, "
            "checkpoints in spec.storage.path (or a local folder), validation as Ray tasks. "
            "The manifest is the same one you apply to a cluster. Progress is one live line on "
            "a terminal, plain lines otherwise (or with CI=true)."
        ),
    )
    parser.add_argument("manifest", help="TrainJob YAML file ('-' for stdin)")
    parser.add_argument(
        "--num-workers",
        type=int,
        default=None,
        metavar="N",
        help="override spec.scaling.numWorkers (0 runs in this process, without Ray workers)",
    )
    parser.add_argument(
        "--storage-path",
        default=None,
        metavar="PATH",
        help="override spec.storage.path (an absolute path, gs://bucket/prefix or s3://bucket/prefix)",
    )
    parser.add_argument(
        "--output",
        "-o",
        default=None,
        metavar="FILE",
        help="also write the final TrainJob status to FILE (.json for JSON, else YAML)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve the training's Prometheus metrics on PORT (/metrics) while it runs, as a "
        "driver pod does (default: $TRAINJOB_METRICS_PORT, else not served)",
    )
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="also show the Ray workers' output (always written to the log file named at the "
        "start) and info logs",
    )
    parser.set_defaults(
        func=_lazy("trainjob_operator.launcher.local:run_command", "run", "runtime")
    )


def _add_operator_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "operator",
        help="run the TrainJob operator (kopf) against the current cluster",
        description=(
            "Watch TrainJobs and reconcile their Ray head, workers, validation pool and status. "
            "Uses the in-cluster config, or the current kubeconfig context outside a cluster."
        ),
    )
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=None,
        metavar="NS",
        help="watch only this namespace (repeatable); default: all namespaces",
    )
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8080/healthz",
        metavar="URL",
        help="liveness endpoint (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        metavar="PORT",
        help="port of the Prometheus metrics endpoint, 0 to disable (default: %(default)s)",
    )
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve the validating admission webhook over HTTPS on PORT (0: no webhook; the "
        "chart uses 9443)",
    )
    parser.add_argument(
        "--webhook-cert-dir",
        default="/etc/trainjob-operator/webhook",
        metavar="DIR",
        help="folder with the webhook's tls.crt and tls.key (default: %(default)s)",
    )
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")

    leader.add_arguments(parser)
    parser.set_defaults(
        func=_lazy("trainjob_operator.operator_main:operator_command", "operator", "")
    )


_CLUSTER = "trainjob_operator.cluster_cli"


def _add_cluster_args(parser: argparse.ArgumentParser) -> None:
    """``--namespace``, ``--context`` and ``--kubeconfig``, as kubectl has them."""
    parser.add_argument(
        "--namespace",
        "-n",
        default=None,
        metavar="NS",
        help="namespace (default: the context's, else 'default')",
    )
    parser.add_argument(
        "--context", default=None, metavar="CONTEXT", help="kubeconfig context (default: current)"
    )
    parser.add_argument(
        "--kubeconfig",
        default=None,
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )


def _cluster_verb(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    verb: str,
    help_text: str,
    description: str,
    with_name: bool = True,
) -> argparse.ArgumentParser:
    parser = sub.add_parser(verb, help=help_text, description=description)
    if with_name:
        parser.add_argument("name", metavar="NAME", help="the TrainJob's name")
    _add_cluster_args(parser)
    parser.set_defaults(func=_lazy(f"{_CLUSTER}:{verb}_command", verb, "runtime"))
    return parser


def _add_cluster_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = _cluster_verb(
        sub,
        "submit",
        "create a TrainJob on the cluster, optionally with a local working dir",
        "Validate the manifest, package --working-dir DIR (honouring .gitignore and "
        "spec.runtimeEnv.excludes; at most 100 MiB) and upload it content-addressed under "
        "spec.storage.path, set spec.runtimeEnv.workingDir, and create the TrainJob. Nothing is "
        "created when a check fails (exit status 2). With --follow, show the progress as "
        "trainjob run does; exit status 0 when it succeeded, 1 when it failed; Ctrl-C stops "
        "following, not the job.",
        with_name=False,
    )
    submit.add_argument("manifest", metavar="MANIFEST", help="TrainJob YAML file")
    submit.add_argument(
        "--working-dir",
        default=None,
        metavar="DIR",
        help="ship DIR as the run's code (spec.runtimeEnv.workingDir)",
    )
    submit.add_argument(
        "--entrypoint-in-image",
        action="store_true",
        help="the entrypoints' modules are in the image, not in --working-dir",
    )
    submit.add_argument(
        "--follow", "-f", action="store_true", help="show the progress until the job ends"
    )
    logs = _cluster_verb(
        sub,
        "logs",
        "print the logs of a TrainJob's pod (the driver by default)",
        "Print the logs of one of the TrainJob's pods: the driver (the run's progress and the "
        "workers' output), the Ray head, a worker or a validation pod.",
    )
    logs.add_argument(
        "--follow", "-f", action="store_true", help="stream (waiting for the pod to start)"
    )
    logs.add_argument(
        "--role",
        default="driver",
        choices=("driver", "head", "worker", "validation", "data"),
        help="which pod (default: %(default)s)",
    )
    logs.add_argument(
        "--rank", type=int, default=0, metavar="N", help="the N-th pod of the role (default: 0)"
    )
    logs.add_argument("--tail", type=int, default=None, metavar="LINES", help="last LINES only")
    _cluster_verb(
        sub,
        "list",
        "list the TrainJobs of a namespace",
        "One line per TrainJob: phase, step, latest metrics, best checkpoint, age.",
        with_name=False,
    )
    _cluster_verb(
        sub,
        "status",
        "show a TrainJob's state",
        "Phase, conditions, restarts with their reasons, checkpoints and recent Events.",
    )
    _cluster_verb(
        sub,
        "checkpoints",
        "list a TrainJob's kept checkpoints (read from storage)",
        "The committed checkpoints in the run folder (spec.storage.path/NAME) with their "
        "metrics and validation status, the best and the latest; needs read access to the "
        "storage from this machine.",
    )
    _cluster_verb(
        sub,
        "suspend",
        "suspend a TrainJob",
        "Set spec.suspend: the pods are deleted, the checkpoints kept.",
    )
    _cluster_verb(
        sub,
        "resume",
        "resume a suspended TrainJob",
        "Clear spec.suspend: training resumes from the latest checkpoint.",
    )
    _cluster_verb(
        sub,
        "delete",
        "delete a TrainJob",
        "Delete the TrainJob and its pods; its storage is kept.",
    )
    dashboard = _cluster_verb(
        sub,
        "dashboard",
        "port-forward a TrainJob's Ray dashboard",
        "Run kubectl port-forward to the job's dashboard Service (spec.ray.dashboard.service: "
        "true) and print how to read its auth token.",
    )
    dashboard.add_argument(
        "--port", type=int, default=8265, metavar="PORT", help="local port (default: 8265)"
    )


# --------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    """The ``trainjob`` argument parser (all subcommands)."""
    parser = argparse.ArgumentParser(
        prog="trainjob",
        description="Distributed training on Ray as a Kubernetes resource (TrainJob).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    validate = sub.add_parser(
        "validate",
        help="check TrainJob manifests",
        description=(
            "Validate TrainJob manifests (multi-document YAML allowed) against the API: "
            "prints 'OK FILE (TrainJob/NAME)' per valid document and one line per problem "
            "('FILE: FIELD: MESSAGE (hint: ...)'). Exit status 2 when anything is invalid."
        ),
    )
    validate.add_argument("manifests", nargs="+", metavar="MANIFEST", help="YAML file or '-'")
    validate.add_argument("--quiet", "-q", action="store_true", help="print only problems")
    validate.set_defaults(
        func=_lazy("trainjob_operator.manifest_cli:validate_command", "validate", "")
    )

    crd = sub.add_parser(
        "crd",
        help="print the TrainJob CustomResourceDefinition",
        description="Print the TrainJob CRD YAML (pipe it to 'kubectl apply -f -').",
    )
    crd.set_defaults(func=_lazy("trainjob_operator.manifest_cli:crd_command", "crd", ""))

    _add_run_parser(sub)
    _add_operator_parser(sub)
    _add_cluster_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trainjob`` command; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help (0) and usage errors (2)
        return int(exc.code) if isinstance(exc.code, int) else EXIT_INVALID
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
