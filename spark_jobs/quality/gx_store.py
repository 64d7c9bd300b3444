"""Great Expectations' filesystem store, writing each file aside and renaming it over (state.write_atomic).

GX's own backend truncates a file and then writes it: a run killed in between left an empty expectation
suite or validation result, and every later gate of the table failed to load it. GX instantiates this by
name from the store configuration (gates._context); it imports GX, so nothing else imports it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from great_expectations.data_context.store.tuple_store_backend import TupleFilesystemStoreBackend

from spark_jobs.lake import write_atomic


class AtomicFilesystemStoreBackend(TupleFilesystemStoreBackend):
    def _set(self, key: Any, value: Any, **kwargs: Any) -> str:  # type: ignore[override]  # as GX's own returns the path
        if not isinstance(key, tuple):
            key = key.to_tuple()
        path = Path(self.full_base_directory) / self._convert_key_to_filepath(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, value)
        return str(path)
