"""Specs of kubesim's object helpers (`tools.kubesim.objects`)."""

from __future__ import annotations

import random
import uuid

from hypothesis import given
from hypothesis import strategies as st

from tools.kubesim.objects import new_uid


@given(st.integers(min_value=0, max_value=2**64))
def test_a_new_uid_is_the_version_4_uuid_of_the_same_random_bits(seed: int) -> None:
    drawn, expected = random.Random(seed), random.Random(seed)
    for _ in range(5):
        uid = new_uid(drawn)
        assert uid == str(uuid.UUID(int=expected.getrandbits(128), version=4))
        assert uuid.UUID(uid).version == 4
