"""The website build the book and browser tests share: the README's first command, into a folder."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_site(out: Path) -> str:
    """Build the book into ``out`` with warnings as errors; return the build log (asserts success)."""
    jb = Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run(
        [str(jb), "build", str(ROOT), "--path-output", str(out), "-W", "-n", "--keep-going"],
        capture_output=True, text=True,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-5000:]
    return log
