"""The view's head card lists each head's strongest circuit edges (issue 44): out of the head, and into its query
or into the keys/values of its KV group, which every query head of the group reads."""

from __future__ import annotations

import pandas as pd

from headscope.models.tiny import tiny_model
from headscope.view.heads import EDGES_PER_HEAD, heads_table


def test_a_head_card_lists_its_strongest_edges_in_and_out(tmp_path):
    hm = tiny_model("llama")  # GQA: query heads share KV groups
    size = hm.n_heads // hm.n_kv_heads
    assert size > 1, (hm.n_heads, hm.n_kv_heads)
    rows = [("input", "L0H0.q", 0.5), ("L0H0", "L1H1.q", -2.0), ("L0H0", "logits", 1.0), ("L0H0", "MLP1", 0.1),
            ("L0H1", f"L1G{hm.n_kv_heads - 1}.k", 3.0), ("MLP0", "L1H0.q", 0.2), ("L0H0", "L1H0.v", 0.05)]
    rows += [("input", "MLP0", 0.01 * i) for i in range(5)]
    pd.DataFrame([{"sender": s, "receiver": r, "score": v, "score_lo": v - 0.1, "score_hi": v + 0.1}
                  for s, r, v in rows]).to_csv(tmp_path / "edges.csv", index=False)
    table = heads_table(hm, [tmp_path])
    assert table["problems"] == [], table["problems"]
    edges = table["edges"]
    # out of L0H0: by |score|, at most EDGES_PER_HEAD
    assert [(e["receiver"], e["score"]) for e in edges["L0H0"]["out"]] == [("L1H1.q", -2.0), ("logits", 1.0),
                                                                          ("MLP1", 0.1)][:EDGES_PER_HEAD]
    # into every query head of the last KV group of layer 1: the key edge
    last = range((hm.n_kv_heads - 1) * size, hm.n_kv_heads * size)
    for h in last:
        assert edges[f"L1H{h}"]["in"][0]["sender"] == "L0H1", (h, edges.get(f"L1H{h}"))
    for h in set(range(hm.n_heads)) - set(last):  # the other groups' heads do not read those keys
        assert all(e["sender"] != "L0H1" for e in edges.get(f"L1H{h}", {}).get("in", [])), edges.get(f"L1H{h}")
    assert edges["L0H0"]["in"] == [{"sender": "input", "receiver": "L0H0.q", "score": 0.5, "lo": 0.4, "hi": 0.6}]
    assert table["sources"]["edges"]["file"].endswith("edges.csv")


def test_edges_naming_groups_that_do_not_divide_the_heads_are_named_and_the_rest_served(tmp_path):
    hm = tiny_model("llama")
    pd.DataFrame([{"sender": "L0H0", "receiver": f"L1G{hm.n_heads}.k", "score": 1.0, "score_lo": 0.5,
                   "score_hi": 1.5}]).to_csv(tmp_path / "edges.csv", index=False)
    table = heads_table(hm, [tmp_path])
    assert table["edges"] == {} and any("edges.csv" in p for p in table["problems"]), table["problems"]
