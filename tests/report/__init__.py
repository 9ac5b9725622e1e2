"""Evaluate, benchmark and the report."""
