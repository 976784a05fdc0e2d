"""Partitions beside the assets that use them (the top floor, pipelines/, imports them here).

- `models`: one partition per model; keys are DNS-1123 model ids resolved by the catalog.
- `nodes`: one partition per GPU node under acceptance; keys are Kubernetes node names.
  A node registers by name, with its node type, in configs/acceptance.yaml `nodes` (a
  declarative inventory like the model catalog, read through ConfigFiles.acceptance());
  `node_partitions_sensor` adds every listed node as a partition, so the node assets can be
  launched for it from the UI.
"""

from __future__ import annotations

import dagster as dg

models_partitions = dg.DynamicPartitionsDefinition(name="models")
nodes_partitions = dg.DynamicPartitionsDefinition(name="nodes")
