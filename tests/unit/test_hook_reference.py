"""The hook reference: generated from the docstrings (qpid_flow.plugin.reference), and
docs/plugins.md holds exactly what it generates, so the two never disagree."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from qpid_flow.plugin import hookspecs, reference
from qpid_flow.plugin.control import RouterControl

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def test_docs_plugins_md_holds_the_generated_reference() -> None:
    assert reference.generated_block(DOC.read_text()) == reference.render(), (
        "docs/plugins.md's hook reference differs from the docstrings it is generated from: "
        f"run `{reference.COMMAND}` (and edit the docstrings, never the generated block)"
    )


@pytest.mark.parametrize("name", hookspecs.hook_names())
def test_every_hook_has_a_docstring_with_a_param_per_argument(name: str) -> None:
    function = getattr(hookspecs, name)
    doc = inspect.getdoc(function)
    assert doc, f"{name} has no docstring"
    arguments = list(inspect.signature(function).parameters)
    assert reference.param_names(doc) == arguments, f"{name}: one ':param name:' per argument, in order"


@pytest.mark.parametrize("name", hookspecs.hook_names())
def test_hooks_that_answer_say_what_and_questions_say_they_stop_at_the_first(name: str) -> None:
    function = getattr(hookspecs, name)
    doc = inspect.getdoc(function) or ""
    answers = inspect.signature(function).return_annotation != "None"
    assert (":return:" in doc) is answers, f"{name}: ':return:' exactly when the hook's answer is read"
    if function.qpid_flow_spec["firstresult"]:
        assert "Stops at first non-None result." in " ".join(doc.split()), name
        assert "None" in doc.split(":return:")[1], f"{name}: say what a None answer means"


def test_every_hook_is_in_a_section_of_the_reference() -> None:
    rendered = reference.render()
    for name in hookspecs.hook_names():
        assert rendered.count(f"### `{name}(") == 1, name
    assert rendered.index("## Lifecycle hooks") < rendered.index("### `qpid_flow_configure(")


def test_the_control_object_is_documented_completely() -> None:
    rendered = reference.render()
    methods = [n for n, v in vars(RouterControl).items() if not n.startswith("_") and inspect.isfunction(v)]
    assert {"call_from_thread", "schedule", "wake", "destination", "destinations"} <= set(methods)
    for name in methods:
        assert f"### `control.{name}(" in rendered, name
    for name in ("memory", "hooks"):
        assert f"- `control.{name}`: " in rendered, name


def test_an_undocumented_argument_or_attribute_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    def qpid_flow_undocumented(destination: object) -> None:
        """Called never."""

    monkeypatch.setattr(hookspecs, "qpid_flow_configure", qpid_flow_undocumented)
    with pytest.raises(ValueError, match="':param destination:'"):
        reference.render()
    monkeypatch.undo()
    monkeypatch.setattr(RouterControl, "__doc__", "No attributes documented.")
    with pytest.raises(ValueError, match="':ivar memory:'"):
        reference.render()


def test_docstrings_become_markdown() -> None:
    doc = """Called when :class:`~qpid_flow.core.model.Hold` or :func:`qpid.x` meets ``a`` and ``b``.

    :param first: a text
        on two lines.
    :param second: short.
    :return: something,
        or None.
    """
    assert reference.to_markdown(doc) == (
        "Called when `Hold` or `qpid.x` meets `a` and `b`.\n\n"
        "- `first`: a text on two lines.\n"
        "- `second`: short.\n\n"
        "Returns: something, or None."
    )


def test_write_replaces_only_the_block_between_the_markers(tmp_path: Path) -> None:
    target = tmp_path / "plugins.md"
    target.write_text(f"# Title\n\nhand-written\n\n{reference.BEGIN}\nstale\n{reference.END}\n\nafter\n")
    assert reference.main(["--write", str(target)]) == 0
    text = target.read_text()
    assert text.startswith("# Title\n\nhand-written\n\n") and text.endswith(f"{reference.END}\n\nafter\n")
    assert reference.generated_block(text) == reference.render()
    assert "stale" not in text
    target.write_text("no markers\n")
    assert reference.main(["--write", str(target)]) == 1
