"""``helm install``, ``helm upgrade`` and ``helm uninstall`` through Helm's own Go SDK
(``helm_python``), for the docs' commands where no ``helm`` binary is installed.

``tests/k8s/test_docs_commands.py`` puts a ``helm`` that runs this module on the ``PATH`` of the
guides' commands; it takes the flags the guides use (``-n``/``--namespace``, ``--create-namespace``,
``--set``, ``-f``/``--values``) and refuses any other, so a guide cannot show a flag that was not
run. It talks to the cluster of ``$KUBECONFIG`` and prints what ``helm`` prints (the release's
name, namespace, status, revision and the chart's notes).

Run as ``python -m tests.docs.helm_cli install NAME CHART [flags]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # helm's exit status for a usage error is 1
        self.print_usage(sys.stderr)
        print(f"Error: {message}", file=sys.stderr)
        raise SystemExit(1)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="helm")
    parser.add_argument("-n", "--namespace", default="default")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("install", "upgrade"):
        command = commands.add_parser(name)
        command.add_argument("release")
        command.add_argument("chart")
        command.add_argument("-n", "--namespace", dest="sub_namespace")
        command.add_argument("--create-namespace", action="store_true")
        command.add_argument("--set", action="append", default=[])
        command.add_argument("-f", "--values", action="append", default=[])
    uninstall = commands.add_parser("uninstall")
    uninstall.add_argument("release")
    uninstall.add_argument("-n", "--namespace", dest="sub_namespace")
    return parser


def _merge(into: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def values_of(files: list[str], sets: list[str]) -> dict[str, Any]:
    """The values of ``-f`` files, then of ``--set`` expressions (later ones win), as Helm."""
    values: dict[str, Any] = {}
    for path in files:
        _merge(values, yaml.safe_load(Path(path).read_text()) or {})
    for expression in sets:
        _merge(values, helm.parse_set_string(expression))
    return values


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    namespace = args.sub_namespace or args.namespace
    config = helm.Config(kubeconfig_path=os.environ["KUBECONFIG"], namespace=namespace)
    try:
        if args.command == "uninstall":
            config.uninstall(args.release)
            print(f'release "{args.release}" uninstalled')
            return 0
        values = values_of(args.values, args.set)
        if args.command == "install":
            release = config.install(
                helm.Chart.load(args.chart),
                args.release,
                values,
                namespace=namespace,
                create_namespace=args.create_namespace,
            )
        else:
            release = config.upgrade(
                helm.Chart.load(args.chart), args.release, values, namespace=namespace
            )
    except helm.HelmError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    finally:
        config.close()
    print(f"NAME: {release['name']}")
    print(f"LAST DEPLOYED: {release['deployed_at']}")
    print(f"NAMESPACE: {release['namespace']}")
    print(f"STATUS: {release['status']}")
    print(f"REVISION: {release['revision']}")
    if release.get("notes"):
        print(f"NOTES:\n{release['notes']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
