"""tools/mutate.py's mutants stay applicable: each one's text occurs exactly once in its
file (else a full run reports it BROKEN, and the bug it stands for is no longer tried)
and the tests it runs exist. Refactors that move a line must move its mutant too."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_applies_to_the_current_code(tool):
    mutate = tool("mutate")
    assert len(mutate.MUTANTS) > 50
    names = [m.name for m in mutate.MUTANTS]
    assert len(names) == len(set(names))
    broken = [m.name for m in mutate.MUTANTS
              if (ROOT / m.path).read_text().count(m.old) != 1 or m.old == m.new]
    assert broken == []
    missing = [(m.name, t) for m in mutate.MUTANTS for t in m.tests
               if not (ROOT / t.split("::")[0]).exists()]
    assert missing == []
