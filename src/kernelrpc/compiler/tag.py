"""TVM's ``te.tag_scope``: a tag for every compute (and extern) op declared inside.

``with te.tag_scope(tag="conv2d"): ...`` or ``@te.tag_scope(tag="conv2d")`` on a function that
declares ops: each op made there without a ``tag=`` of its own gets the scope's (``op.tag``,
which schedule templates dispatch on). As in TVM, scopes do not nest, an op inside a scope may
not give a tag of its own, and a scope in which no op was declared warns.
"""
from __future__ import annotations

import functools
import threading
import warnings

_current = threading.local()


class TagScope:
    def __init__(self, tag: str):
        if not isinstance(tag, str):
            raise TypeError(f"tag_scope: tag must be a str, got {tag!r}")
        self.tag = tag
        self.accessed = False

    def __enter__(self) -> "TagScope":
        if getattr(_current, "scope", None) is not None:
            raise ValueError("nested tag_scope is not allowed (as in TVM)")
        _current.scope = self
        self.accessed = False
        return self

    def __exit__(self, *exc) -> None:
        _current.scope = None
        if not self.accessed and exc[0] is None:
            warnings.warn(f"tag {self.tag!r} declared with tag_scope was not used", stacklevel=2)

    def __call__(self, fdecl):
        @functools.wraps(fdecl)
        def tagged(*args, **kwargs):
            with TagScope(self.tag):
                return fdecl(*args, **kwargs)
        return tagged

    def __repr__(self) -> str:
        return f"tag_scope({self.tag!r})"


def tag_scope(tag: str) -> TagScope:
    return TagScope(tag)


def resolve(tag: str, what: str) -> str:
    """The tag of an op being declared: its own ``tag``, or the current scope's."""
    scope = getattr(_current, "scope", None)
    if scope is None:
        return tag
    if tag:
        raise ValueError(f"{what}: tag={tag!r} inside tag_scope({scope.tag!r}); nested tags are "
                         "not allowed (as in TVM)")
    scope.accessed = True
    return scope.tag
