"""The fixture model: deterministic, with its directives."""

from __future__ import annotations

import pytest

from keyturn.domain import History, TurnStatus
from keyturn.errors import ModelError
from keyturn.runtime.model import FixtureModel, PastTurn


async def test_same_input_and_history_give_the_same_output() -> None:
    model = FixtureModel()
    history = [
        PastTurn("a", "out a", TurnStatus.COMPLETED),
        PastTurn("b", None, TurnStatus.INTERRUPTED),
    ]
    first = await model.reply(input="q", mode=History.FULL, history=history)
    again = await model.reply(input="q", mode=History.FULL, history=list(history))
    assert first == again
    assert "history: FULL, 2 earlier turn(s)" in first and "2. b [interrupted]" in first
    assert await model.reply(input="q", mode=History.FULL, history=history[:1]) != first


async def test_the_reply_names_the_history_setting_it_was_given() -> None:
    model = FixtureModel()
    first_turn = await model.reply(input="hi", mode=History.FULL, history=[])
    alone = await model.reply(input="hi", mode=History.NONE, history=[])
    assert first_turn == "fixture reply to: hi\nhistory: FULL, no earlier turns"
    assert alone == "fixture reply to: hi\nhistory: NONE"
    # Deterministic for each setting, byte for byte.
    assert await model.reply(input="hi", mode=History.FULL, history=[]) == first_turn
    assert await model.reply(input="hi", mode=History.NONE, history=[]) == alone


async def test_fail_directive_raises_model_error() -> None:
    with pytest.raises(ModelError):
        await FixtureModel().reply(input="/fail", mode=History.NONE, history=[])


@pytest.mark.parametrize(("input", "pieces"), [("/stream 5 1", 5), ("/stream 1", 1), ("hi", 1)])
async def test_stream_directive_emits_its_reply_in_that_many_pieces(
    input: str, pieces: int
) -> None:
    model = FixtureModel()
    emitted: list[str] = []

    async def emit(text: str) -> None:
        emitted.append(text)

    calls = await model.step(
        input=input, mode=History.NONE, history=[], rounds=[], tools=[], emit=emit
    )
    assert calls == []
    assert len(emitted) == pieces and all(emitted)
    # The pieces are the reply itself, cut up: nothing added, nothing lost.
    assert "".join(emitted) == await model.reply(input=input, mode=History.NONE, history=[])
