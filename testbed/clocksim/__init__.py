"""Synthetic clock-sync inputs with known truth: probe traces and estimate graphs."""
