"""GX Data Docs, offline: the styles and scripts their pages take from public CDNs, fetched once from the npm
registry at pinned versions (`make assets`, like `make jars`), copied once into the lake beside the tables'
Data Docs sites (`reports/data_docs/_assets/`) and linked from their pages instead of the CDNs; GX's
logos come from its own package, and the newsletter footer goes.
Without this, a lake behind a firewall shows its Data Docs unstyled, without tables or charts.

GX has no setting for where its pages load these from (the URLs are in its page templates), so the pages
are rewritten as the Data Docs store writes them (quality/gx_store.py)."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.errors import ConfigError

VENDOR = "_assets"  # where the files sit, beside the sites (reports/data_docs/<table>/)
REGISTRY = "https://registry.npmjs.org"


@dataclass(frozen=True)
class Package:
    """An npm package at an exact version, its tarball's integrity, and the CDN URLs GX's templates name
    (URL -> the file in the tarball, under `package/`)."""

    name: str
    version: str
    integrity: str  # the registry's sha512 of the tarball
    files: tuple[tuple[str, str], ...]
    folders: tuple[str, ...] = ()  # whole folders a stylesheet refers to (fonts)

    @property
    def tarball(self) -> str:
        return f"{REGISTRY}/{self.name}/-/{self.name.rsplit('/', 1)[-1]}-{self.version}.tgz"

    @property
    def home(self) -> str:
        return f"{self.name.replace('/', '+')}@{self.version}"


PACKAGES = (
    Package("jquery", "3.7.1", "sha512-m4avr8yL8kmFN8psrbFFFmB/If14iN5o9nw/NgnnM+kybDJpRsAynV2BsfpTYrTRysYUdADVD7CkUUizgkpLfg==",
            (("https://code.jquery.com/jquery-3.7.1.min.js", "dist/jquery.min.js"),)),
    Package("popper.js", "1.12.9",
            "sha512-s0EEi9xiSCdqz9lV4IiVH5yIZnDX/U1t0tCjB+0jXx9jW8lrR7kOpVupiUg175ogqVoudpDXHF1p6dKATCHMeg==",
            (("https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js", "dist/umd/popper.min.js"),)),
    Package("bootstrap", "4.3.1",
            "sha512-rXqOmH1VilAt2DyPzluTi2blhk17bO7ef+zLLPlWvG494pDxcM234pJ8wTc/6R40UWizAIIMgxjvxZg5kmsbag==",
            (("https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css", "dist/css/bootstrap.min.css"),
             ("https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js", "dist/js/bootstrap.min.js"))),
    # GX's templates name 1.19.0 for one filter-control stylesheet and 1.19.1 for the rest: 1.19.1's serves both
    Package("bootstrap-table", "1.19.1",
            "sha512-WvV+l1AI/C+zThaKmfHmi/IuayVNB0qdFyEhFx1jyZhO0oLtNJNANkCR3rvJf6Dkh72dsLElxpE/bzK9seEQLA==",
            (("https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css", "dist/bootstrap-table.min.css"),
             ("https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js", "dist/bootstrap-table.min.js"),
             ("https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/"
              "bootstrap-table-filter-control.min.js", "dist/extensions/filter-control/bootstrap-table-filter-control.min.js"),
             ("https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
              "bootstrap-table-filter-control.css", "dist/extensions/filter-control/bootstrap-table-filter-control.css"),
             ("https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/"
              "bootstrap-table-filter-control.min.css",
              "dist/extensions/filter-control/bootstrap-table-filter-control.min.css"))),
    Package("bootstrap-datepicker", "1.9.0",
            "sha512-9rYYbaVOheGYxjOr/+bJCmRPihfy+LkLSg4fIFMT9Od8WwWB/MB50w0JO1eBgKUMbb7PFHQD5uAfI3ArAxZRXA==",
            (("https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css",
              "dist/css/bootstrap-datepicker.min.css"),
             ("https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js",
              "dist/js/bootstrap-datepicker.min.js"))),
    Package("@forevolve/bootstrap-dark", "1.1.0",
            "sha512-A3ucpEpxPoTVO490lZZCfjPXxv832l7mm1IxX3bXyxvgwnPGXDLyh7dWrphXKO8YBAu3EswbBEu3VSW8NRMW3A==",
            (("https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css",
              "dist/css/bootstrap-prefers-dark.css"),)),
    Package("@fortawesome/fontawesome-free", "6.6.0",
            "sha512-60G28ke/sXdtS9KZCpZSHHkCbdsOGEhIUGlwq6yhY74UpTiToIh8np7A8yphhM4BWsvNFtIvLpi4co+h9Mr9Ow==",
            (("https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css", "css/all.min.css"),),
            ("webfonts",)),
    # the templates ask for the newest vega 5, vega-lite 5 and vega-embed 6: these are those, pinned
    Package("vega", "5.33.1", "sha512-1fArfVDUqVbb5z8n+/nVQb+VNBzx8svY6CrsyTK4Ujm4yrd9I1auoKxBAPXLCavY1LcrbHUskQbGUP8gXOzyQw==",
            (("https://cdn.jsdelivr.net/npm/vega@5", "build/vega.min.js"),)),
    Package("vega-lite", "5.23.0",
            "sha512-l4J6+AWE3DIjvovEoHl2LdtCUkfm4zs8Xxx7INwZEAv+XVb6kR6vIN1gt3t2gN2gs/y4DYTs/RPoTeYAuEg6mA==",
            (("https://cdn.jsdelivr.net/npm/vega-lite@5", "build/vega-lite.min.js"),)),
    Package("vega-embed", "6.29.0",
            "sha512-PmlshTLtLFLgWtF/b23T1OwX53AugJ9RZ3qPE2c01VFAbgt3/GSNI/etzA/GzdrkceXFma+FDHNXUppKuM0U6Q==",
            (("https://cdn.jsdelivr.net/npm/vega-embed@6", "build/vega-embed.min.js"),)),
)

# GX's logos, from the images GX ships in its own package (static/images of every site)
_LOGOS = re.compile(r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/[A-Za-z_-]+\.png[^\"']*")
_NEWSLETTER = re.compile(r"<p>\s*Stay current on everything GX with our newsletter.*?</p>", re.DOTALL)
# the CDNs' subresource-integrity attributes: the same bytes are served from the site now
_STATIC = re.compile(r'\b(src|href)="(?:\.\./)*static/')
_INTEGRITY = re.compile(r'\s+(integrity="[^"]*"|crossorigin="anonymous")')


def assets_dir() -> Path:
    """Where `make assets` puts the files: beside this module, inside the installed project."""
    return Path(__file__).parent / "docs_static"


def missing() -> list[str]:
    root = assets_dir()
    return [f"{p.name}@{p.version}" for p in PACKAGES if not (root / p.home / ".complete").is_file()]


def fetch() -> list[str]:
    """Download each package not yet here, check its tarball against the pinned integrity, keep the files
    the pages use. Returns what was fetched."""
    fetched = []
    for package in PACKAGES:
        home = assets_dir() / package.home
        if (home / ".complete").is_file():
            continue
        with urllib.request.urlopen(package.tarball, timeout=120) as response:
            blob = response.read()
        digest = "sha512-" + base64.b64encode(hashlib.sha512(blob).digest()).decode()
        if digest != package.integrity:
            raise ConfigError(f"{package.tarball}: integrity {digest} is not the pinned {package.integrity}")
        shutil.rmtree(home, ignore_errors=True)
        wanted = {f"package/{inside}" for _, inside in package.files}
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as archive:
            for member in archive.getmembers():
                # of the fonts, the woff2 files every browser in use loads
                keep = member.name in wanted or any(member.name.startswith(f"package/{d}/") and
                                                    member.name.endswith(".woff2") for d in package.folders)
                if member.isfile() and keep:
                    target = home / member.name.removeprefix("package/")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = archive.extractfile(member)
                    assert source is not None
                    target.write_bytes(source.read())
        absent = [inside for _, inside in package.files if not (home / inside).is_file()]
        if absent:
            raise ConfigError(f"{package.tarball} has no {', '.join(absent)}")
        (home / ".complete").write_text(package.integrity)
        fetched.append(f"{package.name}@{package.version}")
    return fetched


def site_files() -> dict[str, Path]:
    """Each vendored file by its path inside `_assets/`; a ConfigError when `make assets` has not run."""
    absent = missing()
    if absent:
        raise ConfigError(f"Data Docs assets not fetched ({', '.join(absent)}): run `make assets` "
                          "(python -m spark_jobs assets)")
    root = assets_dir()
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (".complete", ".fetched")}


def offline_page(html: str, depth: int) -> str:
    """A Data Docs page that loads nothing from the internet: CDN URLs point at the site's vendored copies,
    logos at GX's own images, no newsletter. `depth`: how many folders below the site root the page is."""
    up = "../" * depth
    # GX counts a dotted suite name (`orders.silver.events`) as one folder when it makes a page's links to
    # the site's static files, and writes it as three: the real depth is the one that holds
    html = _STATIC.sub(lambda m: f'{m.group(1)}="{up}static/', html)
    for package in PACKAGES:
        for url, inside in package.files:
            html = html.replace(url, f"{up}../{VENDOR}/{package.home}/{inside}")
    html = _LOGOS.sub(f"{up}static/images/logo-long.png", html)
    html = _NEWSLETTER.sub("", html)
    return _INTEGRITY.sub("", html)


