"""The hook reference for plugin authors, generated from the code into docs/plugins.md.

The docstrings are the one source: :func:`render` builds the Markdown from
:mod:`qpid_flow.plugin.hookspecs` (one section per ``# --- Name ---`` banner comment, in
source order; one entry per hook with its exact signature and its docstring), from
:class:`~qpid_flow.plugin.control.RouterControl` (every public method and attribute) and
from :mod:`qpid_flow.plugin.declarations`. It refuses to render a hook, method or field
left undocumented. A test fails when the block in docs/plugins.md differs from it::

    python -m qpid_flow.plugin.reference                           # print the reference
    python -m qpid_flow.plugin.reference --write docs/plugins.md   # replace the block

Docstrings are reST-ish and become Markdown: a literal in double backquotes becomes a
code span; a ``:class:``, ``:func:``, ``:meth:`` or ``:mod:`` role (``:attr:``, ``:exc:``
too) becomes the name as a code span (its last dotted part when written with ``~``);
``:param name: text`` and ``:ivar name: text`` become bullets, ``:return: text`` a
"Returns:" paragraph.

No Proton here.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from qpid_flow.plugin import declarations, hookspecs
from qpid_flow.plugin.control import RouterControl

__all__ = ["BEGIN", "COMMAND", "END", "generated_block", "main", "param_names", "render", "splice", "to_markdown"]

COMMAND = "python -m qpid_flow.plugin.reference --write docs/plugins.md"
BEGIN = f"<!-- BEGIN GENERATED HOOK REFERENCE: {COMMAND} -->"
END = "<!-- END GENERATED HOOK REFERENCE -->"

QUESTION = "*Question: stops at the first non-None answer.*"
HISTORIC = "*Historic: a plugin registered late is called with the arguments of every earlier call.*"
WIDTH = 90  # the Markdown's line length (a code span is never split, so a line may be longer)

_BANNER = re.compile(r"^# --- (?P<title>.+?) -*$")
_HOOK_DEF = re.compile(r"^def (?P<name>qpid_flow_\w+)\(")
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
_LITERAL = re.compile(r"``(?P<text>.+?)``")
_FIELD = re.compile(r"^:(?P<kind>param|ivar|returns?)(?:\s+(?P<name>\w+))?:\s*(?P<text>.*)$")


# --- docstrings to Markdown -----------------------------------------------------------


def _inline(text: str) -> str:
    """Roles and literals of a docstring's text, as Markdown code spans."""

    def role(match: re.Match[str]) -> str:
        target = match["target"]
        if target.endswith(">") and "<" in target:  # :role:`title <target>`
            return f"`{target[: target.index('<')].strip()}`"
        return f"`{target.rsplit('.', 1)[-1] if match['tilde'] else target}`"

    return _LITERAL.sub(lambda m: f"`{m['text']}`", _ROLE.sub(role, text))


def _wrap(text: str, first: str = "", rest: str = "") -> str:
    """``text`` (docstring markup) as Markdown lines of at most ``WIDTH``, code spans kept
    whole on one line."""
    spans = re.split(r"(`[^`]*`)", _inline(text))
    kept = "".join(s.replace(" ", "\0") if s.startswith("`") else s for s in spans)
    lines = textwrap.wrap(
        kept, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False, break_on_hyphens=False
    )
    return "\n".join(lines).replace("\0", " ")


@dataclasses.dataclass
class _Field:
    kind: str  # "param", "ivar" or "return"
    name: str
    text: str


def _parse(doc: str) -> list[list[tuple[str, str]] | _Field]:
    """A cleaned docstring as paragraphs and fields, in order. A paragraph is a list of
    (bullet, text): bullet "- " for a list item, "" for running text."""
    parts: list[list[tuple[str, str]] | _Field] = []
    paragraph: list[tuple[str, str]] = []
    field: _Field | None = None

    def flush() -> None:
        if paragraph:
            parts.append(list(paragraph))
            paragraph.clear()

    for line in inspect.cleandoc(doc).splitlines():
        stripped = line.strip()
        match = _FIELD.match(line)
        if match is not None:
            flush()
            kind = "return" if match["kind"].startswith("return") else match["kind"]
            if kind != "return" and not match["name"]:
                raise ValueError(f"a :{kind}: field without a name: {line!r}")
            field = _Field(kind, match["name"] or "", match["text"])
            parts.append(field)
        elif not stripped:
            field = None
            flush()
        elif field is not None and line[0].isspace():
            field.text += " " + stripped  # a field's continuation line
        else:
            field = None
            if line.startswith("- "):
                paragraph.append(("- ", line[2:].strip()))
            elif paragraph and (line[0].isspace() or not paragraph[-1][0]):
                paragraph[-1] = (paragraph[-1][0], f"{paragraph[-1][1]} {stripped}")
            else:
                paragraph.append(("", stripped))
    flush()
    return parts


