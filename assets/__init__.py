"""WHAT is produced: one module per stage, each exposing `defs` (a `dg.Definitions`).

Three of Dagster's beta and preview APIs are used on purpose: `data_version=` on `Output` (the
content-hash data versions the stages record), `observable_source_asset` (the serving stack,
assets/stack.py) and partitioned asset checks. Dagster warns at every use, in every process and
run; the decision is made once, here, for those three only: any other beta or preview warning
still shows.
"""

import warnings

import dagster as dg

warnings.filterwarnings(
    "ignore", category=dg.BetaWarning,
    message=r"(Parameter `data_version` of initializer `Output|Function `observable_source_asset`)")
# Checks carry their asset's partitions (`partitions_def` on every AssetCheckSpec of a partitioned
# asset), so the UI's check history names the model or node each result is about instead of
# "Partition -". A preview API in dagster 1.13 (asset_check_spec.py warns at every spec).
warnings.filterwarnings(
    "ignore", category=dg.PreviewWarning,
    message=r"Specifying a partitions_def on an AssetCheckSpec")
