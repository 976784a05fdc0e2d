"""Tests do not inherit Dagster state an earlier test left behind (tests/conftest.py)."""

from __future__ import annotations

import dagster as dg
from dagster._core.storage.defs_state.base import DefsStateStorage

from tests.conftest import forget_dagster_state_storage


@dg.asset
def one() -> int:
    return 1


def test_instances_exited_out_of_order_leave_their_storage_that_each_test_forgets(tmp_path):
    """Once the first instance is gone, the storage left behind answers a later
    `dg.materialize` with "Attempted to resolve undefined DagsterInstance weakref" (seen in a
    whole-suite run; when the instance is collected decides whether a given test meets it)."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = dg.DagsterInstance.local_temp(str(tmp_path / "first"))
    second = dg.DagsterInstance.local_temp(str(tmp_path / "second"))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    second.__exit__(None, None, None)  # resets Dagster's ContextVar to the first's storage
    assert DefsStateStorage.get() is first.defs_state_storage  # left behind, first exited
    forget_dagster_state_storage()  # what the autouse fixture does before every test
    assert DefsStateStorage.get() is None
    assert dg.materialize([one]).success
