"""How runs are placed and triggered: step-pod placement on a cluster, the automation's settings."""
