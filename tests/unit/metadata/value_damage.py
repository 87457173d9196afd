"""How the record decoders' Hypothesis tests damage a value: as is (twice as likely), truncated, one byte
replaced, bytes inserted or appended, or (with ``random_prefix``) random bytes behind a record's header.
One copy, so the change and partition decoders' tests break values the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st

Draw = Callable[[st.SearchStrategy[Any]], Any]
"""``draw`` of a ``@st.composite`` strategy or ``DataObject.draw``."""

DAMAGES = ("as is", "as is", "truncated", "byte", "inserted", "appended")


def damaged(draw: Draw, value: bytes, random_prefix: bytes | None = None) -> tuple[str, bytes]:
    """``(how, value)``: ``value`` damaged one way drawn from :data:`DAMAGES` (and ``"random"``: the
    prefix then up to 30 random bytes, when ``random_prefix`` is given)."""
    how: str = draw(st.sampled_from(DAMAGES + (("random",) if random_prefix is not None else ())))
    if how == "truncated":
        value = value[: draw(st.integers(0, len(value)))]
    elif how == "byte":
        at = draw(st.integers(0, len(value) - 1))
        value = value[:at] + bytes([draw(st.integers(0, 255))]) + value[at + 1 :]
    elif how == "inserted":
        at = draw(st.integers(0, len(value)))
        value = value[:at] + draw(st.binary(min_size=1, max_size=4)) + value[at:]
    elif how == "appended":
        value += draw(st.binary(min_size=1, max_size=4))
    elif how == "random" and random_prefix is not None:
        value = random_prefix + draw(st.binary(max_size=30))
    return how, value