def param_names(doc: str | None) -> list[str]:
    """The names a docstring documents with ``:param name:``, in order."""
    return [p.name for p in _parse(doc or "") if isinstance(p, _Field) and p.kind == "param"]


def _ivar_names(doc: str | None) -> list[str]:
    return [p.name for p in _parse(doc or "") if isinstance(p, _Field) and p.kind == "ivar"]


def to_markdown(doc: str, ivar_labels: Mapping[str, str] | None = None, ivar_heading: str = "Attributes:") -> str:
    """A docstring as Markdown. ``ivar_labels`` names what an ``:ivar name:`` bullet shows
    (default: the name); a list of them is introduced by ``ivar_heading``."""
    blocks: list[str] = []
    bullets: list[str] = []
    bullets_kind = ""

    def flush_bullets() -> None:
        if bullets:
            if bullets_kind == "ivar":
                blocks.append(ivar_heading)
            blocks.append("\n".join(bullets))
            bullets.clear()

    for part in _parse(doc):
        if isinstance(part, list):
            flush_bullets()
            blocks.append("\n".join(_wrap(text, bullet, " " * len(bullet)) for bullet, text in part))
        elif part.kind == "return":
            flush_bullets()
            blocks.append(_wrap(f"Returns: {part.text}"))
        else:
            if part.kind != bullets_kind:
                flush_bullets()
            bullets_kind = part.kind
            label = (ivar_labels or {}).get(part.name, part.name) if part.kind == "ivar" else part.name
            bullets.append(_wrap(f"``{label}``: {part.text}", "- ", "  "))
    flush_bullets()
    return "\n\n".join(blocks)


# --- the hooks --------------------------------------------------------------------------


def _hook_sections() -> list[tuple[str, list[str]]]:
    """(banner title, hook names) in source order, from the hookspecs module's banners."""
    sections: list[tuple[str, list[str]]] = []
    for line in inspect.getsource(hookspecs).splitlines():
        banner = _BANNER.match(line)
        if banner is not None:
            sections.append((banner["title"], []))
            continue
        hook = _HOOK_DEF.match(line)
        if hook is not None:
            if not sections:
                raise ValueError(f"{hook['name']} comes before any '# --- Section ---' banner in hookspecs.py")
            sections[-1][1].append(hook["name"])
    found = sorted(name for _, names in sections for name in names)
    if found != hookspecs.hook_names():
        raise ValueError(f"hookspecs.py's sections list {found}, its hooks are {hookspecs.hook_names()}")
    return [(title, names) for title, names in sections if names]


def _render_hook(name: str) -> str:
    function = getattr(hookspecs, name)
    doc = inspect.getdoc(function)
    if not doc:
        raise ValueError(f"hook {name} has no docstring")
    arguments = list(inspect.signature(function).parameters)
    missing = [a for a in arguments if a not in param_names(doc)]
    if missing:
        raise ValueError(f"hook {name}: no ':param {missing[0]}:' in its docstring")
    options = getattr(function, "qpid_flow_spec", {})
    blocks = [f"### `{name}{inspect.signature(function)}`"]
    if options.get("firstresult"):
        blocks.append(QUESTION)
    if options.get("historic"):
        blocks.append(HISTORIC)
    blocks.append(to_markdown(doc))
    return "\n\n".join(blocks)


# --- the control object and the declarations ------------------------------------------------


