"""Spark columns written as SQL text, each distinct text parsed once per process and its column kept.

Built through pyspark's Column API, every function, operator, literal and alias is a py4j round trip to the JVM,
and another when Python drops the object: a warm 1k batch made about 9,000 of them, more time than its Spark jobs
took (tests/benchmarks/RESULTS.md). A column from its text is one round trip the first time and none after, and the
long-lived service plans the same tables' batches again and again. No library offers this: pyspark's `expr` parses
anew on every call.

Names and values from the configuration or a source go into the text only through `ident` and `literal`."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from functools import lru_cache
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

Rule = TypeVar("Rule", bound=Hashable)
_KEPT = 4096  # distinct texts kept: a whole database's tables' columns (most are shared by tables with the same keys)


@lru_cache(maxsize=_KEPT)
def sql(text: str) -> Column:
    """The column `text` (an SQL expression, optionally `... AS name`) means; the same object for the same text (a
    Column is an immutable expression tree: one may appear in many plans, on any thread)."""
    return F.expr(text)


def ident(name: str) -> str:
    """`name` as an SQL identifier, whatever characters it holds."""
    return "`" + name.replace("`", "``") + "`"


def literal(value: str) -> str:
    """`value` as an SQL string literal, whatever characters it holds (Spark's string literals take escapes)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_type(data_type: T.DataType) -> str:
    """`data_type` as SQL names it, a struct's field names quoted (pyspark's simpleString leaves them bare)."""
    if isinstance(data_type, T.StructType):
        return f"STRUCT<{', '.join(f'{ident(f.name)}: {sql_type(f.dataType)}' for f in data_type.fields)}>"
    if isinstance(data_type, T.ArrayType):
        return f"ARRAY<{sql_type(data_type.elementType)}>"
    if isinstance(data_type, T.MapType):
        return f"MAP<{sql_type(data_type.keyType)}, {sql_type(data_type.valueType)}>"
    return data_type.simpleString()


def named_struct(fields: Mapping[str, str]) -> str:
    """A struct of the `fields` (SQL text each), under their names."""
    return f"named_struct({', '.join(f'{literal(name)}, {value}' for name, value in fields.items())})"


def labels_where(conditions: Mapping[str, str], separator: str = ", ") -> str:
    """The labels whose condition (SQL text) holds, in order, joined by `separator` ('' when none holds)."""
    if not conditions:
        return "''"
    cases = ", ".join(f"CASE WHEN {condition} THEN {literal(label)} END" for label, condition in conditions.items())
    return f"concat_ws({literal(separator)}, {cases})"


def per_table(rules: Mapping[str, Rule], text_of: Callable[[Rule], str]) -> str:
    """`text_of(rule)` of each row's table (`_table`), one CASE branch per distinct rule: the tables of a database
    mostly share them. One rule for all needs no `_table` at all."""
    tables_of: dict[Rule, list[str]] = {}
    for table, rule in rules.items():
        tables_of.setdefault(rule, []).append(table)
    if len(tables_of) == 1:
        return text_of(next(iter(tables_of)))
    branches = [f"WHEN _table IN ({', '.join(map(literal, names))}) THEN {text_of(rule)}" for rule, names in tables_of.items()]
    return f"CASE {' '.join(branches)} END"


def holds(rows: pa.Table, condition: str) -> pa.ChunkedArray:
    """Where the SQL `condition` holds in each of `rows` (false where it is null, as a WHERE reads it)."""
    return pc.fill_null(evaluated(rows, {"holds": condition}).column("holds"), False)


def evaluated(rows: pa.Table, texts: Mapping[str, str]) -> pa.Table:
    """Each SQL text of `texts` over `rows`, under its name: the driver's reading of a rule's one text, the text Spark
    plans, so that a small batch planned in Arrow (layers/silver_pass.py) restates no rule. A text may name columns
    and literals and use IS [NOT] NULL, NOT, AND, OR, coalesce, the six comparisons, CAST to BIGINT, STRING or BOOLEAN
    and unix_millis, which Arrow evaluates as Spark does (Kleene logic, strings by their bytes); anything else is a
    ValueError. Written here because no library evaluates SQL text over an Arrow table with the runtime's packages
    (sqlglot parses it; DataFusion's SQL, in deltalake, reads only Delta tables)."""
    from pyarrow import acero

    project = acero.Declaration.from_sequence([
        acero.Declaration("table_source", acero.TableSourceNodeOptions(rows)),
        acero.Declaration("project", acero.ProjectNodeOptions([_arrow_text(t) for t in texts.values()], list(texts)))])
    return project.to_table(use_threads=False)


@lru_cache(maxsize=256)
def _arrow_text(text: str) -> pc.Expression:
    import sqlglot

    return _arrow(sqlglot.parse_one(text, read="spark"), text)


_ARROW_TYPES = {"BIGINT": pa.int64(), "TEXT": pa.string(), "VARCHAR": pa.string(), "BOOLEAN": pa.bool_()}


def _arrow(node: Any, text: str) -> pc.Expression:
    from sqlglot import exp

    comparisons = {exp.EQ: "__eq__", exp.NEQ: "__ne__", exp.GT: "__gt__", exp.GTE: "__ge__", exp.LT: "__lt__",
                   exp.LTE: "__le__"}
    if isinstance(node, exp.Paren):
        return _arrow(node.this, text)
    if isinstance(node, exp.Column) and not node.table:
        return pc.field(node.name)
    if isinstance(node, exp.Literal):
        return pc.scalar(node.this if node.is_string else (float(node.this) if "." in node.this else int(node.this)))
    if isinstance(node, exp.Boolean):
        return pc.scalar(bool(node.this))
    if isinstance(node, exp.Cast) and node.to.this.name in _ARROW_TYPES:
        to = _ARROW_TYPES[node.to.this.name]
        return pc.scalar(pa.scalar(None, to)) if isinstance(node.this, exp.Null) else _arrow(node.this, text).cast(to)
    if isinstance(node, exp.UnixMillis):  # of a timestamp: its microseconds since the epoch, floored to milliseconds
        micros = _arrow(node.this, text).cast(pa.timestamp("us", "UTC")).cast(pa.int64())
        return pc.floor(pc.divide(micros.cast(pa.float64()), 1000.0)).cast(pa.int64())
    if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
        return _arrow(node.this, text).is_null()
    if isinstance(node, exp.Not):
        return ~_arrow(node.this, text)
    if isinstance(node, exp.Coalesce):
        return pc.coalesce(*[_arrow(n, text) for n in (node.this, *node.expressions)])
    if isinstance(node, (exp.And, exp.Or)):
        left, right = _arrow(node.this, text), _arrow(node.expression, text)
        return left & right if isinstance(node, exp.And) else left | right
    if type(node) in comparisons:
        return getattr(_arrow(node.this, text), comparisons[type(node)])(_arrow(node.expression, text))
    raise ValueError(f"{text!r}: Arrow does not evaluate {node.sql(dialect='spark')!r} here")
