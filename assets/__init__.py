"""WHAT is produced: one module per stage, each exposing `defs` (a `dg.Definitions`)."""
