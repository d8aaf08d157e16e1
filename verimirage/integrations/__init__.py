"""Integrations with other tools (torch.compile)."""
