"""Properties of loop-form values: value facts, dimension roles, precision policy."""
