"""Every check of a partitioned asset is partitioned as its asset is, so each result in the UI's
check history names the model or node it is about (a check without `partitions_def` records
its evaluations without a partition: the UI shows "Partition -"). That a result is recorded
with its partition: tests/assets/test_deploy.py."""

from __future__ import annotations

from pipelines.definitions import defs


def test_every_check_of_a_partitioned_asset_has_its_partitions():
    graph = defs.resolve_asset_graph()
    checked = 0
    for key in graph.asset_check_keys:
        spec = graph.get_check_spec(key)
        asset = graph.get(key.asset_key)
        assert spec.partitions_def == asset.partitions_def, (key, asset.partitions_def)
        checked += asset.partitions_def is not None
    assert checked >= 15  # the onboarding and node checks

