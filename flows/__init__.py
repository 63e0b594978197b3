"""Prefect flows: one module per paper (thin composition), reproduce-all, the CLI and servers.

Importing this package sets the project's environment defaults before Prefect or MLflow load.
"""

from tasks.common.env import configure as _configure

_configure()
