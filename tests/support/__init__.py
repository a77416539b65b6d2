"""Test utilities shared across test packages."""
