"""`python -m cdc_airflow.pools`: creates (or sets back to one slot) the writer pools the DAGs put every gold
refresh in, one per gold model (cdc_airflow.wiring). Run it after `airflow db migrate` and whenever tables.yaml
gains a gold model: Airflow does not schedule a task whose pool does not exist."""

from __future__ import annotations

from cdc_airflow.wiring import wiring


def ensure_pools() -> dict[str, str]:
    from airflow.models.pool import Pool

    pools = wiring().pools()
    for name, description in pools.items():
        # a refresh waiting deferred on the pipeline service is still writing its model: it keeps the slot
        # (a deferred task holds no worker slot either way), so a second refresh stays queued in Airflow
        Pool.create_or_update_pool(name, slots=1, description=description, include_deferred=True)
    return pools


if __name__ == "__main__":
    created = ensure_pools()
    print(f"{len(created)} writer pools of one slot: {', '.join(created)}")
