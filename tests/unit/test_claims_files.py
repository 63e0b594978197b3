"""Every paper's claims.yaml against the claims contract: it loads, every claim has a kind, and every
identity or reference names a unit test that exists (they are verified there, never counted)."""

from __future__ import annotations

import re

import pytest
import yaml

from tasks.common.claims import VERIFICATION_KINDS, load_claims
from tests.conftest import REPO

PAPERS = yaml.safe_load((REPO / "params.yaml").read_text())["papers"]


@pytest.mark.parametrize("slug", PAPERS)
def test_claims_file_follows_the_contract(slug):
    claims = load_claims(REPO / "tasks" / slug / "claims.yaml")
    for claim in claims:
        if claim.kind in VERIFICATION_KINDS:
            path, _, name = claim.verified_by.partition("::")
            test_file = REPO / path
            assert test_file.is_file(), f"{slug} {claim.id}: verified_by file {path} does not exist"
            assert re.search(rf"^def {re.escape(name)}\(", test_file.read_text(), re.M), (
                f"{slug} {claim.id}: no test function {name} in {path}")
        for pre in claim.preconditions:
            assert pre.why.strip(), f"{slug} {claim.id}: a precondition says why it is needed"
