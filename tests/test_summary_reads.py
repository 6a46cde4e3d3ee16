"""The summary's readers read typed fields: ``findings.py`` indexes nothing by a string literal
(issue 23: it once read the summary dict ~196 times by string keys, with one-letter names)."""
from __future__ import annotations

import ast
from pathlib import Path

import neuron_prof

ROOT = Path(neuron_prof.__file__).resolve().parent
TYPED_READERS = ("reports/findings.py", "reports/summary/text.py", "reports/compare.py", "analysis/compare.py")


def _string_subscripts(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [f"{path.name}:{node.lineno} [{node.slice.value!r}]" for node in ast.walk(tree)
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)]


def test_findings_reads_no_field_by_a_string_literal():
    assert _string_subscripts(ROOT / "reports" / "findings.py") == []


def test_the_check_sees_a_string_subscript(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(s):\n    return s['compile']['graph_breaks']\n")
    assert sorted(_string_subscripts(bad)) == ["bad.py:2 ['compile']", "bad.py:2 ['graph_breaks']"]


def test_the_text_report_reads_no_summary_field_by_a_string_literal():
    # summary/text.py renders the typed Summary; a string subscript there would be a dict read
    assert _string_subscripts(ROOT / "reports" / "summary" / "text.py") == []
