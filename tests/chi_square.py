"""A two-sample chi-square test for token samples: whether speculation kept a sampled row's distribution."""


def samples_differ(a: list[int], b: list[int], z: float = 3.72) -> tuple[bool, float, float]:
    """Two-sample chi-square test of homogeneity of token counts (bins under 10 merged): whether the
    samples differ at about p < 1e-4 (critical value by the Wilson-Hilferty approximation)."""
    from collections import Counter

    ca, cb = Counter(a), Counter(b)
    bins, rest = [], [0, 0]
    for t in set(ca) | set(cb):
        if ca[t] + cb[t] >= 10:
            bins.append((ca[t], cb[t]))
        else:
            rest[0] += ca[t]
            rest[1] += cb[t]
    if sum(rest):
        bins.append(tuple(rest))
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in bins:
        total = x + y
        for observed, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (observed - expected) ** 2 / expected
    df = len(bins) - 1
    critical = df * (1 - 2 / (9 * df) + z * (2 / (9 * df)) ** 0.5) ** 3
    return stat > critical, stat, critical
