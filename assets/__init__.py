"""WHAT is produced: one module per stage, each exposing `defs` (a `dg.Definitions`).

Two of Dagster's beta APIs are used on purpose: `data_version=` on `Output` (the content-hash
data versions the stages record) and `observable_source_asset` (the serving stack,
assets/stack.py). Dagster warns at every use, in every process and run; the decision is made
once, here, for those two only: any other beta or preview warning still shows.
"""

import warnings

import dagster as dg

warnings.filterwarnings(
    "ignore", category=dg.BetaWarning,
    message=r"(Parameter `data_version` of initializer `Output|Function `observable_source_asset`)")
