"""The statistics kernel's `output="blocks"`: each layer's output from the statistics' own blocks (probs @ V)
equals eager's output, and the statistics are unchanged."""

from __future__ import annotations

import pytest
import torch
from families import FAMILIES, model, padded_ids

from headscope import HeadscopeError
from headscope.attention import stats_kernel
from headscope.learned.analyze import run_stats
from headscope.stats import STATISTICS

TOL = 1e-5
SEQS = [[3] + torch.randint(5, 120, (n - 1,), generator=torch.Generator().manual_seed(5)).tolist() for n in (21, 6)]


@pytest.mark.parametrize("family", FAMILIES)
def test_output_from_blocks_equals_eager(family):
    hm = model(family)  # eager
    ids, mask = padded_ids()
    seen = []
    with torch.no_grad():
        want = hm.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]
        with stats_kernel(hm, 5, output="blocks") as kernel, kernel.consumer(lambda b: seen.append(b.layer)):
            got = hm.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]
    assert seen, "no block reached the consumer"
    d = ((got - want) * mask[..., None]).abs().max().item()  # padded positions are undefined
    assert d < TOL, f"{family}: output from blocks vs eager max abs diff {d}"


@pytest.mark.parametrize("family", FAMILIES)
def test_statistics_do_not_depend_on_where_the_output_comes_from(family):
    hm = model(family)
    ref = run_stats(hm, SEQS, 2, eager=True).means()
    got = run_stats(hm, SEQS, 2, block=4, output="blocks").means()
    for name in STATISTICS:
        a, b = torch.as_tensor(got[name]), torch.as_tensor(ref[name])
        assert torch.equal(a.isnan(), b.isnan()), f"{family} {name}: NaN pattern differs"
        ok = ~b.isnan()
        d = (a[ok] - b[ok]).abs().max().item() if ok.any() else 0.0
        assert d < TOL, f"{family} {name}: output='blocks' vs eager max abs diff {d}"


def test_unknown_output_is_a_clear_error():
    hm = model("llama")
    with pytest.raises(HeadscopeError, match="kernel output 'flash'.*sdpa, blocks"):
        run_stats(hm, SEQS, 2, output="flash")
