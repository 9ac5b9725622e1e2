"""mt-runtime's version: one place, read by pyproject.toml, the package and the packages it loads."""

__version__ = "0.4.5"
