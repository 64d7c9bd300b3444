"""Which gold models refresh incrementally, and how (docs/architecture.md, "Incremental gold").

A model of the form `SELECT <its keys>, <expressions over COUNT, SUM, AVG, MIN, MAX> FROM <one silver table>
[WHERE <row filter>] GROUP BY <its keys>` is kept as a per-group state (each aggregate's running count, sum, or
extreme) that silver's changes since the last refresh move: an inserted row adds, a deleted one subtracts, an update
does both. Anything else is rewritten whole, and `plan` says why.

The SQL is read with sqlglot (a SQL parser with Spark's dialect): the model's own text is taken apart, never
pattern-matched by hand. No library maintains a Spark SQL aggregate from a Delta change feed outside Databricks'
materialized views, so the rules for each aggregate are written here."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

# the aggregates whose value a change moves without reading the group's other rows (MIN and MAX mostly: see gold_state)
KINDS = {exp.Count: "count", exp.Sum: "sum", exp.Avg: "avg", exp.Min: "min", exp.Max: "max"}
JOINED = "it has a join"  # plan's reason for a join: a state keeps one table's groups; a join's are computed again (GroupsPlan)
# the query parts a per-group state cannot keep: each changes which rows or groups are shown as a whole
_WHOLE = {"with_": "a WITH clause", "having": "HAVING", "limit": "LIMIT", "offset": "OFFSET", "distinct": "SELECT DISTINCT",
          "qualify": "QUALIFY", "joins": "a join", "laterals": "a LATERAL VIEW", "cluster": "CLUSTER BY",
          "distribute": "DISTRIBUTE BY", "sort": "SORT BY"}


@dataclass(frozen=True)
class Aggregate:
    kind: str  # "count" (of rows when `argument` is None), "sum", "avg", "min", "max"
    argument: str | None  # Spark SQL over the source's columns


@dataclass(frozen=True)
class IncrementalPlan:
    """The model as a per-group state over `source`: its rows that `where` keeps, grouped by `groups` (state columns
    `_g0`, `_g1`, ...), each of `aggregates` kept as `_a<j>_*` columns; `outputs` are the model's columns, in order,
    as Spark SQL over the state's columns."""

    source: str
    where: str | None
    groups: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    outputs: tuple[tuple[str, str], ...]

    @property
    def tables(self) -> tuple[str, ...]:
        return (self.source,)


def _select(sql: str) -> exp.Select | str:
    """The model's one SELECT, its names as Spark resolves them (case-insensitively), or why it is not one."""
    try:
        statements = sqlglot.parse(sql, dialect="spark")
    except ParseError as error:
        return f"its SQL is not read by the parser ({str(error).splitlines()[0]})"
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        return "it is not a single SELECT"
    query = normalize_identifiers(statements[0], dialect="spark")
    assert isinstance(query, exp.Select)
    return query


def group_columns(count: int) -> list[str]:
    """The state's columns of a model's `count` grouped values (its keys)."""
    return [f"_g{i}" for i in range(count)]


