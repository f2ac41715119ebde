"""The multitask policy in a submission's fingerprint: ENQUEUE leaves the
fingerprint as it was before there was a policy, so every key admitted then
still replays; any other policy is another request."""

from __future__ import annotations

import hashlib

from keyturn.domain import History, Multitask
from keyturn.runtime.validation import fingerprint


def test_an_enqueue_fingerprint_is_the_one_every_earlier_key_was_admitted_with() -> None:
    before = hashlib.sha256(b"keyturn/turn/v1\x00FULL\x00hello").hexdigest()
    assert fingerprint(input="hello", history=History.FULL) == before
    assert fingerprint(input="hello", history=History.FULL, multitask=Multitask.ENQUEUE) == before


def test_reject_and_interrupt_are_other_requests() -> None:
    prints = {fingerprint(input="hello", history=History.FULL, multitask=m) for m in Multitask}
    assert len(prints) == len(Multitask)
