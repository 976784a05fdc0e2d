"""WHEN and HOW the graph runs: Definitions, partitions, jobs, sensors, schedules, executors."""
