"""The one place the version is declared: modules import it from here, never from the package root
(importing the root would load the whole library, and tie every module into one cycle)."""

__version__ = "0.1.0"
