"""GPU nodes and their acceptance: what a node says about itself, its telemetry, the checks per phase and the verdict."""
