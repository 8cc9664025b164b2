"""The exception tree drawn in ``engine.core.errors``' docstring is the real one.

Users read that drawing to decide what to catch; a class added without its line, or moved
under another parent, would make it lie.
"""

from __future__ import annotations

import inspect
import re

import engine.core.errors as errors


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: cls
        for name, cls in vars(errors).items()
        if inspect.isclass(cls)
        and issubclass(cls, BaseException)
        and cls.__module__ == errors.__name__
    }


def _drawn() -> dict[str, tuple[str | None, list[str]]]:
    """name -> (drawn parent, builtins named as "also ...") from the docstring's drawing."""
    doc = errors.__doc__ or ""
    drawn: dict[str, tuple[str | None, list[str]]] = {}
    stack: list[str] = []
    for line in doc.splitlines():
        match = re.match(r"^    ([| ]*)(?:\+-- )?(\w+Error|\w+Failure)(?: \(also (.+)\))?$", line)
        if not match:
            continue
        depth = len(match.group(1)) // 4 + 1 if "+-- " in line else 0
        name = match.group(2)
        del stack[depth:]
        drawn[name] = (stack[-1] if stack else None, (match.group(3) or "").split(", "))
        stack.append(name)
    return drawn


def test_every_error_class_is_drawn_under_its_parent() -> None:
    drawn = _drawn()
    classes = _classes()
    assert set(drawn) == set(classes), "draw (or remove) these in the docstring"
    for name, cls in classes.items():
        parent, also = drawn[name]
        assert (cls.__bases__[0].__name__ if parent else None) == parent, name
        extra = [b.__name__ for b in cls.__bases__[1:]]
        assert extra == [a for a in also if a], name


def test_every_error_derives_from_the_root() -> None:
    for cls in _classes().values():
        assert issubclass(cls, errors.TurnstileError)
