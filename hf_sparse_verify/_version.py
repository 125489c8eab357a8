"""The package version (the bottom layer: read by the package and by benchmark records)."""

__version__ = "0.1.0"
