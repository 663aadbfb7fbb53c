"""The docs a user reads state what holds: the benchmarks by topic, short, without a lab notebook's history (git keeps
it), and every section another file cites by name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def test_the_benchmarks_are_current_results_not_history():
    text = BENCHMARKS.read_text()
    assert len(text.splitlines()) <= 700
    assert not re.search(r"\bissues? \d+", text), "issue numbers belong to the issues, not the docs"
    assert "tried, not kept" not in text


def test_every_cited_benchmarks_section_exists():
    headings = {line.lstrip("#").strip() for line in BENCHMARKS.read_text().splitlines() if line.startswith("#")}
    cited = []
    for path in [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "profiles").glob("*.toml")]:
        for match in re.finditer(r'benchmarks\.md`?,? "([^"]+)"',
                                 path.read_text().replace("\n# ", " ").replace("\n", " ")):
            cited.append((path.name, match.group(1)))
    assert cited, "the pattern finds the citations"
    for name, title in cited:
        assert any(heading.startswith(title) for heading in headings), f"{name} cites a missing section: {title}"
