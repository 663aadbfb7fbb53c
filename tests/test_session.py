"""One way to open a session: `Session.open` loads a model and attaches its default drafter; what it generates is
plain decoding's text, and `Session.over` sizes an engine over a model already loaded."""

from __future__ import annotations

import pytest

from specchat.drafters.ngram.drafter import NgramDrafter
from specchat.errors import SpecchatError
from specchat.session import Session


@pytest.fixture(scope="module")
def session():
    return Session.open(max_len=512)  # the embedded model, its profile's drafter


def test_the_default_session_drafts_with_the_profiles_drafter_and_writes_plain_decodings_text(session):
    assert session.drafter.name == "ngram" and isinstance(session.engine.drafter, NgramDrafter)
    ids = session.encode("List the first ten prime numbers, separated by commas.")
    drafted = [t for event in session.engine.generate(ids, max_new_tokens=40) for t in event.tokens]
    plain = Session.over(session.loaded, max_len=512, drafter="none")
    assert plain.engine.drafter is None
    assert [t for event in plain.engine.generate(ids, max_new_tokens=40) for t in event.tokens] == drafted


def test_a_session_over_a_loaded_model_takes_the_engines_options(session):
    sized = Session.over(session.loaded, max_len=100, drafter="ngram", draft_budget=4, kv_cache="int8")
    assert sized.engine.capacity == 100 and sized.engine.fixed_budget == 4 and sized.engine.cache.kv_cache == "int8"
    with pytest.raises(SpecchatError, match="no published glide drafter"):
        Session.over(session.loaded, max_len=100, drafter="glide")
