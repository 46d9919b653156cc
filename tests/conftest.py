import numpy as np
import pytest


@pytest.fixture
def rng():
    """A seeded generator, fresh per test."""
    return np.random.default_rng(20261122)
