"""Predicted serving performance for node types not at hand, calibrated by measurements."""
