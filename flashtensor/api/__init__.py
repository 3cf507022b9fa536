"""The public surface: ft.compile, ft.explain and the torch.compile backend, above the driver."""
