"""The package version, in a module of its own that imports nothing: the writers that stamp it
into runs and traces import it from here, not from the package face (which imports the capture
side). pyproject.toml reads it from here too (``[tool.setuptools.dynamic]``)."""
__version__ = "0.1.0"
