"""Pure logic of the onboarding pipeline: no Dagster imports, testable in milliseconds."""
