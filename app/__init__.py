"""mlstm-ds. `__version__` is the installed distribution's version (pyproject.toml's, the one source);
a source tree that was never installed says 0+unknown. app.common.version adds the git commit."""

from importlib import metadata

try:
    __version__ = metadata.version("mlstm-ds")
except metadata.PackageNotFoundError:
    __version__ = "0+unknown"
