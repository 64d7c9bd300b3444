"""GX Data Docs, offline: the styles and scripts their pages take from public CDNs, fetched once from the npm
registry at pinned versions (`make assets`, like `make jars`), copied once into the lake beside the tables'
Data Docs sites (`reports/data_docs/_assets/`) and linked from their pages instead of the CDNs; GX's
logos come from its own package, and the newsletter footer goes.
Without this, a lake behind a firewall shows its Data Docs unstyled, without tables or charts.

GX has no setting for where its pages load these from (the URLs are in its page templates), so the pages
are rewritten as the Data Docs store writes them (quality/gx_store.py)."""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import io
import json
import re
import shutil
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.errors import ConfigError

VENDOR = "_assets"  # where the files sit, beside the sites (reports/data_docs/<table>/)
# GX's own static files (fonts, images, styles: 3.9 MB), one copy beside the sites for all of them (gx_store)
GX_STATIC = "_gx_static"
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

# GX's logos, from the images GX ships in its own package (the static/images of the sites' one copy, GX_STATIC)
_LOGOS = re.compile(r"https://great-expectations-web-assets\.s3\.us-east-2\.amazonaws\.com/[A-Za-z_-]+\.png[^\"']*")
_NEWSLETTER = re.compile(r"<p>\s*Stay current on everything GX with our newsletter.*?</p>", re.DOTALL)
# the CDNs' subresource-integrity attributes: the same bytes are served from the site now
_STATIC = re.compile(r'\b(src|href)="(?:\.{1,2}/)*static/')  # GX's `./static/`, `../../static/` ...
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


def not_fetched() -> str | None:
    """Why Data Docs pages cannot be built here (None: they can): the packages `make assets` has not fetched."""
    absent = missing()
    if not absent:
        return None
    return f"Data Docs assets not fetched ({', '.join(absent)}): run `make assets` (python -m spark_jobs assets)"


def site_files() -> dict[str, Path]:
    """Each vendored file by its path inside `_assets/`; a ConfigError when `make assets` has not run."""
    why = not_fetched()
    if why:
        raise ConfigError(why)
    root = assets_dir()
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in (".complete", ".fetched")}


def offline_page(html: str, depth: int) -> str:
    """A Data Docs page that loads nothing from the internet: CDN URLs point at the sites' vendored copies,
    GX's static files and logos at the sites' one copy of them, no newsletter. `depth`: how many folders below the
    site root the page is."""
    up = "../" * depth
    # GX counts a dotted suite name (`orders.silver.events`) as one folder when it makes a page's links to
    # the site's static files, and writes it as three: the real depth is the one that holds
    html = _STATIC.sub(lambda m: f'{m.group(1)}="{up}../{GX_STATIC}/', html)
    for package in PACKAGES:
        for url, inside in package.files:
            html = html.replace(url, f"{up}../{VENDOR}/{package.home}/{inside}")
    html = _LOGOS.sub(f"{up}../{GX_STATIC}/images/logo-long.png", html)
    html = _NEWSLETTER.sub("", html)
    return _INTEGRITY.sub("", html)


