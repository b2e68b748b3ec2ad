"""The package layout holds: only ``qpid_flow.amqp`` imports Proton, and every private Proton
name it relies on still exists in the Proton installed (so an upgrade that moves one fails
here, by name, rather than somewhere in the data path)."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "qpid_flow"
AMQP = PACKAGE / "amqp"
PLUGIN_PACKAGES = sorted(p for p in (ROOT / "plugins").glob("*/qpid_flow_*") if p.is_dir())
PROTON_ROOTS = {"proton", "cproton"}

# Private attributes of Proton's objects that qpid_flow.amqp reads or sets, with the Proton
# module that defines them. Keep in step with the code: test_every_private_attribute_used_is_declared
# fails when the amqp package uses one not listed here.
PRIVATE_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "_impl": ("proton._wrapper",),  # the C object behind a wrapper (endpoints, reactor, outcomes)
    "_attrs": ("proton._wrapper",),  # a wrapper's attribute store, read per message (endpoints.kept)
    "_check": ("proton._endpoints",),  # Link._check: error codes to exceptions (endpoints)
    "_acceptor": ("proton._endpoints",),  # Connection._acceptor, set by an acceptor (streams)
    "_collector": ("proton._reactor",),  # Container._collector: the event queue (reactor)
    "_stop": ("proton._reactor",),  # Container._stop: stop() was called (reactor's process loop)
    "_timers": ("proton._reactor",),  # Container._timers: timers pending (reactor's process loop)
    "_global_handler": ("proton._reactor",),  # Container._global_handler: the IO handler (reactor)
    # Container._selectables (a count; reactor) and IO.Selector._selectables (a set; epoll)
    "_selectables": ("proton._reactor", "proton._io"),
    "_transport": ("proton._handlers",),  # Selectable._transport, set by IOHandler (reactor, streams)
    "_delegate": ("proton._selectable",),  # Selectable._delegate: the socket (reactor)
    "_deadline": ("proton._selectable",),  # Selectable._deadline: its timer (reactor, epoll)
    "_selectable": ("proton._handlers",),  # Transport._selectable, set by IOHandler (streams)
}


def _sources(*folders: Path) -> list[Path]:
    return [path for folder in folders for path in sorted(folder.rglob("*.py"))]


def _imported_roots(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def test_only_the_amqp_package_imports_proton() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {root}"
        for path in _sources(PACKAGE, *PLUGIN_PACKAGES)
        if AMQP not in path.parents
        for root, line in _imported_roots(path)
        if root in PROTON_ROOTS
    ]
    assert offenders == []


def test_the_core_the_policies_and_the_plugin_machinery_load_without_proton() -> None:
    # Not only no import statement: nothing they import pulls Proton in either, so a policy
    # is plain Python all the way down.
    import subprocess
    import sys

    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for folder in ("core", "policies", "plugin")
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        if path.name != "__init__.py"
    ]
    script = (
        "import sys, importlib\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('proton', 'cproton')))\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"


def _amqp_trees() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(), str(path))) for path in _sources(AMQP)]


def test_every_cproton_name_used_exists() -> None:
    import cproton

    used = {
        (alias.name, path.name)
        for path, tree in _amqp_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "cproton"
        for alias in node.names
    }
    assert used, "the amqp package reads Proton's C layer through cproton"
    assert sorted(f"{name} ({where})" for name, where in used if not hasattr(cproton, name)) == []


def test_every_private_proton_module_imported_exists() -> None:
    used = {
        (node.module, alias.name)
        for _path, tree in _amqp_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("proton._")
        for alias in node.names
    }
    assert used
    for module, name in sorted(used):
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


@pytest.mark.parametrize(
    ("attribute", "module"),
    sorted((name, module) for name, modules in PRIVATE_ATTRIBUTES.items() for module in modules),
)
def test_every_private_proton_attribute_relied_on_exists(attribute: str, module: str) -> None:
    source = inspect.getsource(importlib.import_module(module))
    defined = rf"\.{attribute}\b\s*=|def {attribute}\b|\b{attribute}\s*:|\[\"{attribute}\"\]\s*="
    assert re.search(defined, source), f"{module} no longer defines {attribute}"


def test_every_private_attribute_used_is_declared() -> None:
    # A private name the amqp package reads that no qpid-flow module defines is Proton's:
    # on another object (``link._check``), on ``self`` in a subclass of a Proton class
    # (``self._timers`` in the reactor), or through ``__dict__["_attrs"]``. Each must be in
    # PRIVATE_ATTRIBUTES, with the Proton module that defines it.
    own: set[str] = set()
    for path in _sources(PACKAGE):
        text = path.read_text()
        own |= set(re.findall(r"self\.(_\w+)\s*(?::[^=\n]+)?=(?!=)", text))
        own |= set(re.findall(r"def (_\w+)", text))
        own |= set(re.findall(r"__slots__ = \(([^)]*)\)", text) and [])
    used: set[tuple[str, str]] = set()
    for path, tree in _amqp_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                used.add((node.attr, path.name))
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Attribute)
                and node.value.attr == "__dict__"
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
                and node.slice.value.startswith("_")
            ):
                used.add((node.slice.value, path.name))
    undeclared = sorted(f"{name} ({where})" for name, where in used if name not in own | set(PRIVATE_ATTRIBUTES))
    assert undeclared == [], undeclared
