"""dstack-audit: find healthy service replicas that dstack killed because a newer deployment failed.

The flow is one way: contract + model -> sources -> pipeline -> api -> render -> cli. This module is
the public surface only: every name is loaded on first use, so ``import analyzer`` (and the CLI's
start-up, which imports a submodule and so this package) costs nothing until a name is used.
"""

from analyzer._version import __version__ as __version__

# Where each public name lives; the layer test checks nothing else is defined here.
_PUBLIC = {
    "Audit": "analyzer.api",
    "audit": "analyzer.api",
    "audit_in_partitions": "analyzer.api",
    "merge_reports": "analyzer.api",
    "open_sources": "analyzer.api",
    "AuditInputError": "analyzer.errors",
    "Finding": "analyzer.contract",
    "Report": "analyzer.contract",
    "RunVerdict": "analyzer.contract",
    "plot_run": "analyzer.render.plots",
    "plot_fleet": "analyzer.render.plots",
    "render_html": "analyzer.render.html",
}

__all__ = sorted([*_PUBLIC, "__version__"])


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'analyzer' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
