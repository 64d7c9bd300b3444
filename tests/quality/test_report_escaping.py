"""Source values holding markup are shown as text on every page under the lake's reports: the run pages and GX's
Data Docs (whose sampled unexpected values GX puts into its pages as they are), checked with an HTML parser on
every page and in a real browser on the Data Docs page that samples them."""

from __future__ import annotations

import json
from html.parser import HTMLParser

from tests.support import opened_in_chromium, run

TOPIC = "shop.public.orders"
# each would change the page's title if it ran
PAYLOADS = ("<img src=x onerror=\"document.title='XSS'\">", "<script>document.title='XSS'</script>",
            "<svg onload=\"document.title='XSS'\"></svg>", "\"><iframe srcdoc='<b>x</b>'></iframe>")
CONFIG = f"""tables:
  orders:
    topic: {TOPIC}
    keys: [id]
    expectations:
      - expect_column_values_to_match_regex: {{column: note, regex: "^[a-z]+$"}}
        action: warn
      - expect_column_values_to_be_in_set: {{column: note, value_set: [ok]}}
        action: quarantine
"""


class Tags(HTMLParser):
    """Every element of a page with its attributes, the text of its scripts (code), of its JSON blocks (data: a
    table's rows, which GX's fixed script draws) and the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.data: list[str] = []
        self.text: list[str] = []
        self._in: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        if tag == "script":
            self._in = self.data if dict(attrs).get("type") == "application/json" else self.scripts

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        (self.text if self._in is None else self._in).append(data)


def test_markup_in_source_values_is_text_on_every_report_page(spark, tmp_path, capsys):
    (tmp_path / "tables.yaml").write_text(CONFIG)
    folder = tmp_path / "landing" / "topics" / TOPIC / "partition=0"
    folder.mkdir(parents=True)
    events = [{"before": None, "after": {"id": key, "note": note}, "op": "c",
               "source": {"connector": "postgresql", "lsn": 10 + key, "snapshot": "false", "ts_ms": 1}}
              for key, note in enumerate(("ok", *PAYLOADS), start=1)]
    (folder / f"{TOPIC}+0+0000000000.json").write_text("\n".join(map(json.dumps, events)) + "\n")
    code, out, err = run(capsys, tmp_path / "tables.yaml", tmp_path / "landing", tmp_path / "lake",
                         "--max-quarantined", "100%")
    assert (code, err) == (0, ""), out
    pages = sorted((tmp_path / "lake" / "reports").rglob("*.html"))
    sampled = []
    for page in pages:
        tags = Tags()
        tags.feed(page.read_text())
        # no element, attribute or script came from a payload: none names the title, none is an iframe
        assert not [(tag, attrs) for tag, attrs in tags.elements if tag == "iframe" or any(
            name.startswith("on") and "XSS" in (value or "") for name, value in attrs.items())], page
        assert not [s for s in tags.scripts if "XSS" in s], page
        # and no inline code at all, and scripts from the vendored files only: the plugin's policy runs no other
        # (cdc_reports.policy); a table's rows are data, in JSON
        assert not [s for s in tags.scripts if s.strip()], page
        vendored = (tmp_path / "lake" / "reports" / "data_docs" / "_assets").resolve()
        sources = [attrs["src"] for tag, attrs in tags.elements if tag == "script" and attrs.get("src")]
        assert all((page.parent / str(src)).resolve().is_relative_to(vendored) for src in sources), (page, sources)
        for block in tags.data:
            json.loads(block)
        assert not [(tag, name) for tag, attrs in tags.elements for name in attrs if name.startswith("on")], page
        if any(payload in "".join(tags.text) for payload in PAYLOADS):
            sampled.append(page)
    # GX's validation page of the user's expectations shows the values, as text
    assert any("data_docs" in str(p) and "silver.upserts" in p.name for p in sampled), [str(p) for p in pages]
    shown = opened_in_chromium(next(p for p in sampled if "data_docs" in str(p)))
    assert shown["title"] != "XSS" and all(payload in shown["text"] for payload in PAYLOADS[:3]), shown


GX_TABLE = """
  $('#section-1-table').bootstrapTable(
    Object.assign(
      {
        columns: [{'field': 'run_name', 'title': 'Run Name', 'sortable': 'true'}],
        data: [{'run_name': 'orders.silver</b><!-- x', '_sort': 1.5}],
        toolbar: '#section-1-table-toolbar'
      },
      {'search': 'true', 'rowAttributes': 'rowAttributesLinks'}
    )
  );

    $(document).ready(function() {
      $("#section-1-table").on('click-row.bs.table', function(e, row, $element) {
          window.location = $element.data("href");
        })
      }
    );
