"""A Griffe extension (``mkdocs.yml``: mkdocstrings' ``extensions``) that turns the Sphinx roles
of the docstrings (``:class:`X```, ``:func:`~a.b.c```, ``:meth:``, ``:attr:``, ``:data:``,
``:mod:``, ``:exc:``, ``:obj:``) into what Markdown renders: a cross-reference to the object when
the site documents it, its name as code otherwise; and the ``::`` that ends a paragraph before a
literal block into ``:``, as Sphinx shows it.

The docstrings are written for ``help()`` and Sphinx (reStructuredText roles); mkdocstrings reads
them as Markdown, where a role shows up literally (``:class:`Result```). Each role is resolved
the way Sphinx does: a dotted path as is, a short name in the scope of the object whose
docstring it is (its members, its module's imports, its parents'); ``~`` shows the last
component only, and a function or method gets ``()`` (Sphinx's ``add_function_parentheses``).
A resolved name becomes an *optional* autorefs reference (``<autoref ... optional>``, what
mkdocstrings writes for the types of signatures): a link when the target is on the site,
plain code (no warning) when it is not, such as a private helper or another package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|data|mod|exc|obj|const):`(~?)([^`]+)`")
CALLABLE_ROLES = frozenset({"func", "meth"})
LITERAL_MARKER = re.compile(r"(\S?)( ?)::$", re.MULTILINE)  # "text::", "text ::", "::"


def _resolve(obj: griffe.Object | griffe.Alias, target: str) -> str | None:
    """The full path of ``target`` as seen from ``obj``'s docstring, or None."""
    collection = obj.modules_collection
    if target in collection:
        return target
    head, _, rest = target.partition(".")
    scope: griffe.Object | griffe.Alias | None = obj
    while scope is not None:
        try:
            resolved = scope.resolve(head)
        except (griffe.NameResolutionError, AttributeError):
            scope = scope.parent
            continue
        return f"{resolved}.{rest}" if rest else resolved
    return None


def rewrite(text: str, obj: griffe.Object | griffe.Alias) -> str:
    """``text`` with its Sphinx roles replaced (see the module's docstring)."""

    def replace(match: re.Match[str]) -> str:
        role, short, target = match.groups()
        target = target.strip()
        shown = target.rsplit(".", 1)[-1] if short else target
        if role in CALLABLE_ROLES and not shown.endswith(")"):
            shown += "()"
        path = _resolve(obj, target)
        if path is None:
            return f"`{shown}`"
        return f'<autoref identifier="{path}" optional><code>{shown}</code></autoref>'

    # The "::" before an indented (literal) block, which Markdown already shows as code: as
    # Sphinx renders it, "text::" reads "text:", "text ::" reads "text", a lone "::" nothing.
    def literal(match: re.Match[str]) -> str:
        return f"{match[1]}:" if match[1] and not match[2] else match[1]

    return LITERAL_MARKER.sub(literal, ROLE.sub(replace, text))


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of a loaded package once the whole package is loaded (so that
    names of its other modules resolve)."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, set())

    def _walk(self, obj: griffe.Object, seen: set[str]) -> None:
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None and ":" in obj.docstring.value:
            obj.docstring.value = rewrite(obj.docstring.value, obj)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, seen)  # type: ignore[arg-type]
