"""``trainjob validate`` and ``trainjob crd``: the verbs that read or print manifests.

Registered by :mod:`trainjob_operator.cli`, which imports this module only when one of them
runs (as it does the implementations of ``run`` and ``operator``), so that ``trainjob --help``
loads no API models.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from trainjob_operator.admission import pod_template_problems
from trainjob_operator.api.crd import render_crd_yaml
from trainjob_operator.api.manifest import load_documents

__all__ = ["crd_command", "validate_command"]

EXIT_OK = 0
EXIT_INVALID = 2  # cli.EXIT_INVALID


def validate_command(args: argparse.Namespace) -> int:
    """``trainjob validate MANIFEST...``: check each manifest; 2 when one is invalid."""
    out: TextIO = sys.stdout
    failed = False
    for manifest in args.manifests:
        try:
            docs = load_documents(manifest if manifest == "-" else Path(manifest))
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{manifest}: cannot read: {getattr(exc, 'strerror', None) or exc}", file=out)
            failed = True
            continue
        if not docs:
            print(f"{manifest}: no TrainJob document found", file=out)
            failed = True
            continue
        multi = len(docs) > 1
        for doc in docs:
            where = f"{manifest}#{doc.index + 1}" if multi else manifest
            problems = pod_template_problems(doc.trainjob) if doc.trainjob else []
            if doc.ok and doc.trainjob is not None and not problems:
                job = doc.trainjob
                if not args.quiet:
                    print(f"OK {where} ({job.kind}/{job.metadata.name})", file=out)
                continue
            failed = True
            for line in [e.format() for e in doc.errors] + problems:
                print(f"{where}: {line}", file=out)
    return EXIT_INVALID if failed else EXIT_OK


def crd_command(args: argparse.Namespace) -> int:
    """``trainjob crd``: print the TrainJob CustomResourceDefinition."""
    sys.stdout.write(render_crd_yaml())
    return EXIT_OK
