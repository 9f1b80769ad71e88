"""Length distributions as people describe them: a lognormal by its median and p90 in tokens,
and a ``mu`` meant as tokens refused with the median it implies."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

from fastsim.cli import app
from fastsim.engine.traffic import generate
from fastsim.model.lengths import Z90, Prompt
from fastsim.model.schema import ConfigError, Config, validate


def test_median_and_p90_give_mu_and_sigma():
    p = Prompt(dist="lognormal", median=1500, p90=4000)
    assert p.mu == math.log(1500) and p.sigma == pytest.approx(math.log(4000 / 1500) / Z90, rel=1e-15)
    z = np.random.default_rng(0).standard_normal(200_000)
    lengths = np.exp(p.mu + p.sigma * z)
    assert np.quantile(lengths, 0.5) == pytest.approx(1500, rel=0.01)
    assert np.quantile(lengths, 0.9) == pytest.approx(4000, rel=0.01)


def test_median_with_sigma_and_a_resolved_config_round_trips():
    w = validate({"workload": {"prompt": {"dist": "lognormal", "median": 900, "sigma": 0.5}}}).workload
    assert (w.prompt.mu, w.prompt.sigma) == (math.log(900), 0.5)
    again = validate(Config(workload=w).model_dump())  # a written-out config holds mu and median: they agree
    assert again.workload.prompt == w.prompt


@pytest.mark.parametrize("prompt, message", [
    ({"dist": "lognormal", "mu": 1500}, "workload.prompt: mu (1500) is the log of the length: a median of e^1500 "
                                        "tokens, beyond max (8192); to give the median in tokens, write median: 1500"),
    ({"dist": "lognormal", "mu": 10}, "a median of 22026.5 tokens, beyond max (8192)"),
    ({"dist": "lognormal", "median": 20000}, "workload.prompt: median (20000) is beyond max (8192)"),
    ({"dist": "lognormal", "median": 900, "mu": 3}, "give mu or median, not both"),
    ({"dist": "lognormal", "median": 900, "p90": 800}, "p90 (800) must exceed the median (900 tokens)"),
    ({"dist": "lognormal", "median": 900, "p90": 2000, "sigma": 2}, "give sigma or p90, not both"),
    ({"dist": "fixed", "median": 900}, "median and p90 describe dist lognormal (dist is fixed)"),
    ({"dist": "lognormal", "median": 0}, "workload.prompt.median: Input should be greater than 0"),
])
def test_bad_lengths_name_the_key(prompt, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate({"workload": {"prompt": prompt}})


def test_the_cli_refuses_a_mu_meant_as_tokens(root):
    result = CliRunner().invoke(app, ["run", str(root / "configs/h100.yaml"), "--set", "workload.prompt.dist=lognormal",
                                      "--set", "workload.prompt.mu=1500"])
    assert result.exit_code == 2 and "write median: 1500" in result.stderr and "Traceback" not in result.output


def test_huge_draws_clamp_to_max_without_an_overflow_warning():
    w = validate({"workload": {"rng": "numpy", "n_requests": 2000, "output": {"mu": 1, "sigma": 400, "max": 50}}}).workload
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = generate(w).output_tokens
    assert out.max() == 50 and out.min() == 1


def test_a_median_at_max_is_accepted_despite_rounding():
    from fastsim.model.lengths import Output

    assert Output(mu=math.log(3), min=1, max=3).mu == math.log(3)  # e^ln(3) is 3.0000000000000004
    assert Output(mu=3.6e-170, max=1).max == 1  # e^mu is 1.0
