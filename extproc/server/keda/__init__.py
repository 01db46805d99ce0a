"""Vendored third-party protocol definitions (see NOTICE)."""
