"""Speculation's cost model on a steady clock, for tests that check that rows speculate.

Whether a step speculates follows the step times `PromptLookup` measures (engine/speculation/prompt_lookup.py).
On a shared, busy machine a few slow verifying steps can make speculation never pay, and a test
that counts accepted guesses then fails for a reason that is not the engine's. With this fixture
the engine's own code runs unchanged but reads times from a clock that advances by a fixed cost
per step, and a verifying step's own time (`verified`) is that cost too: a plain step 10 ms, a
verifying step of width w the prior slope's 10 * (1 + 0.35 (w - 1)).
"""

import pytest

from mlx_nb.engine.speculation import prompt_lookup as speculation

PLAIN_S = 0.01


def step_cost(width: int) -> float:
    """Seconds of a step reading `width` tokens a row (1: a plain step)."""
    return PLAIN_S * (1 + speculation.PRIOR_SLOPE * (width - 1))


@pytest.fixture
def steady_step_costs(monkeypatch):
    real = speculation.PromptLookup.step_started
    real_verified = speculation.PromptLookup.verified

    def steady(self, now, kind):
        last = getattr(self, "_last", None)
        clock = getattr(self, "_steady_clock", 0.0)
        if last is not None:
            previous = last[1]
            clock += step_cost(previous[2] if previous[0] == "verify" else 1)
        self._steady_clock = clock
        real(self, clock, kind)

    def verified(self, rows, width, seconds):
        real_verified(self, rows, width, step_cost(width))

    monkeypatch.setattr(speculation.PromptLookup, "step_started", steady)
    monkeypatch.setattr(speculation.PromptLookup, "verified", verified)
