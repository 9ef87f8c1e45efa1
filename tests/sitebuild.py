"""The website build the book and browser tests share: both editions, into a folder.

``tools/i18n.py build`` runs the README's build command (``jupyter-book build . -W -n
--keep-going``) for the English edition and again with ``language: zh_CN`` for the
Chinese one, and puts them together as they are published: English at ``out/html``,
Chinese at ``out/html/zh_CN``.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

def toc_docnames() -> list[str]:
    """Every page of the book, in table-of-contents order (root first)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    return [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part.get("chapters", [])]


BUILD_SECONDS: dict[str, float] = {}  # edition -> seconds of its last build (printed in the suite's summary)


def build_site(out: Path) -> dict[str, str]:
    """Build both editions into ``out/html`` with warnings as errors; return each build's log."""
    import i18n

    logs = i18n.build(out, timings=BUILD_SECONDS)
    record = ROOT / "_build" / "site-build-seconds.json"
    record.parent.mkdir(exist_ok=True)
    record.write_text(json.dumps({k: round(v, 1) for k, v in BUILD_SECONDS.items()}), encoding="utf-8")
    return logs
