"""The HTML report in a real headless browser (Debian's chromium): the page of the bundled example (with its model
config and --gpu h200) loads without a script error, its SVG plots are drawn with a size and the page fits an
800-pixel window.

The report itself carries no script; the test adds a probe at the top of <head> that records every error
(window.onerror, unhandled rejections) into the DOM and, on load, the drawn size of each SVG; chromium's --dump-dom
then gives the DOM back. Skips when no chromium is installed (`make test` installs it as root with apt-get)."""

from __future__ import annotations

import html
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import decodegap

EXAMPLE_CONFIG = Path(decodegap.EXAMPLE_TRACE).parent / "example_model_config.json"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage")

PROBE = """<script>
(function () {
  var errors = [];
  function note(text) { errors.push(String(text)); var el = document.getElementById('dg-probe-errors');
                        if (el) el.textContent = JSON.stringify(errors); }
  window.onerror = function (msg, src, line) { note(msg + ' @' + line); };
  window.addEventListener('unhandledrejection', function (e) { note('rejection: ' + e.reason); });
  window.addEventListener('load', function () {
    var out = document.createElement('pre'); out.id = 'dg-probe-errors'; out.textContent = JSON.stringify(errors);
    document.body.appendChild(out);
    var sizes = [];
    document.querySelectorAll('svg').forEach(function (svg) {
      var box = svg.getBoundingClientRect(); sizes.push(Math.round(box.width) + 'x' + Math.round(box.height)); });
    var page = document.documentElement;  // a page wider than the window scrolls sideways: it does not fit
    sizes.push('page:' + page.scrollWidth + '/' + window.innerWidth);
    var marker = document.createElement('pre'); marker.id = 'dg-probe-loaded'; marker.textContent = sizes.join(' ');
    document.body.appendChild(marker);
  });
})();
</script>"""


def _browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def _dump_dom(browser: str, page: Path, profile: Path) -> str:
    run = subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", "--window-size=800,900",
                          "--virtual-time-budget=3000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _probe(dom: str) -> tuple[list[str], str | None]:
    errors = re.search(r"<pre id=\"dg-probe-errors\">(.*?)</pre>", dom, re.S)
    loaded = re.search(r"<pre id=\"dg-probe-loaded\">(.*?)</pre>", dom, re.S)
    return (html.unescape(errors.group(1)) if errors else None), (loaded.group(1) if loaded else None)


def _with_probe(page: str) -> str:
    return page.replace("<head>", "<head>" + PROBE, 1)


@pytest.fixture(scope="module")
def browser():
    found = _browser()
    if found is None:
        pytest.skip("no chromium binary on PATH (apt-get install chromium; `make test` does it as root)")
    return found


def test_example_page_renders_in_chromium(browser, tmp_path):
    out = tmp_path / "report.html"
    run = subprocess.run([sys.executable, "-m", "decodegap", "analyze", "--example", "--model", str(EXAMPLE_CONFIG),
                          "--gpu", "h200", "--format", "html", "-o", str(out)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    page = out.read_text()
    assert "<script" not in page  # the report is script-free; the probe below is the test's own
    probed = tmp_path / "probed.html"
    probed.write_text(_with_probe(page))
    dom = _dump_dom(browser, probed, tmp_path / "profile")
    errors, loaded = _probe(dom)
    assert loaded is not None, "the load event never came"
    assert errors == "[]", errors
    assert dom.count("<svg") == 3 and "Gap ledger" in dom and "GPU idle" in dom
    *svgs, page_width = loaded.split()
    sizes = [tuple(int(v) for v in s.split("x")) for s in svgs]
    assert len(sizes) == 3 and all(w > 300 and h > 50 for w, h in sizes), sizes  # drawn, with a size
    scroll, window = (int(v) for v in page_width.removeprefix("page:").split("/"))
    assert 0 < scroll <= window, page_width  # an 800-pixel window: the tables fit, nothing scrolls sideways


def test_the_probe_sees_a_script_error(browser, tmp_path):
    # the check above can fail: a page that throws is caught
    page = tmp_path / "broken.html"
    page.write_text(_with_probe("<!doctype html><html><head></head><body><svg></svg>"
                                "<script>undefinedFunction();</script></body></html>"))
    errors, loaded = _probe(_dump_dom(browser, page, tmp_path / "profile"))
    assert loaded is not None and "undefinedFunction" in errors
