"""The outcome enums: what each attempt means to the limiter, the breaker and a retry."""

from __future__ import annotations

import pickle

import pytest

from ballast_asgi.core.outcome import (
    RETRYABLE,
    AttemptOutcome,
    Outcome,
    Verdict,
    breaker_verdict,
    is_retryable,
    limiter_signal,
)


@pytest.mark.parametrize("enum", [Outcome, AttemptOutcome, Verdict])
def test_members_hash_by_identity_and_stay_singletons(enum: type) -> None:
    """Members hash by identity in C (no Python ``Enum.__hash__``) and pickle to themselves."""
    for member in enum:
        assert hash(member) == object.__hash__(member)
        assert {member: 1}[member] == 1
        assert pickle.loads(pickle.dumps(member)) is member


def test_every_attempt_outcome_maps_to_one_signal_and_verdict() -> None:
    """Each attempt outcome has a limiter signal and a verdict; retryable ones are failures."""
    for outcome in AttemptOutcome:
        assert isinstance(limiter_signal(outcome), Outcome)
        assert isinstance(breaker_verdict(outcome), Verdict)
        if is_retryable(outcome):
            assert outcome in RETRYABLE
            assert breaker_verdict(outcome) is Verdict.FAILURE
    assert limiter_signal(AttemptOutcome.SUCCESS) is Outcome.SUCCESS
    assert limiter_signal(AttemptOutcome.CLIENT_GONE) is Outcome.IGNORED
    assert limiter_signal(AttemptOutcome.TIMEOUT) is Outcome.DROPPED