@cache  # a refresh asks every run; the model's text rarely changes
def plan(sql: str, keys: tuple[str, ...]) -> IncrementalPlan | str:
    """The model's incremental plan, or why it has none (one short sentence)."""
    query = _select(sql)
    if isinstance(query, str):
        return query
    present = [what for part, what in _WHOLE.items() if query.args.get(part)]
    if present:
        return f"it has {present[0]}"
    source = query.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or source.this.args.get("db"):
        return "it does not read one silver table by name"
    if any(query.find_all(exp.Window)):
        return "it has a window function"
    if any(node is not query for node in query.find_all(exp.Select)):
        return "it has a subquery"
    if any(query.find_all(exp.Star)) and not all(isinstance(s.parent, exp.Count) for s in query.find_all(exp.Star)):
        return "it selects *"
    for column in query.find_all(exp.Column):  # one table: a qualifier names nothing the column's name does not
        column.set("table", None)
    group = query.args.get("group")
    if group is None or not group.expressions:
        return "it has no GROUP BY"
    if any(group.args.get(part) for part in ("rollup", "cube", "grouping_sets", "totals")) \
            or any(isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)) for g in group.expressions):
        return "it groups by ROLLUP, CUBE or GROUPING SETS"
    items = query.expressions
    groups = _grouped(group.expressions, items)
    if isinstance(groups, str):
        return groups
    aggregates: list[Aggregate] = []
    outputs: list[tuple[str, str]] = []
    for item in items:
        name = item.alias_or_name
        if not name or not isinstance(item, (exp.Alias, exp.Column)):
            return f"its column {item.sql('spark')!r} has no name"
        body = item.unalias()
        problem = _aggregate_problem(body)
        if problem:
            return problem
        computed = _over_state(body.copy(), groups, aggregates)
        state_columns = {*group_columns(len(groups)), "_rows"} | {
            f"_a{j}_{part}" for j in range(len(aggregates)) for part in ("n", "s", "v", "avg")}
        stray = [c.name for c in computed.find_all(exp.Column) if c.name not in state_columns]
        if stray:
            return f"column {stray[0]} is neither grouped nor aggregated"
        outputs.append((name, computed.sql("spark")))
    names = [name for name, _ in outputs]
    if len(set(names)) != len(names):
        return "two of its columns have one name"
    grouped = {name for (name, _), item in zip(outputs, items, strict=True) if any(item.unalias() == g for g in groups)}
    if set(keys) != grouped or len(keys) != len(groups):
        return f"its keys ({', '.join(keys)}) are not its grouped columns ({', '.join(sorted(grouped)) or 'none'})"
    where = query.args.get("where")
    return IncrementalPlan(source=source.this.name, where=where.this.sql("spark") if where else None,
                           groups=tuple(g.sql("spark") for g in groups), aggregates=tuple(aggregates),
                           outputs=tuple(outputs))


def _grouped(expressions: list[exp.Expr], items: list[exp.Expr]) -> list[exp.Expr] | str:
    """The GROUP BY's distinct expressions (`GROUP BY 1`: the first selected column's), or why they cannot be."""
    groups: list[exp.Expr] = []
    for g in expressions:
        if isinstance(g, exp.Literal) and not g.is_string:  # GROUP BY 1: the first column's expression
            position = int(g.this)
            if not 1 <= position <= len(items):
                return f"GROUP BY {position} names no column"
            g = items[position - 1].unalias()
        if any(g.find_all(exp.AggFunc)):
            return "it groups by an aggregate"
        if all(g != known for known in groups):
            groups.append(g)
    return groups


def _aggregate_problem(body: exp.Expr) -> str | None:
    for agg in body.find_all(exp.AggFunc):
        kind = KINDS.get(type(agg))
        if kind is None:
            return f"{agg.sql('spark').split('(')[0].upper()} is not kept incrementally (COUNT, SUM, AVG, MIN and MAX are)"
        if isinstance(agg.this, exp.Distinct) or isinstance(agg.parent, exp.Filter) or agg.args.get("expressions"):
            return f"{agg.sql('spark')} is not a plain aggregate of one argument"
        if any(agg.this.find_all(exp.AggFunc)) if agg.this is not None else False:
            return "it nests aggregates"
    return None


def _over_state(body: exp.Expr, groups: list[exp.Expr], aggregates: list[Aggregate]) -> exp.Expr:
    """`body` with each aggregate replaced by its value from the state (`aggregates` gains it) and each grouped
    expression by its state column."""
    def replace(node: exp.Expr) -> exp.Expr:
        for i, g in enumerate(groups):
            if node == g:
                return exp.column(f"_g{i}")
        if isinstance(node, exp.AggFunc):
            kind = KINDS[type(node)]
            argument = None if isinstance(node.this, exp.Star) else node.this.sql("spark")
            if kind == "count" and argument is None:
                return exp.column("_rows")
            found = Aggregate(kind, argument)
            if found not in aggregates:
                aggregates.append(found)
            return sqlglot.parse_one(state_value(found, aggregates.index(found)), dialect="spark")
        return node

    return body.transform(replace)


def state_value(aggregate: Aggregate, j: int) -> str:
    """The aggregate's value from its state columns: as Spark computes it over the group's rows (a sum of no value
    is NULL; AVG divides as Spark's own Average does, the result cast to its type by the caller)."""
    if aggregate.kind == "count":
        return f"_a{j}_n"
    if aggregate.kind == "sum":
        return f"IF(_a{j}_n = 0, NULL, _a{j}_s)"
    if aggregate.kind == "avg":
        return f"_a{j}_avg"
    return f"_a{j}_v"


