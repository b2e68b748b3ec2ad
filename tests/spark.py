"""One local Spark session for every report test (a JVM takes seconds to start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")  # the analytics extra; CI always installs it
    from qpid_flow.analytics.session import build_session

    session = build_session(driver_memory="1g")
    yield session
    session.stop()
