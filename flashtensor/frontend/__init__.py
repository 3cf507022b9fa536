"""Capture: a PyTorch callable and example inputs to the graph IR."""
