"""Rendering ``{{ name }}`` templates, safely and fast.

A template is compiled once into its literal parts and variable slots
(``CompiledTemplate``); rendering joins them. There is no code, no attribute
access and no filter to evaluate: a placeholder is replaced by the value's text,
a missing or null value by the empty string. Two entry points:

* :meth:`CompiledTemplate.render` for one message (a ``str.join``);
* :func:`render_column` for a whole chunk at once, vectorised with pyarrow
  (``binary_join_element_wise`` over literal scalars and variable columns), which
  is what the delivery tasks use; ``bench/render.py`` compares both to ``str.format``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from campaign_trigger.services.templates import PLACEHOLDER, template_variables


class _Blank(dict[str, Any]):
    """Missing variables render as ''."""

    def __missing__(self, key: str) -> str:
        return ""


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """``literals[0] + vars[names[0]] + literals[1] + ... + literals[-1]``.

    ``format_string`` is the same template as a ``str.format_map`` string whose fields
    are only the validated names and whose literal braces are doubled: rendering is
    one C-level call (values are inserted, never parsed or evaluated).
    """

    literals: tuple[str, ...]
    names: tuple[str, ...]
    format_string: str

    def render(self, variables: Mapping[str, Any]) -> str:
        """One message; missing or null values render as ''."""
        if not self.names:
            return self.literals[0]
        if None in variables.values():
            variables = {k: ("" if v is None else v) for k, v in variables.items()}
        try:
            return self.format_string.format_map(variables)
        except KeyError:
            return self.format_string.format_map(_Blank(variables))


@lru_cache(maxsize=256)
def compile_template(template: str) -> CompiledTemplate:
    """Split a template into literals and placeholders (InvalidInput for other syntax)."""
    template_variables(template)  # rejects {% %}, {# #}, {{ a.b }}, filters...
    literals: list[str] = []
    names: list[str] = []
    position = 0
    for match in PLACEHOLDER.finditer(template):
        literals.append(template[position : match.start()])
        names.append(match.group(1))
        position = match.end()
    literals.append(template[position:])
    escaped = [literal.replace("{", "{{").replace("}", "}}") for literal in literals]
    fields = [f"{{{name}}}" for name in names] + [""]
    format_string = "".join(part for pair in zip(escaped, fields, strict=True) for part in pair)
    return CompiledTemplate(
        literals=tuple(literals), names=tuple(names), format_string=format_string
    )


def _text_column(table: pa.Table, name: str) -> pa.Array | pa.ChunkedArray:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, pa.string())
    column = table.column(name)
    if not pa.types.is_string(column.type) and not pa.types.is_large_string(column.type):
        column = pc.cast(column, pa.string())
    return column


def warm_up() -> None:
    """Render a row, as a process's first chunk would: pyarrow imports pandas at its first
    compute call (~1 s of CPU on a 2-core machine), which a worker paid in its first
    request, sending it up to a second late (docs/benchmarks.md, punctuality)."""
    render_column("{{ text }}{{ number }}", pa.table({"text": ["a"], "number": [1]}))


def render_column(template: str, table: pa.Table) -> list[str]:
    """Render ``template`` for every row of ``table`` (variables as columns)."""
    compiled = compile_template(template)
    if not compiled.names:
        return [compiled.literals[0]] * table.num_rows
    if table.num_rows == 0:
        return []
    pieces: list[Any] = [compiled.literals[0]]
    for name, literal in zip(compiled.names, compiled.literals[1:], strict=True):
        pieces.append(_text_column(table, name))
        pieces.append(literal)
    pieces = [piece for piece in pieces if not isinstance(piece, str) or piece]
    joined = pc.binary_join_element_wise(*pieces, "", null_handling="replace", null_replacement="")
    return joined.to_pylist()  # type: ignore[no-any-return]