# GX's page templates carry inline scripts and onclick handlers; the pages are served under a Content-Security-Policy
# that runs scripts only from the vendored files, served from the installed package, never from the lake
# (plugins/cdc_reports.py). So a page keeps only what GX's own templates write: each inline script is either one of
# the templates' fixed scripts (served as a vendored copy, GX_FIXED), or one of the two that carry a page's data
# (a table's rows, a chart's spec), whose data becomes a JSON block the fixed GX_DATA script draws; any other
# script, inline or from another file, is dropped. The templates' own onclick handlers (only these) become data
# attributes that HANDLERS binds; any other on* attribute is dropped.
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
GX_DATA_FILE = "cdc/gx-data.js"  # in VENDOR
GX_DATA = """// GX's tables and charts, drawn from the JSON blocks its pages carry (spark_jobs/quality/docs_assets.py): the call
// GX's templates write inline with the data in it (bootstrap_table.j2, graph.j2), made here with the data as data.
(function () {
  function each(kind, draw) {
    document.querySelectorAll('script[type="application/json"].' + kind).forEach(function (block) {
      draw(JSON.parse(block.textContent));
    });
  }
  each("cdc-gx-table", function (t) {
    var table = $("#" + t.id);
    table.bootstrapTable(Object.assign({columns: t.columns, data: t.data, toolbar: "#" + t.toolbar}, t.options));
    if (t.title_row) $("#" + t.id + " > thead").prepend(t.title_row);
    if (t.row_links) {
      $(document).ready(function () {
        table.on("click-row.bs.table", function (e, row, $element) { window.location = $element.data("href"); });
      });
    }
  });
  each("cdc-gx-graph", function (g) {
    vegaEmbed("#" + g.id, g.spec, {actions: false}).catch(console.warn);
  });
})();
"""
_INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)([^>]*)>(.*?)</script>", re.DOTALL | re.IGNORECASE)
_SCRIPT_FILE = re.compile(r"""<script\b[^>]*\bsrc\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)[^>]*>\s*</script>""", re.IGNORECASE)
_START_TAG = re.compile(r"<[A-Za-z][^<>]*>")
_HANDLER = re.compile(r"""\s+on[A-Za-z]+\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", re.IGNORECASE)
_TEMPLATE_CODE = re.compile(r"{[{%#]")
# bootstrap_table.j2's script, as rendered: the table's columns, rows and options are Python literals in it
_TABLE = re.compile(r"""\s*\$\('\#(?P<id>[\w-]+)'\)\.bootstrapTable\(\s*Object\.assign\(\s*\{\s*
    columns:\s*(?P<columns>\[.*?\]),\s*data:\s*(?P<data>\[.*\]),\s*toolbar:\s*'\#(?P<toolbar>[\w-]+)'\s*\},\s*
    (?P<options>\{[^{}]*\})\s*\)\s*\);
    (?:\s*\$\("\#(?P=id)\ >\ thead"\)\.prepend\((?P<title>'.*?')\);)?
    (?P<links>\s*\$\(document\)\.ready\(function\(\)\ \{\s*\$\("\#(?P=id)"\)\.on\('click-row\.bs\.table',\s*
    function\(e,\ row,\ \$element\)\ \{\s*window\.location\ =\ \$element\.data\("href"\);\s*\}\)\s*\}\s*\);)?
    \s*""", re.DOTALL | re.VERBOSE)
# graph.j2's: a chart's Vega-Lite spec (JSON)
_GRAPH = re.compile(r"""\s*//[^\n]*\n\s*vlSpec\ =\ (?P<spec>\{.*\});\s*//[^\n]*\n\s*
    vegaEmbed\('\#(?P<id>[\w-]+)',\ vlSpec,\ \{\s*actions:\ false\s*\}\)\.then\(result=>console\.log\(result\)\)
    \.catch\(console\.warn\);\s*""", re.DOTALL | re.VERBOSE)


def _fingerprint(code: str) -> str:
    """A fixed script's name, the same for any indentation the page renders it with."""
    return hashlib.sha256("".join(code.split()).encode()).hexdigest()[:16]


@functools.cache
def gx_fixed() -> dict[str, str]:
    """GX_FIXED: `cdc/gx-<fingerprint>.js` -> code, for each inline script of GX's page templates with no template
    code in it (the functions its tables and buttons call, the page's modal and footer), read from the installed GX."""
    import importlib.util

    spec = importlib.util.find_spec("great_expectations")  # found, not imported: the API server serves these too
    assert spec is not None and spec.submodule_search_locations, "great_expectations is not installed"
    templates = Path(list(spec.submodule_search_locations)[0]) / "render" / "view" / "templates"
    found = {}
    for template in sorted(templates.glob("*.j2")):
        for _, code in _INLINE_SCRIPT.findall(template.read_text()):
            if code.strip() and not _TEMPLATE_CODE.search(code):
                found[f"cdc/gx-{_fingerprint(code)}.js"] = code
    return found


def vendored_files() -> dict[str, bytes]:
    """Every file of VENDOR by its path inside it: the pinned packages, and the scripts above. The only scripts the
    reports' pages may run; plugins/cdc_reports.py serves them from here, whatever the lake holds."""
    files = {inside: source.read_bytes() for inside, source in site_files().items()}
    files.update({HANDLERS_FILE: HANDLERS.encode(), GX_DATA_FILE: GX_DATA.encode()})
    files.update({name: code.encode() for name, code in gx_fixed().items()})
    return files


def _json_block(kind: str, data: dict) -> str:
    """Data as a JSON block the page never runs; `</` and `<!--` escaped so no value can end or bend the block."""
    text = json.dumps(data, ensure_ascii=False).replace("</", "<\\/").replace("<!--", "\\u003c!--")
    return f'<script type="application/json" class="{kind}">{text}</script>'


def _literal(text: str) -> object:
    """A value GX rendered into its script: JSON, or (a dict the template printed) a Python literal."""
    try:
        return json.loads(text)
    except ValueError:
        return ast.literal_eval(text)


def _data_block(code: str) -> str | None:
    """The JSON block in place of GX's table or chart script, or None when the script is neither."""
    try:
        if table := _TABLE.fullmatch(code):
            return _json_block("cdc-gx-table", {
                "id": table["id"], "toolbar": table["toolbar"], "columns": ast.literal_eval(table["columns"]),
                "data": ast.literal_eval(table["data"]), "options": ast.literal_eval(table["options"]),
                "title_row": ast.literal_eval(table["title"]) if table["title"] else None,
                "row_links": bool(table["links"])})
        if graph := _GRAPH.fullmatch(code):
            return _json_block("cdc-gx-graph", {"id": graph["id"], "spec": _literal(graph["spec"])})
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):  # not GX's literals: not GX's script
        return None
    return None


