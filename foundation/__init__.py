"""The floor every robofleet package may import and that imports none of them.

``contracts`` (the seams between components), ``store`` (the metadata store), ``runspec`` (the
run spec), ``durable`` (fsynced writes), ``retry`` (the one backoff), ``yamlfile`` (YAML files
with one-line errors), ``clitext`` (docstrings as plain ``--help`` text).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("robofleet")
except PackageNotFoundError:  # a source tree that is not installed
    __version__ = "0.0.0+unknown"