@dataclass(frozen=True)
class Reach:
    """How the model's keys are found from the changed rows of one of its table occurrences: `sql` selects them as
    `_k0`, `_k1`, ... from the view `changed_view(table)`, joined along the occurrence's join conditions up towards the
    FROM table with `every_view(t)` of each table on the way (`through`)."""

    table: str
    sql: str
    through: tuple[str, ...]
    keyed_by: tuple[str, ...] | None  # its own columns that equal the keys in every row it joins into, if it has them


@dataclass(frozen=True)
class GroupsPlan:
    """A model whose rows are computed again for the keys silver's changes touch: its keys are columns of its FROM
    table, which every row of its result has (it joins INNER or LEFT only). A changed row touches the keys of the
    rows it joins into, before and after the change; they are found by following its table's join conditions up to
    the FROM table (`reaches`), a superset at worst. `keyed_sql` is the model's SQL with its FROM table read from
    `keyed_view(i)` for each occurrence `i` with `keyed_by` columns (the FROM table's are the keys themselves): its rows
    of those keys, the only ones that can join into their rows; any other from its `source_view`."""

    keyed_sql: str
    reaches: tuple[Reach, ...]  # one per table occurrence

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(sorted({r.table for r in self.reaches}))


# The views a refresh registers for the SQL below are named within `scope`, the model's own: the pipeline service runs
# several jobs in one Spark session, whose temporary views they share.
def changed_view(scope: str, table: str) -> str:
    return f"{scope}_changed_{table}"  # the change feed's rows of `table`, before and after each change


def every_view(scope: str, table: str) -> str:
    return f"{scope}_every_{table}"  # `table`'s rows now and those the changes took away


def source_view(scope: str, table: str) -> str:
    return f"{scope}_source_{table}"  # `table` at the version the refresh reads


def keyed_view(scope: str, occurrence: int) -> str:
    return f"{scope}_keyed_{occurrence}"  # an occurrence's rows of the touched keys


@cache
def groups_plan(sql: str, keys: tuple[str, ...], scope: str = "_cdc") -> GroupsPlan | str:
    """The model's rows computed again for the keys its sources' changes touch, or why they are not (one sentence);
    its SQL reads the views of `scope`."""
    query = _select(sql)
    if isinstance(query, str):
        return query
    # HAVING, DISTINCT and joins only decide which rows a key has, which computing the key again decides again
    present = [what for part, what in _WHOLE.items() if part not in ("joins", "having", "distinct") and query.args.get(part)]
    if present:
        return f"it has {present[0]}"
    source = query.args.get("from_")
    joins = query.args.get("joins") or []
    occurrences = [source.this if source else None, *(j.this for j in joins)]
    if not all(isinstance(t, exp.Table) and not t.args.get("db") for t in occurrences):
        return "it does not read silver tables by name"
    if any(query.find_all(exp.Window)):
        return "it has a window function"
    if any(node is not query for node in query.find_all(exp.Select)):
        return "it has a subquery"
    for join in joins:
        if join.args.get("side") not in (None, "", "LEFT") or join.args.get("kind") not in (None, "", "INNER", "OUTER") \
                or join.args.get("method") or join.args.get("using") or join.args.get("on") is None:
            return f"its join of {join.this.name} is not an INNER or LEFT join ON a condition"
    aliases = [t.alias_or_name for t in occurrences]
    if len(set(aliases)) != len(aliases):
        return "two of its tables have one name"
    group = query.args.get("group")
    if group is None and any(query.find_all(exp.AggFunc)):
        return "it aggregates without GROUP BY"
    if group is not None and any(isinstance(g, (exp.Rollup, exp.Cube, exp.GroupingSets)) for g in group.expressions):
        return "it groups by ROLLUP, CUBE or GROUPING SETS"
    key_columns = _key_columns(query, keys, aliases)
    if isinstance(key_columns, str):
        return key_columns
    parents: dict[int, tuple[int, list[tuple[str, str]]]] = {}  # occurrence -> its parent, (its column, the parent's)
    for i, join in enumerate(joins, start=1):
        edge = _parent(join.args["on"], i, aliases)
        if edge is None:
            return f"its join of {aliases[i]} has no equality with a table before it"
        parents[i] = edge
    reaches = tuple(_reach(i, [t.name for t in occurrences], aliases, parents, key_columns, scope)
                    for i in range(len(occurrences)))
    keyed = query.copy()
    keyed_tables = [keyed.args["from_"].this, *(j.this for j in keyed.args.get("joins") or [])]
    for i, (table, reach) in enumerate(zip(keyed_tables, reaches, strict=True)):
        table.set("this", exp.to_identifier(keyed_view(scope, i) if reach.keyed_by is not None
                                            else source_view(scope, reach.table)))
        table.set("alias", exp.TableAlias(this=exp.to_identifier(aliases[i])))
    return GroupsPlan(keyed_sql=keyed.sql("spark"), reaches=reaches)


