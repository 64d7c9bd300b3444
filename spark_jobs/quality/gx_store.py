"""Great Expectations' tuple store on the lake's own files (spark_jobs/storage.py): a local folder, each file
written aside and renamed over, or S3.

Written here because no library does either: GX's filesystem backend truncates a file and then writes it
(a run killed in between left an empty suite or validation result, and every later gate of the table
failed to load it), and GX 1.x ships no S3 backend. GX instantiates this by name from the store
configuration (gx_project.context); it imports GX, so nothing else imports it."""

from __future__ import annotations

import hashlib
import html
import json
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from great_expectations.data_context.store.tuple_store_backend import TupleFilesystemStoreBackend, TupleStoreBackend
from great_expectations.exceptions import InvalidKeyError

from spark_jobs.logs import logger
from spark_jobs.quality.docs_assets import GX_STATIC, VENDOR, offline_page, vendored_files, without_inline_code
from spark_jobs.storage import is_s3, lake_files

log = logger(__name__)


class LakeStoreBackend(TupleFilesystemStoreBackend):
    def __init__(self, base_directory: str, root_directory: str | None = None, **kwargs: Any):
        full = base_directory
        if root_directory and not _absolute(base_directory):
            full = f"{root_directory.rstrip('/')}/{base_directory}"
        self._files = lake_files(full)
        if not is_s3(full):
            super().__init__(base_directory=full, **kwargs)
            self.full_base_directory = full.rstrip("/")  # GX's configuration ends some with "/"; keys are relative
            return
        # GX's filesystem constructor makes local folders: on S3 only its base class's part applies
        self.full_base_directory = full.rstrip("/")
        TupleStoreBackend.__init__(self, **kwargs)
        if not self._suppress_store_backend_id:
            _ = self.store_backend_id
        self._config = {"base_directory": full, **{k: v for k, v in kwargs.items() if v},
                        "module_name": type(self).__module__, "class_name": type(self).__name__}

    def _path(self, key: Any) -> str:
        if not isinstance(key, tuple):
            key = key.to_tuple()
        return f"{self.full_base_directory}/{self._convert_key_to_filepath(key)}"

    def _get(self, key: Any) -> str:  # type: ignore[override]  # as GX's own: the object
        data = self._files.read(self._path(key))
        if data is None:
            raise InvalidKeyError(f"no GX object at {self._path(key)}")
        return data.decode("utf-8").rstrip("\n")

    def _set(self, key: Any, value: Any, **kwargs: Any) -> str:  # type: ignore[override]  # as GX's own: the path
        path = self._path(key)
        self._files.write(path, value)
        return path

    def _move(self, source_key: Any, dest_key: Any, **kwargs: Any) -> Any:
        data = self._files.read(self._path(source_key))
        if data is None:
            return False
        self._files.write(self._path(dest_key), data)
        self.remove_key(source_key)
        return dest_key

    def _has_key(self, key: Any) -> bool:
        return self._files.exists(self._path(key))

    def remove_key(self, key: Any) -> bool:  # type: ignore[override]  # as GX's own
        path = self._path(key)
        if not self._files.exists(path):
            return False
        self._files.remove(path)
        return True

    def list_keys(self, prefix: tuple = ()) -> list[tuple]:  # type: ignore[override]  # GX's own annotation
        base = self.full_base_directory
        keys = []
        for path in self._files.list("/".join((base, *prefix))):
            relative = path[len(base) + 1:]
            if self._is_missing_prefix_or_suffix(filepath_prefix=self.filepath_prefix,
                                                 filepath_suffix=self.filepath_suffix, key=relative):
                continue
            key = self._convert_filepath_to_key(relative)
            if key and not self.is_ignored_key(key):
                keys.append(key)
        return keys

    def get_url_for_key(self, key: Any, protocol: Any = None) -> str:
        if is_s3(self.full_base_directory):
            escaped = self._url_path_escape_special_characters(path=self._convert_key_to_filepath(key))
            return f"{self.full_base_directory}/{escaped}"
        return str(super().get_url_for_key(key, protocol))


def _absolute(path: str) -> bool:
    return is_s3(path) or os.path.isabs(path)


class ValidationResultsStoreBackend(LakeStoreBackend):
    """Validation results, with every value they hold from the data escaped as HTML before they are stored: GX
    renders Data Docs from them and puts such values (sampled unexpected values, observed values) into its pages
    as they are, so a source row holding markup would run in the browser of whoever opens the page (the Airflow
    plugin serves them from Airflow's own origin). The gate's findings come from the run's own result, not from
    the store, so they keep the values as they are."""

    def _set(self, key: Any, value: Any, **kwargs: Any) -> str:  # type: ignore[override]  # as GX's own
        if isinstance(value, str) and value.lstrip().startswith("{"):  # a result (not the store's id line)
            stored = json.loads(value)
            for result in stored.get("results") or []:
                for part in ("result", "exception_info"):
                    if part in result:
                        result[part] = _escaped(result[part])
            value = json.dumps(stored, indent=2)
        return super()._set(key, value, **kwargs)


