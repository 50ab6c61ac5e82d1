"""Registry lookups, unknown-name messages, and the typed names the config layer relies on."""

from typing import get_args

import pytest

from rlkit.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AGGREGATIONS,
    CORRECTIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageEstimatorName,
    AggregationName,
    CorrectionName,
    KLEstimatorName,
    PolicyLossName,
    Registry,
    UnknownVariantError,
)
from rlkit.errors import RLKitError


def test_register_and_get_returns_the_function():
    reg = Registry("widget")

    @reg.register("a")
    def a():
        return 1

    assert reg.get("a") is a
    assert "a" in reg and reg.names() == ("a",) and len(reg) == 1


def test_get_passes_callables_through_unchanged():
    reg = Registry("widget")

    def custom():
        return 2

    assert reg.get(custom) is custom


def test_registering_a_name_twice_fails():
    reg = Registry("widget")
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda: 2)


def test_unknown_name_lists_all_available_names_and_suggests_the_closest():
    with pytest.raises(UnknownVariantError) as err:
        ADVANTAGE_ESTIMATORS.get("grpoo")
    msg = str(err.value)
    assert "unknown advantage estimator 'grpoo'" in msg
    assert "did you mean 'grpo'?" in msg
    for name in ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_baseline"):
        assert repr(name) in msg
    # catchable as KeyError, ValueError and rlkit's base error
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    assert isinstance(err.value, RLKitError)


def test_unknown_name_prefix_suggestion_and_no_suggestion():
    assert "did you mean 'ppo_clip'?" in POLICY_LOSSES.unknown_message("ppo")
    msg = KL_ESTIMATORS.unknown_message("zzzzzz")
    assert "did you mean" not in msg and "'k1', 'k2', 'k3'" in msg


@pytest.mark.parametrize(
    "alias, registry",
    [
        (AdvantageEstimatorName, ADVANTAGE_ESTIMATORS),
        (PolicyLossName, POLICY_LOSSES),
        (KLEstimatorName, KL_ESTIMATORS),
        (CorrectionName, CORRECTIONS),
        (AggregationName, AGGREGATIONS),
    ],
)
def test_typed_names_match_registry_entries(alias, registry):
    assert set(get_args(alias)) == set(registry.names())