"""


def test_gx_pages_keep_only_gx_s_own_scripts_none_inline():
    """What the Data Docs store writes (quality/docs_assets.py): GX's fixed scripts as the vendored copies, a table's
    rows as a JSON block its fixed script draws (no value can close or bend the block), GX's own onclick handlers as data
    attributes; any other script, inline or from a file outside the vendored ones, and any other handler, gone."""
    from spark_jobs.quality.docs_assets import GX_DATA, gx_fixed, vendored_files, without_inline_code

    functions = next(code for code in gx_fixed().values() if "function showAllValidations()" in code)
    page = (f"<html><body><script>{functions.strip()}</script>"
            "<label onclick=\"showAllValidations()\">all</label><button type='button' "
            "onclick=\"clearTableFilters('section-1-table')\">clear</button>"
            "<img src='x' onerror=\"alert(1)\"><a href='#' ONMOUSEOVER='alert(2)'>a</a>"
            "<div onclick=\"showAllValidations();alert(3)\">d</div>"
            "<script src='../x.js'></script><script src='../../_assets/cdc/../../orders/x.js'></script>"
            f"<script type='text/javascript'>\nvar data = [1];\n</script><script>{GX_TABLE}</script>"
            "<script src='../../_assets/jquery@3.7.1/dist/jquery.min.js'></script>"
            "<p>text with onclick=\"x()\" in it</p></body></html>")
    rewritten, dropped = without_inline_code(page, 1)
    fixed = next(name for name, code in gx_fixed().items() if code == functions)
    block = ('{"id": "section-1-table", "toolbar": "section-1-table-toolbar", "columns": [{"field": "run_name", '
             '"title": "Run Name", "sortable": "true"}], "data": [{"run_name": "orders.silver<\\/b>\\u003c!-- x", '
             '"_sort": 1.5}], "options": {"search": "true", "rowAttributes": "rowAttributesLinks"}, '
             '"title_row": null, "row_links": true}')
    assert rewritten == (
        f'<html><body><script src="../../_assets/{fixed}"></script>'
        '<label data-cdc-click="showAllValidations">all</label><button type=\'button\' '
        'data-cdc-click="clearTableFilters" data-cdc-arg="section-1-table">clear</button>'
        "<img src='x'><a href='#'>a</a><div>d</div>"
        f'<script type="application/json" class="cdc-gx-table">{block}</script>'
        "<script src='../../_assets/jquery@3.7.1/dist/jquery.min.js'></script>"
        '<p>text with onclick="x()" in it</p><script src="../../_assets/cdc/gx-data.js"></script>'
        '<script src="../../_assets/cdc/handlers.js"></script></body></html>')
    assert dropped == 3
    assert json.loads(block)["data"][0]["run_name"] == "orders.silver</b><!-- x"
    assert vendored_files()["cdc/gx-data.js"] == GX_DATA.encode() and vendored_files()[fixed] == functions.encode()


def test_a_gx_chart_s_spec_becomes_data_its_fixed_script_draws():
    """graph.j2's script prints the chart's Vega-Lite spec as a Python dict: the same spec, as JSON."""
    from spark_jobs.quality.docs_assets import without_inline_code

    code = """
    // Assign the specification to a local variable vlSpec.
    vlSpec = {'mark': {'type': 'bar'}, 'data': {'values': [{'x': 1, 'ok': True, 'n': None}]}};
    // Embed the visualization in the container with id `vis`
    vegaEmbed('#section-2-graph-child-1', vlSpec, {
        actions: false
    }).then(result=>console.log(result)).catch(console.warn);
"""
    page, dropped = without_inline_code(f"<html><body><script>{code}</script></body></html>", 0)
    assert (page, dropped) == (
        '<html><body><script type="application/json" class="cdc-gx-graph">{"id": "section-2-graph-child-1", "spec": '
        '{"mark": {"type": "bar"}, "data": {"values": [{"x": 1, "ok": true, "n": null}]}}}</script>'
        '<script src="../_assets/cdc/gx-data.js"></script><script src="../_assets/cdc/handlers.js"></script>'
        '</body></html>', 0)
