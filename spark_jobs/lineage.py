"""Column-level lineage: each gold model's columns traced to the silver columns they are computed from, read from
its SQL by OpenLineage's own SQL parser (`openlineage_sql`, the parser the OpenLineage providers use), never by hand.
The gold step records it in its summary (reports, event log); the Airflow side hands it to OpenLineage as each
model's column-lineage facet (cdc_airflow.operators)."""

from __future__ import annotations

from functools import cache


@cache
def model_lineage(sql: str) -> dict[str, list[str]]:
    """Each output column of a model's SQL -> the `table.column`s it is computed from, sorted; a column computed from
    no column (`COUNT(*)`, a literal) maps to []. Columns the parser cannot place (an unqualified name in a join
    that two sources might hold) are named by what it resolved them to."""
    import openlineage_sql

    parsed = openlineage_sql.parse([sql], dialect="spark")
    lineage = {c.descendant.name: sorted({f"{c_in.origin.name if c_in.origin else '?'}.{c_in.name}" for c_in in c.lineage})
               for c in parsed.column_lineage}
    return dict(sorted(lineage.items()))


def silver_lineage(table: str, columns: list[str], sequence_by: tuple[str, ...] | None) -> dict[str, list[str]]:
    """Each column of silver's `table` -> the fields of its bronze rows (the source envelope, named `table.field`) it
    is made from: a source column from the row image (`after`, or `before` for a delete), the pipeline's columns from
    the envelope's `op` and `source` block (`_seq`: the log position, or the `sequence_by` fields)."""
    def image(column: str) -> list[str]:
        return [f"{table}.after.{column}", f"{table}.before.{column}"]

    sequence = sorted({f"{table}.{name}" if name.startswith("source.") else f"{table}.after.{name}"
                       for name in sequence_by}) if sequence_by else [f"{table}.source"]
    meta = {"_op": [f"{table}.op"], "_seq": sequence, "_source_ts_ms": [f"{table}.source.ts_ms"],
            "_ingested_at": [f"{table}._ingested_at"], "_batch_id": [], "_transaction_id": [f"{table}.transaction.id"]}
    return {c: meta[c] if c in meta else image(c) for c in columns}