def without_inline_code(page: str, depth: int) -> tuple[str, int]:
    """The page with only GX's own scripts, none inline (see above), and GX's onclick handlers as data attributes;
    `depth` as for offline_page. Returns the page and how many scripts it lost."""
    vendor = f"{'../' * depth}../{VENDOR}/"
    fixed = {_fingerprint(code): name for name, code in gx_fixed().items()}
    dropped = 0

    def inline(match: re.Match[str]) -> str:
        nonlocal dropped
        code = match.group(2)
        if not code.strip():
            return ""
        if name := fixed.get(_fingerprint(code)):
            return f'<script src="{vendor}{name}"></script>'
        if block := _data_block(code):
            return block
        dropped += 1
        return ""

    def from_file(match: re.Match[str]) -> str:  # the vendored files only (offline_page pointed GX's CDNs there)
        nonlocal dropped
        source = match.group(1).strip("\"'")
        if source.startswith(vendor) and "/../" not in source[len(vendor) - 1:]:
            return match.group(0)
        dropped += 1
        return ""

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

    blocks: list[str] = []  # set aside while the handlers go: their JSON is data, not markup to rewrite

    def set_aside(match: re.Match[str]) -> str:
        kept = inline(match)
        if not kept.startswith('<script type="application/json"'):
            return kept
        blocks.append(kept)
        return f"\x00{len(blocks) - 1}\x00"

    page = _START_TAG.sub(handlers, _SCRIPT_FILE.sub(from_file, _INLINE_SCRIPT.sub(set_aside, page.replace("\x00", ""))))
    page = re.sub(r"\x00(\d+)\x00", lambda m: blocks[int(m.group(1))], page)
    runners = f'<script src="{vendor}{GX_DATA_FILE}"></script><script src="{vendor}{HANDLERS_FILE}"></script>'
    return (page.replace("</body>", f"{runners}</body>", 1) if "</body>" in page else page + runners), dropped
