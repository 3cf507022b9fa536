"""Loading, tuning, launching and caching generated kernels."""
