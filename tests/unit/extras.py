"""Markers for the unit tests that need the optional analytics extra (``qpid-flow[analytics]``).

The unit tests must collect and run in a virtual environment without that extra; the few
that exercise pyarrow or PySpark themselves are skipped there, saying which package is
missing. CI installs the extra, so they all run there.
"""

from __future__ import annotations

import importlib.util

import pytest


def needs(package: str) -> pytest.MarkDecorator:
    """Skip unless ``package`` (part of the analytics extra) can be imported."""
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None, reason=f"{package} is not installed (the analytics extra)"
    )


# class_archive() names the archive after the jars of the PySpark it imports.
needs_pyspark = needs("pyspark")
# The columnar event log is written with pyarrow.
needs_pyarrow = needs("pyarrow")
