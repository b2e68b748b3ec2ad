"""Fixtures shared by unit and integration tests."""

from tests.spark import spark

__all__ = ["spark"]
