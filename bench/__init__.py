"""Benchmarks: side-by-side ratios measured in one run, printed as JSON, plotted as PNG."""
