"""The ``tempcal`` command line: the app, then each command module, which registers itself on it."""

from .main import app, main, run  # isort: skip
from . import fit, ood, report  # noqa: F401  # isort: skip
from . import inspect, apply  # noqa: F401  # isort: skip  (listed after the three commands of the contract)

__all__ = ["app", "main", "run"]
