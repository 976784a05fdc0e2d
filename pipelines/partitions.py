"""One partition per model; keys are DNS-1123 model ids resolved by the catalog."""

from __future__ import annotations

import dagster as dg

models_partitions = dg.DynamicPartitionsDefinition(name="models")
