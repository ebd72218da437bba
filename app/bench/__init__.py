"""Benchmark support for `specgate bench`: workload catalogue (workloads.py)."""
