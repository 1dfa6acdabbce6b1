"""Chaos suite set-up (the `slow` marker's skip lives in tests/conftest.py)."""
