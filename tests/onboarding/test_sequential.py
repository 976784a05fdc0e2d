"""Group-sequential boundaries for the accuracy gate's repeated looks: the published Lan–DeMets
Pocock-type values, and by simulation the property they exist for (α over all looks)."""

from statistics import NormalDist

import numpy as np
import pytest

from onboarding.quantize.sequential import boundaries, look_z, spent

# gsDesign's sfLDPocock, one-sided 0.025, equally spaced looks (the textbook table)
PUBLISHED = {
    2: [2.157, 2.201],
    3: [2.279, 2.295, 2.296],
    5: [2.438, 2.427, 2.410, 2.397, 2.386],
}


@pytest.mark.parametrize("k", sorted(PUBLISHED))
def test_equally_spaced_looks_match_the_published_boundaries(k):
    got = boundaries(0.025, [(i + 1) / k for i in range(k)])
    assert got == pytest.approx(PUBLISHED[k], abs=2e-3)


def crossing_rate(cuts: list[float], fractions: list[float], n: int = 400_000) -> float:
    """Simulated chance that a statistic with no effect crosses its cut at any look, the looks
    at nested item sets (independent increments of a Brownian motion)."""
    rng = np.random.default_rng(17)
    steps = rng.standard_normal((n, len(fractions))) * np.sqrt(np.diff([0.0, *fractions]))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    return float((z > np.asarray(cuts)).any(axis=1).mean())


def test_the_gates_looks_spend_alpha_once_where_the_single_look_z_spends_it_three_times():
    """The gate's shape: a first look at 100 of 280 items, one at 200, the last at all 280."""
    fractions, alpha = [100 / 280, 200 / 280, 1.0], 0.05
    corrected = boundaries(alpha, fractions)
    se = (alpha * (1 - alpha) / 400_000) ** 0.5
    assert abs(crossing_rate(corrected, fractions) - alpha) < 4 * se
    assert crossing_rate([1.645] * 3, fractions) > 1.7 * alpha  # what the gate did before


def test_one_look_at_every_item_keeps_the_configured_z_and_an_early_look_is_stricter():
    assert look_z(1.645, [], 1.0) == 1.645
    early = look_z(1.645, [], 0.25)
    assert early == pytest.approx(2.10, abs=0.01) and spent(0.05, 0.25) < 0.05
    later = look_z(1.645, [0.25], 1.0)
    rest = NormalDist().inv_cdf(1 - (spent(0.05, 1.0) - spent(0.05, 0.25)))
    # wider than one look, narrower than the remaining α spent as if the looks were unrelated
    assert 1.645 < later < rest - 0.03
    assert look_z(1.645, [0.25, 1.0], 1.0) == later  # the same look judged again


def test_fractions_out_of_order_or_range_are_refused():
    for bad in ([], [0.5, 0.5], [0.6, 0.3], [0.0, 1.0], [0.5, 1.2]):
        with pytest.raises(ValueError, match="information fractions"):
            boundaries(0.05, bad)
    with pytest.raises(ValueError, match="alpha"):
        boundaries(0.7, [1.0])
