"""The fleet table of docs/model/fleets.md is what `fastsim sweep configs/llama70b-fleet.yaml` gives today, and
its lessons hold: disaggregation pays on long prompts with a prefill pool sized for them."""

import re

import pytest

import fastsim


@pytest.fixture(scope="module")
def fleet():
    from .conftest import ROOT

    return fastsim.sweep(fastsim.load_config(ROOT / "configs/llama70b-fleet.yaml"), workers=1)


LAYOUTS = {"4 colocated": (4, 0), "2 prefill + 2 decode": (2, 2), "1 prefill + 3 decode": (3, 1),
           "3 prefill + 1 decode": (1, 3)}


def test_the_docs_fleet_table_is_todays_sweep(root, fleet):
    rows = [line for line in (root / "docs/model/fleets.md").read_text().splitlines()
            if re.match(r"\| [14],000 \| \d .*(colocated|decode) \|", line)]
    assert len(rows) == 6
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        replicas, prefill = LAYOUTS[cells[1]]
        p = fleet.sel(value=int(cells[0].replace(",", "")), replicas=replicas, prefill_replicas=prefill)
        shown = [float(re.sub(r"[^\d.]", "", c)) for c in cells[2:]]
        want = [float(p.ttft_p99_s), float(p.tpot_p99_s) * 1e3, float(p.itl_p99_s) * 1e3,
                float(p.slo_attainment) * 100, float(p.usd_per_mtok)]
        digits = [2 if float(p.ttft_p99_s) < 10 else 1, 1, 1, 1, 2]
        assert shown == [round(w, d) for w, d in zip(want, digits)], row
        assert int(p.gpus) == 16


def test_disaggregation_pays_on_long_prompts_when_the_prefill_pool_keeps_up(fleet):
    long = fleet.sel(value=4000)
    colocated, split, starved = (long.sel(replicas=r, prefill_replicas=p) for r, p in ((4, 0), (1, 3), (2, 2)))
    assert split.slo_attainment > 0.99 > colocated.slo_attainment > 0.8
    assert split.tpot_p99_s < 0.5 * colocated.tpot_p99_s
    assert starved.ttft_p50_s > 10  # the queue at too small a prefill pool (a fed one: under a second)
    short = fleet.sel(value=1000, replicas=4, prefill_replicas=0)
    assert short.slo_attainment > 0.999  # (jitter costs one request in two thousand its TPOT)
