"""Tests do not inherit Dagster state an earlier test left behind (tests/conftest.py)."""

from __future__ import annotations

import gc

import dagster as dg
import pytest

from tests.conftest import forget_dagster_state_storage


@dg.asset
def one() -> int:
    return 1


def test_instances_exited_out_of_order_leave_a_dead_storage_that_each_test_forgets(tmp_path):
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = dg.DagsterInstance.local_temp(str(tmp_path / "first"))
    second = dg.DagsterInstance.local_temp(str(tmp_path / "second"))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)  # resets Dagster's ContextVar to the first's storage
    del first, second
    gc.collect()
    with pytest.raises(dg.DagsterInvariantViolationError, match="weakref"):
        dg.materialize([one])  # the state a later test met (tests/scripts/test_demo.py)
    forget_dagster_state_storage()  # what the autouse fixture does before every test
    assert dg.materialize([one]).success
