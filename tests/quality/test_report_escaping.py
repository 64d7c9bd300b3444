"""Source values holding markup are shown as text on every page under the lake's reports: the run pages and GX's
Data Docs (whose sampled unexpected values GX puts into its pages as they are), checked with an HTML parser on
every page and in a real browser on the Data Docs page that samples them."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from tests.support import run

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
    """Every element of a page with its attributes, and the text of its scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


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
        # and no inline code at all: every page runs under the plugin's script-src 'self' (cdc_reports.POLICY)
        assert not [s for s in tags.scripts if s.strip()], page
        assert not [(tag, name) for tag, attrs in tags.elements for name in attrs if name.startswith("on")], page
        if any(payload in "".join(tags.text) for payload in PAYLOADS):
            sampled.append(page)
    # GX's validation page of the user's expectations shows the values, as text
    assert any("data_docs" in str(p) and "silver.upserts" in p.name for p in sampled), [str(p) for p in pages]
    shown = opened_in_chromium(next(p for p in sampled if "data_docs" in str(p)))
    assert shown["title"] != "XSS" and all(payload in shown["text"] for payload in PAYLOADS[:3]), shown


def opened_in_chromium(page: Path) -> dict[str, str]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-background-networking",
                "--allow-file-access-from-files"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(page.as_uri())
        driver.execute_script("return document.readyState")
        return {"title": driver.title, "text": driver.find_element("tag name", "body").text}
    finally:
        driver.quit()


def test_gx_pages_lose_their_inline_code_and_keep_only_gx_s_own_handlers():
    from spark_jobs.quality.docs_assets import without_inline_code

    page = ("<html><body><script>function showAllValidations() {}</script>"
            "<label onclick=\"showAllValidations()\">all</label><button type='button' "
            "onclick=\"clearTableFilters('section-1-table')\">clear</button>"
            "<img src='x' onerror=\"alert(1)\"><a href='#' ONMOUSEOVER='alert(2)'>a</a>"
            "<div onclick=\"showAllValidations();alert(3)\">d</div>"
            "<script src='../x.js'></script><script type='text/javascript'>\nvar data = [1];\n</script>"
            "<p>text with onclick=\"x()\" in it</p></body></html>")
    rewritten, scripts = without_inline_code(page, "index.html", 1)
    assert scripts == [("index.html.script-1.js", "function showAllValidations() {}"),
                       ("index.html.script-2.js", "\nvar data = [1];\n")]
    assert rewritten == (
        '<html><body><script src="index.html.script-1.js"></script>'
        '<label data-cdc-click="showAllValidations">all</label><button type=\'button\' '
        'data-cdc-click="clearTableFilters" data-cdc-arg="section-1-table">clear</button>'
        "<img src='x'><a href='#'>a</a><div>d</div>"
        "<script src='../x.js'></script><script type='text/javascript' src=\"index.html.script-2.js\"></script>"
        '<p>text with onclick="x()" in it</p><script src="../../_assets/cdc/handlers.js"></script></body></html>')
