"""The course's benchmarks: `python -m benchmarks.run` runs them all and prints one table."""
