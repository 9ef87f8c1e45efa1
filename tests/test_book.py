"""The website builds with no warnings, and a chapter page has what a reader needs."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", str(ROOT), "--path-output", str(out), "-W", "-n", "--keep-going"],
        capture_output=True, text=True,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    assert "WARNING" not in log, [l for l in log.splitlines() if "WARNING" in l][:10]
    html = out / "_build" / "html"
    assert (html / "index.html").exists()
    yield html
    shutil.rmtree(out, ignore_errors=True)


def chapter_pages(html):
    return sorted(p for p in (html / "book").glob("ch*.html"))


def test_every_chapter_page_is_built(site):
    notebooks = sorted(p.stem for p in (ROOT / "book").glob("ch*.ipynb"))
    assert [p.stem for p in chapter_pages(site)] == notebooks


def test_chapter_pages_have_math_figures_outputs_and_launch_buttons(site):
    for page in chapter_pages(site):
        text = page.read_text(encoding="utf-8")
        assert 'class="math' in text, f"{page.name}: no rendered math"
        assert re.search(r'<img[^>]+src="[^"]+\.png"', text), f"{page.name}: no figure"
        assert "cell_output" in text, f"{page.name}: no outputs"
        assert f"colab.research.google.com/github/" in text and f"{page.stem}.ipynb" in text, f"{page.name}: no Colab button"
        assert "glue:" not in text and "{glue" not in text, f"{page.name}: a glue role was not resolved"


def test_glued_numbers_appear_in_the_chapter_2_prose(site):
    text = re.sub(r"<[^>]+>", "", (site / "book" / "ch02_attention.html").read_text(encoding="utf-8"))
    # The prose says the variance of q.k at d_k = 64 is about 64; the number comes from glue.
    match = re.search(r"have variance ([0-9.]+)", text)
    assert match and 60 < float(match.group(1)) < 68


def test_landing_page_lists_fifteen_chapters(site):
    text = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    numbered = re.findall(r"^(\d+)\. ", text, flags=re.M)
    assert [int(n) for n in numbered] == list(range(1, 16))