def _assigned_attributes(cls: type) -> list[str]:
    """The public attributes ``cls.__init__`` sets on ``self``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))  # type: ignore[misc]
    names: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
                and not target.attr.startswith("_")
                and target.attr not in names
            ):
                names.append(target.attr)
    return names


def _check_ivars(owner: str, doc: str | None, expected: Sequence[str]) -> None:
    documented = _ivar_names(doc)
    missing = [name for name in expected if name not in documented]
    if missing:
        raise ValueError(f"{owner}: no ':ivar {missing[0]}:' in its docstring")
    stale = [name for name in documented if name not in expected]
    if stale:
        raise ValueError(f"{owner}: ':ivar {stale[0]}:' documents no such attribute")


def _method_signature(function: Callable[..., Any]) -> inspect.Signature:
    signature = inspect.signature(function)
    return signature.replace(parameters=list(signature.parameters.values())[1:])  # without self


def _render_control() -> str:
    doc = inspect.getdoc(RouterControl) or ""
    attributes = _assigned_attributes(RouterControl)
    _check_ivars("RouterControl", doc, attributes)
    blocks = [
        "## The control object",
        f"`{RouterControl.__module__}.{RouterControl.__name__}`, called `control` here.",
        to_markdown(doc, {name: f"control.{name}" for name in attributes}),
    ]
    for name, value in vars(RouterControl).items():
        if name.startswith("_") or not inspect.isfunction(value):
            continue
        method_doc = inspect.getdoc(value)
        if not method_doc:
            raise ValueError(f"RouterControl.{name} has no docstring")
        blocks += [f"### `control.{name}{_method_signature(value)}`", to_markdown(method_doc)]
    return "\n\n".join(blocks)


def _field_label(field: dataclasses.Field[Any]) -> str:
    label = f"{field.name}: {field.type}"
    if field.default is not dataclasses.MISSING:
        return f"{label} = {field.default!r}"
    if field.default_factory is not dataclasses.MISSING:
        return f"{label} = {field.default_factory()!r}"
    return label


def _render_declarations() -> str:
    blocks = ["## Declarations", to_markdown(inspect.getdoc(declarations) or "")]
    public = [getattr(declarations, name) for name in declarations.__all__]
    for value in sorted(public, key=lambda v: inspect.getsourcelines(v)[1]):
        name: str = value.__name__
        doc = inspect.getdoc(value)
        if not doc:
            raise ValueError(f"{name} in qpid_flow.plugin.declarations has no docstring")
        if isinstance(value, type) and dataclasses.is_dataclass(value):
            fields = dataclasses.fields(value)
            _check_ivars(name, doc, [f.name for f in fields])
            labels = {f.name: _field_label(f) for f in fields}
            blocks += [f"### `{name}`", to_markdown(doc, labels, "Fields:")]
        else:
            blocks += [f"### `{name}{inspect.signature(value)}`", to_markdown(doc)]
    return "\n\n".join(blocks)


# --- the whole reference, and docs/plugins.md ---------------------------------------------


def render() -> str:
    """The hook reference as Markdown (what goes between :data:`BEGIN` and :data:`END`)."""
    blocks = []
    for title, names in _hook_sections():
        blocks.append(f"## {title}")
        blocks += [_render_hook(name) for name in names]
    blocks += [_render_control(), _render_declarations(), _render_builtin_settings()]
    return "\n\n".join(blocks)


def _render_builtin_settings() -> str:
    """The destination keys qpid-flow's own policies declare, as any plugin declares its
    own (``qpid_flow_destination_settings``): a worked example, read from the policies."""
    import importlib

    from qpid_flow.plugin.manager import BUILTIN_PLUGINS

    lines = [
        "## Destination settings declared by qpid-flow's own policies",
        "",
        "Each built-in policy declares its keys with `qpid_flow_destination_settings`, as a",
        "third-party plugin does; `max_count`, `max_size` and `limit_policy` are the core's.",
        "",
        "| key | aliases | plugin | what it does |",
        "|---|---|---|---|",
    ]
    for name, module in BUILTIN_PLUGINS.items():
        plugin = importlib.import_module(module).Plugin()
        declare = getattr(plugin, "qpid_flow_destination_settings", None)
        for setting in declare() if declare is not None else ():
            aliases = ", ".join(f"`{alias}`" for alias in setting.aliases)
            lines.append(f"| `{setting.key}` | {aliases} | {name} | {setting.help} |")
    return "\n".join(lines)


def _markers(text: str) -> tuple[int, int]:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers are missing: {BEGIN} ... {END}")
    return start + len(BEGIN), end


def generated_block(text: str) -> str:
    """What a document holds between the markers, without the blank lines around it."""
    start, end = _markers(text)
    return text[start:end].strip()


def splice(text: str, rendered: str) -> str:
    """``text`` with ``rendered`` between the markers."""
    start, end = _markers(text)
    return f"{text[:start]}\n\n{rendered.strip()}\n\n{text[end:]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m qpid_flow.plugin.reference",
        description="Print the hook reference generated from the hookspec docstrings, or write it into a file "
        "between its markers.",
    )
    parser.add_argument("--write", metavar="FILE", type=Path, help="replace the generated block of FILE")
    args = parser.parse_args(argv)
    rendered = render()
    if args.write is None:
        sys.stdout.write(rendered + "\n")
        return 0
    try:
        text = args.write.read_text(encoding="utf-8")
        updated = splice(text, rendered)
    except (OSError, ValueError) as exc:
        print(f"{args.write}: {exc}", file=sys.stderr)
        return 1
    if updated != text:
        args.write.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
