"""The website as a reader sees it: every page in headless Chromium, offline, served from a sub-path.

The site is built once, served by ``http.server`` on 127.0.0.1 under
``/course/`` (so a page that assumes it lives at the server root fails), and
every page of the table of contents is opened in Debian's ``chromium`` driven by
Playwright (``executable_path``: no browser is downloaded). Every request that
leaves 127.0.0.1 is aborted and fails the page: a classroom without internet
must see what this test sees. A page fails when

* text still shows raw TeX (``\\(``, ``\\[``, ``$$``, ``\\begin{``) after MathJax
  has typeset, or MathJax reports an error;
* an image does not load, or a resource answers 4xx/5xx;
* the console logs an error or a script throws;
* a saved widget does not render (widget state must show offline);
* a chapter page has no Colab launch link to its notebook;
* a chapter page has no conceptual diagram (a figure named ``fig-chNN-diagram-...``)
  whose image loads and which carries a caption;
* an image of the content has no meaningful alt text (empty, a file name or a
  hash, or fewer than three words);
* the page scrolls horizontally at a 400 px wide viewport;
* Chinese text is not inside a ``lang="zh"`` element.

Every page is opened twice: in English and in the Chinese edition (under
``zh_CN/``). A Chinese page must also have its title in Chinese, a link to the
same page in English that loads, and its Chinese text drawn with a CJK font
(Chromium's own report of the fonts it used, over the DevTools protocol;
without a CJK font on the machine that check skips, saying so).

A full-page screenshot of every page (1280 px wide) and of the landing page at
400 px goes to ``_build/screenshots/``. Without Chromium or Playwright the test
skips and says why.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
from sitebuild import toc_docnames

ROOT = Path(__file__).resolve().parents[1]
SCREENSHOTS = ROOT / "_build" / "screenshots"
SUBPATH = "/course/"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
    "--font-render-hinting=none",
]


def chromium_path():
    path = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    return path


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if not path:
        pytest.skip("no Chromium: install Debian's `chromium` (apt-get install -y chromium; .ci/run does it) "
                    "or point $CHROMIUM at a Chromium binary")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - playwright is in requirements.txt
        pytest.skip(f"Playwright is not installed ({exc}); pip install -r requirements.txt")
    with sync_playwright() as pw:
        try:
            b = pw.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_FLAGS)
        except Exception as exc:
            pytest.skip(f"Chromium at {path} does not start under Playwright: {str(exc).splitlines()[0]}")
        yield b
        b.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Build the site and serve it on 127.0.0.1 under /course/; yields the base URL."""
    out = tmp_path_factory.mktemp("browser-site")
    from sitebuild import build_site

    build_site(out)  # both editions: out/html (English), out/html/zh_CN (Chinese)
    webroot = out / "webroot"
    webroot.mkdir()
    shutil.copytree(out / "html", webroot / SUBPATH.strip("/"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(webroot))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}{SUBPATH}"
    server.shutdown()
    server.server_close()
    shutil.rmtree(out, ignore_errors=True)


