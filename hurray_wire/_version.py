"""The package version, in one place (read by the CLI and the package)."""

__version__ = "0.1.0"
