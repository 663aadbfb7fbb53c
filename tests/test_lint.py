"""The source tree passes the project's lint rules (pyproject's `[tool.ruff.lint]`: long lines, pyflakes, import
order), so a slip shows here rather than in a reader's editor."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_tree_passes_ruff():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "specchat", "tests", "scripts"],
                            cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
