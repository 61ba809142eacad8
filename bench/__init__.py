"""Benchmark runner: `python -m bench [--quick] [--out bench/results.json]`.

Every figure a target names is measured in the same run as its reference and
printed as a ratio next to it, so a noisy machine shifts both sides alike.
"""
