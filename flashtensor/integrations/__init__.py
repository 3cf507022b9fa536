"""Integrations with other libraries; each module imports its library, so import only the one you use:
`flashtensor.integrations.transformers` (Hugging Face models), `flashtensor.integrations.kvpress` (NVIDIA's
KV-cache presses)."""
