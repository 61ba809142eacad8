"""Chaos runs and scenarios: real processes killed for real, verdicts read from the files."""