def _escaped(value: Any) -> Any:
    """Every string inside `value` (keys too) escaped as HTML."""
    if isinstance(value, str):
        return html.escape(value)
    if isinstance(value, dict):
        return {html.escape(k) if isinstance(k, str) else k: _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value


class DataDocsStoreBackend(LakeStoreBackend):
    """A table's Data Docs site: pages are written offline-ready (quality/docs_assets.py), linking to the
    vendored styles and scripts beside the sites, copied there when a lake's first page is written, and to one copy
    of GX's static files beside them too (each site held its own: 28 of the demo's 31 MB of reports)."""

    _assets_present = False
    _static_present = False

    def _set(self, key: Any, value: Any, **kwargs: Any) -> str:  # type: ignore[override]  # as GX's own
        if isinstance(key, tuple) and key[:1] == ("static",):  # GX's own fonts, images and styles: the shared copy
            self._ensure_static()
            return self._static_path(key)
        relative = self._convert_key_to_filepath(key if isinstance(key, tuple) else key.to_tuple())
        if relative.endswith(".html") and isinstance(value, str):
            self._ensure_assets()
            depth = relative.count("/")
            value, dropped = without_inline_code(offline_page(value, depth), depth)
            if dropped:  # GX's templates write none such: say so rather than lose it silently
                log.warning("Data Docs page %s: %d script(s) GX's templates do not write were left out", relative,
                            dropped)
        return super()._set(key, value, **kwargs)

    def _ensure_assets(self) -> None:
        if self._assets_present:
            return
        folder = self._beside_sites(VENDOR)
        files = vendored_files()
        pinned = "\n".join(f"{name} {hashlib.sha256(data).hexdigest()}" for name, data in sorted(files.items())).encode()
        self._copy_unless_marked(f"{folder}/.complete", pinned,
                                 lambda: [(f"{folder}/{name}", data) for name, data in files.items()])
        self._assets_present = True

    def _beside_sites(self, folder: str) -> str:
        """A folder of files every site of the lake links to, beside the sites (reports/data_docs/<folder>)."""
        return f"{self.full_base_directory.rsplit('/', 1)[0]}/{folder}"

    def _static_path(self, key: tuple[str, ...]) -> str:
        """Where GX's static file of `key` (`("static", "fonts", ...)`, as its build stores it) lies: the sites' copy."""
        return f"{self._beside_sites(GX_STATIC)}/{'/'.join(key[1:])}"

    def _ensure_static(self) -> None:
        """GX copies its static files (4 MB of fonts, images and styles) into the site on every Data Docs build,
        so every gate wrote them again: on S3, 20 PUTs and 4 MB a gate, and a copy in every site. They change only
        with GX: the sites' one copy is made when its marker names other contents (a new GX, a copy cut short, a
        deleted folder), else kept."""
        if self._static_present:  # a build sets them one by one: the first checks for all
            return
        files, digest = gx_static_files()
        self._copy_unless_marked(self._static_path(("static", ".complete")), digest,
                                 lambda: [(self._static_path(key), source.read_bytes()) for key, source in files.items()])
        self._static_present = True

    def _copy_unless_marked(self, marker: str, stamp: bytes, contents: Callable[[], list[tuple[str, bytes]]]) -> None:
        """Files that change only with their source, (path, bytes) from `contents`: written unless `marker` holds
        `stamp`, the marker last, so a copy cut short is made again."""
        if self._files.read(marker) != stamp:
            for path, data in contents():
                self._files.write(path, data)
            self._files.write(marker, stamp)


@cache
def gx_static_files() -> tuple[dict[tuple[str, ...], Path], bytes]:
    """GX's static files by the key its Data Docs build stores each under (its path from `static/` on, as GX's
    HtmlSiteStore.copy_static_assets makes it), and a digest of their names and contents."""
    import great_expectations

    render = Path(great_expectations.__file__).parent / "render"
    root = render / "view" / "static"
    # only those GX's templates, styles and renderers name (its favicon, logo and styles): the rest are tutorial
    # animations and fonts no page or style loads, 4 of the 4.1 MB
    named = "\n".join(p.read_text(errors="ignore") for p in sorted(render.rglob("*"))
                      if p.is_file() and p.suffix in (".j2", ".css", ".js", ".py", ".html"))
    files = {p.relative_to(root.parent).parts: p for p in sorted(root.rglob("*"))
             if p.is_file() and p.name in named}
    digest = hashlib.sha256()
    for key, source in files.items():
        digest.update("/".join(key).encode() + b"\0" + hashlib.sha256(source.read_bytes()).digest())
    return files, digest.hexdigest().encode()
