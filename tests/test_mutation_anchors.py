"""The curated mutants of ``tests/mutation.py`` still apply: each one's old text occurs exactly
once in its file, so a refactoring that moves the code it breaks is noticed here (the mutation
run itself is not part of the suite: ``python -m tests.mutation``)."""

from pathlib import Path

import pytest

from tests.mutation import MUTANTS, ROOT


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_anchor_occurs_once(mutant):
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.name}: its text occurs {text.count(mutant.old)} times in {mutant.path}"
    for test in mutant.tests:
        assert (ROOT / test.split("::")[0]).is_file(), f"{mutant.name}: no test file {test}"


def test_mutant_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    assert all(Path(ROOT / m.path).suffix == ".py" for m in MUTANTS)