# Run in the page after load: what a reader would notice. Returns a list of problems.
INSPECT = r"""
async () => {
  const problems = [];
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
    if (MathJax.typesetPromise) { await MathJax.typesetPromise(); }
  }
  // Saved widget views: the embed manager renders each into a .widget-subarea beside its script.
  const rendered = s => [s.previousElementSibling, s.nextElementSibling].some(
    n => n && n.classList.contains('widget-subarea') && n.querySelector('.jupyter-widgets'));
  const views = [...document.querySelectorAll('script[type="application/vnd.jupyter.widget-view+json"]')];
  for (let i = 0; i < 100 && !views.every(rendered); i++) await new Promise(r => setTimeout(r, 100));
  views.forEach((s, i) => { if (!rendered(s)) problems.push(`widget ${i + 1} of ${views.length} did not render`); });
  const skip = 'script, style, pre, code, textarea, mjx-container, .highlight';
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const tex = /\\\(|\\\[|\$\$|\\begin\{/;
  const cjk = /[\u3400-\u4dbf\u4e00-\u9fff]/;
  let rawTex = [], untagged = [];
  while (walker.nextNode()) {
    const node = walker.currentNode, el = node.parentElement;
    if (!el || el.closest(skip)) continue;
    if (tex.test(node.textContent)) rawTex.push(node.textContent.trim().slice(0, 60));
    if (cjk.test(node.textContent)) {
      const tagged = el.closest('[lang]');
      if (!tagged || !tagged.getAttribute('lang').startsWith('zh')) untagged.push(node.textContent.trim().slice(0, 30));
    }
  }
  if (rawTex.length) problems.push(`raw TeX shown: ${JSON.stringify(rawTex.slice(0, 3))}`);
  if (untagged.length) problems.push(`Chinese text without lang="zh": ${JSON.stringify(untagged.slice(0, 3))}`);
  const merr = document.querySelectorAll('mjx-merror').length;
  if (merr) problems.push(`${merr} MathJax errors`);
  for (const img of document.images) {
    const name = img.getAttribute('src');
    if (!img.complete || img.naturalWidth === 0) problems.push(`image did not load: ${name}`);
    if (!img.closest('article')) continue;  // the theme's own icons (Colab logo in the launch menu)
    const alt = (img.getAttribute('alt') || '').trim();
    // A live widget's plot is drawn by the widget manager, which writes no alt text; the
    // static figure beside every widget (CONTRIBUTING, item 7) carries the description.
    if (img.closest('.widget-subarea')) continue;
    const fileLike = /\.(png|jpe?g|svg|gif)$/i.test(alt) || /^[0-9a-f]{12,}$/i.test(alt) || alt === name;
    const words = alt.split(/\s+/).length + (alt.match(/[\u4e00-\u9fff]/g) || []).length / 2;
    if (!alt || fileLike || words < 3)
      problems.push(`image without meaningful alt text: ${name.split('/').pop()} alt=${JSON.stringify(alt.slice(0, 40))}`);
  }
  return problems;
}
"""

# Run on a chapter page: its conceptual diagrams (figures named fig-chNN-diagram-...). Returns problems.
DIAGRAMS = r"""
(prefix) => {
  const problems = [];
  const figs = [...document.querySelectorAll(`[id^="${prefix}"]`)].map(el => el.closest('figure') || el);
  if (!figs.length) return [`no conceptual diagram (no figure named ${prefix}...)`];
  for (const fig of figs) {
    const img = fig.querySelector('img');
    if (!img || !img.complete || img.naturalWidth === 0) problems.push(`diagram ${fig.id} shows no image`);
    const caption = fig.querySelector('figcaption, .caption');
    if (!caption || caption.textContent.trim().split(/\s+/).length < 3) problems.push(`diagram ${fig.id} has no caption`);
  }
  return problems;
}
"""

OVERFLOW = r"""
() => {
  const d = document.documentElement;
  if (d.scrollWidth <= d.clientWidth + 1) return null;
  // Name what sticks out (not inside a scrolling or clipping box), to say what to fix.
  const clipped = el => { for (let a = el.parentElement; a && a !== d; a = a.parentElement)
    if (getComputedStyle(a).overflowX !== 'visible') return true; return false; };
  const name = el => `${el.tagName.toLowerCase()}${[...el.classList].map(c => '.' + c).join('')}`;
  let worst = null, right = d.clientWidth;
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.right > right + 1 && r.width > 0 && !clipped(el)) { right = r.right; worst = el; }
  }
  let what = '?';
  if (worst) {
    const chain = [];
    for (let el = worst; el && el !== document.body && chain.length < 4; el = el.parentElement) chain.push(name(el));
    what = chain.reverse().join(' > ') + ` "${worst.textContent.trim().slice(0, 50)}"`;
  }
  return `scrolls horizontally at 400 px: ${d.scrollWidth} > ${d.clientWidth} (widest: ${what})`;
}
"""


