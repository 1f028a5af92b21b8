"""Synthetic gradient-norm series with known answers, shared by the diagnosis and CLI tests.

Each series is fresh seeded noise (log-normal around 1) times one known change
at a known step, so a test can say which verdict and which steps are right.
"""

import math
import random

N = 600
K = 300


def noise(seed, n=N, sigma=0.1):
    rng = random.Random(seed)
    return [10 ** rng.gauss(0.0, sigma) for _ in range(n)]


def scaled(seed, factor, n=N, sigma=0.1):
    """Noise times ``factor(i)``, the known change."""
    return [v * factor(i) for i, v in enumerate(noise(seed, n, sigma))]


def case(name, seed):
    """``(values, verdict, (kind, first start, last start, end) or None)`` of a named case."""
    if name == "stable":
        return noise(seed), "stable", None
    if name == "exploding":  # grows by 10^4 from step K
        values = scaled(seed, lambda i: 10 ** min(4.0, 4.0 * (i - K) / 100) if i >= K else 1.0)
        return values, "exploding", ("exploding", K, K + 15, N - 1)
    if name == "vanishing":  # decays to 1e-9 from step K
        values = scaled(seed, lambda i: 10 ** max(-9.0, -9.0 * (i - K) / 50) if i >= K else 1.0)
        return values, "vanishing", ("vanishing", K, K + 10, N - 1)
    if name == "nonfinite":  # NaN from step K
        values = [v if i < K else math.nan for i, v in enumerate(noise(seed))]
        return values, "nonfinite", ("nonfinite", K, K, N - 1)
    if name == "spike":  # 100x for 5 steps during warmup, then back
        values = scaled(seed, lambda i: 100.0 if 30 <= i < 35 else 1.0)
        return values, "stable", ("spike", 28, 30, 34)
    raise ValueError(name)


NAMES = ["stable", "exploding", "vanishing", "nonfinite", "spike"]
