"""Test support shipped with the package: hypothesis strategies for users' own tests."""
