"""One partition per model; keys are DNS-1123 model ids resolved by the catalog.

Beside the assets that use it (the top floor, pipelines/, imports it from here).
"""

from __future__ import annotations

import dagster as dg

models_partitions = dg.DynamicPartitionsDefinition(name="models")
