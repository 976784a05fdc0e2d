"""Serving and statistics: engine templates and scenarios, the EngineConfig, benchmark statistics and plots, the frontend's cost, page cache, prompts, the stack fingerprint."""
