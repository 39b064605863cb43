"""Benchmarks behind ``turnpool bench <name>``: alternatives measured side by side in one run."""
