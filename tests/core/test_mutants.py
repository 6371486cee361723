"""tools/mutate.py's mutants stay applicable: each one's text occurs exactly once in its
file (else a full run reports it BROKEN, and the bug it stands for is no longer tried)
and the tests it runs exist. Refactors that move a line must move its mutant too."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_mutant_applies_to_the_current_code():
    spec = importlib.util.spec_from_file_location("mutate", ROOT / "tools" / "mutate.py")
    mutate = importlib.util.module_from_spec(spec)
    sys.modules["mutate"] = mutate
    spec.loader.exec_module(mutate)
    assert len(mutate.MUTANTS) > 50
    names = [m.name for m in mutate.MUTANTS]
    assert len(names) == len(set(names))
    broken = [m.name for m in mutate.MUTANTS
              if (ROOT / m.path).read_text().count(m.old) != 1 or m.old == m.new]
    assert broken == []
    missing = [(m.name, t) for m in mutate.MUTANTS for t in m.tests
               if not (ROOT / t.split("::")[0]).exists()]
    assert missing == []
