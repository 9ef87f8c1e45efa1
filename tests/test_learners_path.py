"""The learner's path (issue 30): what a chapter shows its reader, checked on the notebook's text.

* No visible cell prints the package's source (`inspect.getsource`): a chapter grows its own
  minimal code in visible cells and proves it equal to `companion`.
* Every Correction of a seed post is a folded dropdown (the corrections appendix keeps them all).
* The opening says what the reader builds, not what a seed post got wrong; the rest of the
  chapter names the seed posts at most a handful of times outside the Correction boxes.
"""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOOK = sorted((ROOT / "book").glob("ch*.ipynb"))
HIDDEN = {"remove-cell", "remove-input"}
MAX_SEED_MENTIONS = 4

# A mention of a seed post: "seed 001", "seed posts", "seeds 000 and 003", "the seed's code", ...
# (not a random seed: "three seeds", "seed everything", "over five seeds" are not matched).
SEED = re.compile(
    r"\b(?:seed\s+(?:posts?|\d{3})|seeds\s+\d{3}"
    r"|(?:the|a|this|that|each|one)\s+seeds?(?:'s|')?\s+(?:post|posts|does|writes|says|claims|calls|states"
    r"|uses|gives|builds|shows|code|block|class|example|formula)\b"
    r"|the\s+seed's|seed's\s+(?:claim|code|block|class|formula|example))",
    re.I,
)
CORRECTION = re.compile(r"^(:{3,})\{admonition\}\s*Correction.*?^\1\s*$", re.S | re.M)


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell):
    return "".join(cell["source"])


def markdown(path):
    return [text(c) for c in cells(path) if c["cell_type"] == "markdown"]


def test_the_seed_pattern_tells_a_seed_post_from_a_random_seed():
    assert SEED.findall("Seed 001 writes a block; the seed posts say so; seeds 000 and 003 agree")
    assert len(SEED.findall("as the seed's code shows")) == 1
    assert not SEED.findall("over three seeds, seed everything, every seed below every seed, seed=0")


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.stem)
def test_no_visible_cell_prints_package_source(path):
    shown = [i for i, c in enumerate(cells(path))
             if c["cell_type"] == "code" and not set(c["metadata"].get("tags", [])) & HIDDEN
             and "getsource" in text(c)]
    assert not shown, f"{path.name}: cells {shown} print package source; grow the code in the chapter instead"


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.stem)
def test_every_correction_is_folded(path):
    unfolded = [m.group(0).splitlines()[0] for md in markdown(path) for m in CORRECTION.finditer(md)
                if not re.search(r"^:class:.*\bdropdown\b", m.group(0), re.M)]
    assert not unfolded, f"{path.name}: add `dropdown` to the class of {unfolded}"


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.stem)
def test_the_opening_does_not_argue_with_the_seed_posts(path):
    opening = []
    for md in markdown(path):
        head, found_section = re.split(r"^## ", md, maxsplit=1, flags=re.M)[0], re.search(r"^## ", md, re.M)
        opening.append(head)
        if found_section:
            break
    found = SEED.findall("\n".join(opening))
    assert not found, f"{path.name}: the opening mentions the seed posts ({found}); say what the reader builds"


@pytest.mark.parametrize("path", BOOK, ids=lambda p: p.stem)
def test_the_seed_posts_are_named_a_handful_of_times_outside_corrections(path):
    found = [m.group(0) for md in markdown(path) for m in SEED.finditer(CORRECTION.sub("", md))]
    assert len(found) <= MAX_SEED_MENTIONS, (
        f"{path.name}: {len(found)} mentions of the seed posts outside Correction boxes "
        f"(at most {MAX_SEED_MENTIONS}): {found}")