def _key_columns(query: exp.Select, keys: tuple[str, ...], aliases: list[str]) -> list[str] | str:
    """The FROM table's column each key is, or why a key is not one."""
    items = {item.alias_or_name: item.unalias() for item in query.expressions}
    group = query.args.get("group")
    grouped = [] if group is None else [query.expressions[int(g.this) - 1].unalias()
                                        if isinstance(g, exp.Literal) and not g.is_string else g for g in group.expressions]
    found = []
    for key in keys:
        body = items.get(key)
        if not isinstance(body, exp.Column) or body.table not in (aliases[0], *([""] if len(aliases) == 1 else [])):
            return f"its key {key} is not a column of its FROM table"
        if group is not None and not any(isinstance(g, exp.Column) and g.name == body.name and g.table in ("", body.table)
                                         for g in grouped):
            return f"its key {key} is not grouped"
        found.append(body.name)
    return found


def _parent(on: exp.Expr, i: int, aliases: list[str]) -> tuple[int, list[tuple[str, str]]] | None:
    """The table before occurrence `i` its ON condition equates columns with first, and each pair (its column, that
    table's column) of those equalities."""
    pairs: dict[int, list[tuple[str, str]]] = {}
    for conjunct in on.flatten() if isinstance(on, exp.And) else [on]:
        if not isinstance(conjunct, (exp.EQ, exp.NullSafeEQ)):
            continue
        left, right = conjunct.this, conjunct.expression
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
            continue
        if right.table == aliases[i]:
            left, right = right, left
        if left.table == aliases[i] and right.table in aliases[:i]:
            pairs.setdefault(aliases.index(right.table), []).append((left.name, right.name))
    if not pairs:
        return None
    first = next(iter(pairs))
    return first, pairs[first]


def _reach(i: int, tables: list[str], aliases: list[str], parents: dict[int, tuple[int, list[tuple[str, str]]]],
           key_columns: list[str], scope: str) -> Reach:
    """Occurrence `i`'s way to the keys: up its parents to the FROM table (each present in a joined row it is in: its
    ON held), then down again as long as an equality names each key's column in the next table, where it stops."""
    path = [i]
    while path[-1] != 0:
        path.append(parents[path[-1]][0])
    stop, columns = len(path) - 1, list(key_columns)
    while stop > 0:
        child = path[stop - 1]
        mapped = {parent_column: own for own, parent_column in parents[child][1]}
        if not all(c in mapped for c in columns):
            break
        columns, stop = [mapped[c] for c in columns], stop - 1

    def name(alias: str, column: str) -> str:
        return exp.column(column, table=alias, quoted=True).sql("spark")

    select = ", ".join(f"{name(aliases[path[stop]], c)} AS _k{k}" for k, c in enumerate(columns))
    sql = f"SELECT {select} FROM {changed_view(scope, tables[i])} AS {aliases[i]}"
    for child, parent in zip(path[:stop], path[1:stop + 1], strict=True):
        condition = " AND ".join(f"{name(aliases[child], own)} <=> {name(aliases[parent], theirs)}"
                                 for own, theirs in parents[child][1])
        sql += f" JOIN {every_view(scope, tables[parent])} AS {aliases[parent]} ON {condition}"
    return Reach(table=tables[i], sql=sql, through=tuple(tables[p] for p in path[1:stop + 1]),
                 keyed_by=tuple(columns) if stop == 0 else None)
