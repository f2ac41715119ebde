"""The context every resolver is given, and what a resolver asks of its field."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import strawberry
from strawberry.types.nodes import SelectedField

from keyturn.resolvers.context import Context

Info = strawberry.Info[Context, None]

__all__ = ["Context", "Info", "selects"]


def selects(info: Info, name: str) -> bool:
    """Whether the document selects ``name`` on this field's value, directly
    or through fragments: a count nobody asked for is not worth a query."""

    def among(selections: Iterable[Any]) -> bool:
        for selection in selections:
            if isinstance(selection, SelectedField):
                if selection.name == name:
                    return True
            elif among(selection.selections):  # a fragment, spread or inline
                return True
        return False

    return any(among(field.selections) for field in info.selected_fields)
