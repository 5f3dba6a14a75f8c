"""The bearer-token check, without a running server (the live 401s are in test_bad_requests)."""

from __future__ import annotations

from znni.api.security import token_matches


def test_token_matches_only_the_exact_bearer_token() -> None:
    assert token_matches("s3cret", "Bearer s3cret")
    assert token_matches("s3cret", "bearer s3cret")
    for header in (None, "", "s3cret", "Bearer", "Bearer s3cre", "Bearer s3cret1", "Basic s3cret"):
        assert not token_matches("s3cret", header), header
