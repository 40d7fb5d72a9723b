"""The device's sampled drafting rows (``_spec_sampling``, pure)."""

from __future__ import annotations

import numpy as np

from edge_agent.language import Sampling
from edge_agent.language._spec_sampling import TOP, draft_row, draw, pack
from shared import decode_draft_dists


def test_a_row_is_the_softmax_at_the_turn_s_temperature_within_its_top_k_and_top_p() -> None:
    logits = np.log(np.asarray([[0.5, 0.25, 0.125, 0.0625, 0.0625]]))
    assert np.allclose(
        draft_row(logits, Sampling(temperature=1.0)), [0.5, 0.25, 0.125, 0.0625, 0.0625]
    )
    hot = draft_row(logits, Sampling(temperature=1e6))
    assert np.allclose(hot, 0.2, atol=1e-4)  # flat at a high temperature
    top2 = draft_row(logits, Sampling(temperature=1.0, top_k=2))
    assert np.allclose(top2, [2 / 3, 1 / 3, 0, 0, 0])
    top_p = draft_row(logits, Sampling(temperature=1.0, top_p=0.7))  # 0.5 + 0.25 reach 0.7
    assert np.allclose(top_p, [2 / 3, 1 / 3, 0, 0, 0])
    assert np.allclose(draft_row(logits, Sampling(temperature=1.0, top_p=0.5)), [1, 0, 0, 0, 0])


def test_draws_come_from_the_row_the_hub_decodes_and_pack_sends_those_rows() -> None:
    rng = np.random.default_rng(0)
    q = rng.random(300).astype(np.float32)
    q /= q.sum()
    decoded = decode_draft_dists(pack([q, q[::-1].copy()]), k=2, vocab=300)
    kept = set(decoded.ids[0].tolist())
    assert len(kept) == TOP
    draws = [draw(q, np.random.default_rng(i)) for i in range(400)]
    assert all(decoded.prob(0, d) > 0 for d in draws)
    # Mostly the kept ids (they hold most of the mass), some from the uniform rest.
    share = np.mean([d in kept for d in draws])
    assert abs(share - float(decoded.probs[0].sum())) < 0.08
