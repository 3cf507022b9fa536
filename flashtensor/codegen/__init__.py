"""Triton source from a schedule, and the kernel artifact the runtime launches."""
