"""The readiness report: its pages and plots."""
