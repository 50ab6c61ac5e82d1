"""Each registry's names live in a torch-free table (rlkit.algorithms.params) apart from its functions: the registry
built over a table refuses a name the table lacks, every table is exactly its registry's entries, and the package
loads the tensor modules only when one of their names is asked for."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.algorithms import params
from rlkit.algorithms.advantages import ADVANTAGE_ESTIMATORS
from rlkit.algorithms.aggregation import AGGREGATIONS
from rlkit.algorithms.correction import CORRECTIONS
from rlkit.algorithms.kl import KL_ESTIMATORS
from rlkit.algorithms.losses import POLICY_LOSSES
from rlkit.algorithms.registry import Registry, VariantNames

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("table, registry", [
    (params.ADVANTAGE_ESTIMATOR_NAMES, ADVANTAGE_ESTIMATORS),
    (params.POLICY_LOSS_NAMES, POLICY_LOSSES),
    (params.KL_ESTIMATOR_NAMES, KL_ESTIMATORS),
    (params.CORRECTION_NAMES, CORRECTIONS),
    (params.AGGREGATION_NAMES, AGGREGATIONS),
])
def test_each_table_is_exactly_its_registry(table, registry):
    assert registry.table is table and registry.kind == table.kind
    assert registry.names() == table.names  # every name registered, in the table's order, and no other


def test_registering_a_name_outside_the_table_fails():
    reg = Registry(VariantNames("widget", ("a",)))
    reg.register("a")(lambda: 1)
    with pytest.raises(ValueError, match=r"'b' is not in the registry's name table \('a',\)"):
        reg.register("b")


def test_the_table_and_the_registry_give_the_same_unknown_name_message():
    assert params.POLICY_LOSS_NAMES.unknown_message("ppo") == POLICY_LOSSES.unknown_message("ppo")
    with pytest.raises(Exception, match="did you mean 'ppo_clip'"):
        params.LossParams(policy_loss="ppo")


def test_the_package_loads_the_tensor_code_on_first_use():
    code = ("import sys, rlkit.algorithms as a; print('rlkit.algorithms.loss_fn' in sys.modules); "
            "a.LossParams(); print('rlkit.algorithms.loss_fn' in sys.modules); "
            "print(a.RLLoss.__module__, 'rlkit.algorithms.loss_fn' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "False", "rlkit.algorithms.loss_fn", "True"]
