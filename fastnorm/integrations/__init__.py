"""Integrations with training frameworks, each importing its framework only when imported itself."""