# GX's page templates carry inline scripts and onclick handlers; the pages are served under a Content-Security-Policy
# that runs no inline code (plugins/cdc_reports.py), so the scripts move into files beside their page and the
# templates' own handlers (only these) become data attributes that HANDLERS binds. Any other on* attribute is dropped.
GX_HANDLERS = re.compile(r"^(showAllValidations|hideSucceededValidations)\(\)$|^(clearTableFilters)\('([\w-]+)'\)$")
HANDLERS_FILE = "cdc/handlers.js"  # in VENDOR
HANDLERS = """// The clicks GX's Data Docs templates bind with inline onclick handlers, bound here instead: the pages run no
// inline code (their Content-Security-Policy). Only these functions of GX's own page scripts can be called.
document.addEventListener("click", function (event) {
  var target = event.target.closest("[data-cdc-click]");
  var name = target && target.getAttribute("data-cdc-click");
  if (["showAllValidations", "hideSucceededValidations", "clearTableFilters"].indexOf(name) < 0) return;
  var arg = target.getAttribute("data-cdc-arg");
  if (arg === null) window[name](); else window[name](arg);
});
"""
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)([^>]*)>(.*?)</script>", re.DOTALL | re.IGNORECASE)
_START_TAG = re.compile(r"<[A-Za-z][^<>]*>")
_HANDLER = re.compile(r"""\s+on[A-Za-z]+\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", re.IGNORECASE)


def without_inline_code(page: str, name: str, depth: int) -> tuple[str, list[tuple[str, str]]]:
    """The page with each inline script moved to a file beside it (`<name>.script-<n>.js`, returned as (file name,
    code) in page order) and GX's onclick handlers turned into data attributes; `depth` as for offline_page."""
    scripts: list[tuple[str, str]] = []

    def moved(match: re.Match[str]) -> str:
        if not match.group(2).strip():
            return ""
        scripts.append((f"{name}.script-{len(scripts) + 1}.js", match.group(2)))
        return f'<script{match.group(1)} src="{scripts[-1][0]}"></script>'

    def handlers(tag: re.Match[str]) -> str:
        def replaced(attribute: re.Match[str]) -> str:
            value = attribute.group(1).strip("\"'")
            known = GX_HANDLERS.match(value) if attribute.group(0).strip().lower().startswith("onclick") else None
            if known is None:
                return ""
            if known.group(1):
                return f' data-cdc-click="{known.group(1)}"'
            return f' data-cdc-click="{known.group(2)}" data-cdc-arg="{known.group(3)}"'
        return _HANDLER.sub(replaced, tag.group(0))

    page = _START_TAG.sub(handlers, _INLINE_SCRIPT.sub(moved, page))
    binder = f'<script src="{"../" * depth}../{VENDOR}/{HANDLERS_FILE}"></script>'
    return (page.replace("</body>", f"{binder}</body>", 1) if "</body>" in page else page + binder), scripts
