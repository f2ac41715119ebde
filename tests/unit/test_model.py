"""The fixture model: deterministic, with its directives."""

from __future__ import annotations

import pytest

from keyturn.domain import TurnStatus
from keyturn.errors import ModelError
from keyturn.runtime.model import FixtureModel, PastTurn


async def test_same_input_and_history_give_the_same_output() -> None:
    model = FixtureModel()
    history = [
        PastTurn("a", "out a", TurnStatus.COMPLETED),
        PastTurn("b", None, TurnStatus.INTERRUPTED),
    ]
    first = await model.reply(input="q", history=history)
    again = await model.reply(input="q", history=list(history))
    assert first == again
    assert "2 earlier turn(s)" in first and "2. b [interrupted]" in first
    assert await model.reply(input="q", history=history[:1]) != first


async def test_fail_directive_raises_model_error() -> None:
    with pytest.raises(ModelError):
        await FixtureModel().reply(input="/fail", history=[])