EDITION_CHECK = r"""
() => {
  const problems = [];
  const h1 = document.querySelector('article h1');
  const nameOnly = h1 && /^\d+\. [A-Z][A-Za-z0-9]*#?$/.test(h1.textContent.trim());  // "7. BERT"
  if (!h1 || !(/[\u4e00-\u9fff]/.test(h1.textContent) || nameOnly)) problems.push(`title not in Chinese: ${h1 && h1.textContent.slice(0, 40)}`);
  if (!document.documentElement.lang.startsWith('zh')) problems.push(`html lang is ${document.documentElement.lang}`);
  // The first paragraph of Chinese text: the node whose fonts cjk_font_problem asks Chromium about.
  const probe = [...document.querySelectorAll('article p, article h1')].find(p => /[\u4e00-\u9fff]/.test(p.textContent));
  if (probe) probe.setAttribute('data-cjk-probe', ''); else problems.push('no Chinese paragraph');
  const link = document.querySelector('.edition-switch a');
  if (!link) problems.push('no link to the English edition');
  // Code and math keep their own fonts: the CJK font rule must not reach them.
  for (const [what, selector] of [['code', 'article pre, article code'], ['math', 'article mjx-container mjx-c']]) {
    const el = document.querySelector(selector);
    const family = el ? getComputedStyle(el).fontFamily : '';
    if (/CJK|Han Sans|PingFang|YaHei|Hiragino/i.test(family.split(',')[0])) problems.push(`${what} drawn in the CJK font: ${family.slice(0, 60)}`);
  }
  return {problems, href: link ? link.href : null};
}
"""

CJK_FONT = re.compile(r"CJK|Han Sans|Han Serif|WenQuanYi|Hei|Song|Ming|Kai|PingFang|YaHei|Droid Sans Fallback", re.I)


def cjk_font_problem(page):
    """The fonts Chromium drew the page's first Chinese paragraph with, if none is a CJK font."""
    if not subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout.strip():
        return None  # no CJK font installed: nothing real to draw with (.ci/run installs fonts-noto-cjk)
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": "[data-cjk-probe]"})["nodeId"]
    if not node:
        return None  # EDITION_CHECK already reported the page without Chinese text
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    if not any(CJK_FONT.search(f["familyName"]) for f in fonts):
        return f"Chinese text drawn without a CJK font: {[f['familyName'] for f in fonts]}"
    return None


@pytest.mark.parametrize("edition", ["", "zh_CN/"], ids=["en", "zh"])
@pytest.mark.parametrize("docname", toc_docnames())
def test_page_in_a_browser(browser, served, docname, edition):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, service_workers="block")
    problems, remote = [], []

    def route(r):
        host = urlparse(r.request.url).hostname
        if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
            r.continue_()
        else:
            remote.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text[:200]}"))
    page.on("pageerror", lambda e: problems.append(f"script error: {str(e)[:200]}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    page.on("requestfailed", lambda r: urlparse(r.url).hostname == "127.0.0.1"
            and problems.append(f"request failed: {r.url}"))
    try:
        page.goto(served + edition + docname + ".html", wait_until="load")
        problems += page.evaluate(INSPECT)
        if edition:
            found = page.evaluate(EDITION_CHECK)
            problems += found["problems"]
            if found["href"] != served + docname + ".html":
                problems.append(f"the English link goes to {found['href']}")
            elif context.request.get(found["href"]).status != 200:
                problems.append(f"the English link does not load: {found['href']}")
            font = cjk_font_problem(page)
            if font:
                problems.append(font)
        if re.match(r"book/ch\d\d_", docname):
            notebook = docname.split("/")[-1] + ".ipynb"
            colab = page.locator(f'a[href^="https://colab.research.google.com/github/"][href$="/{notebook}"]')
            if colab.count() == 0:
                problems.append(f"no Colab launch link to {notebook}")
            problems += page.evaluate(DIAGRAMS, f"fig-ch{notebook[2:4]}-diagram-")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = (edition + docname).replace("/", "_")
        page.screenshot(path=str(SCREENSHOTS / f"{shot}.png"), full_page=True)
        page.set_viewport_size({"width": 400, "height": 800})
        page.wait_for_timeout(200)
        overflow = page.evaluate(OVERFLOW)
        if overflow:
            problems.append(overflow)
        if docname == toc_docnames()[0]:
            page.screenshot(path=str(SCREENSHOTS / f"{shot}-400px.png"), full_page=False)
    finally:
        context.close()
    problems += [f"request left the machine (aborted): {u}" for u in remote]
    assert not problems, f"{docname}:\n  " + "\n  ".join(dict.fromkeys(problems))
