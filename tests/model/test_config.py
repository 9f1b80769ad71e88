"""Configs: defaults, extends, overrides, and every kind of bad input (exit 2, key named)."""

import pytest
from typer.testing import CliRunner

from fastsim import Config, ConfigError, load_config
from fastsim.cli import app
from fastsim.model.loading import parse_override
from fastsim.model.axes import axis_validator, coupled_section, section_validator
from fastsim.model.schema import LEAF_KEYS, get_dotted
from fastsim.sweep.grid import build_grid


def test_defaults_are_the_lesson_scenario():
    c = Config()
    assert (c.engine.max_batch, c.engine.limit, c.workload.prompt.value, c.workload.output.max) == (64, 64, 1000, 2000)


def test_contract_keys_all_exist():
    contract = """hardware.mem_bandwidth_tb_s model.weight_gb model.kv_bytes_per_token engine.policy
    engine.max_batch engine.max_concurrent engine.window_ms workload.n_requests workload.rate workload.seed
    workload.rng workload.prompt.dist workload.prompt.value workload.prompt.mu
    workload.prompt.sigma workload.prompt.min workload.prompt.max workload.trace workload.output.dist workload.output.mu workload.output.sigma
    workload.output.min workload.output.max workload.output.value
    workload.prompt.median workload.prompt.p90 workload.output.median workload.output.p90
    hardware.preset hardware.peak_tflops hardware.mem_gb hardware.link_gb_s hardware.link_latency_us
    model.preset model.params_b model.n_layers model.attn_dim model.hidden model.kv_heads
    engine.max_batched_tokens engine.tp engine.kv_alloc engine.block_tokens engine.gpu_memory_utilization
    engine.reserved_gb engine.kv_cache_gb calibration.compute_efficiency calibration.bandwidth_efficiency
    calibration.step_overhead_ms calibration.layer_overhead_us calibration.api_overhead_ms workload.prefix_tokens workload.arrival
    workload.burstiness slo.ttft_s slo.tpot_s slo.e2e_s
    fleet.replicas fleet.router fleet.prefill_replicas fleet.prefill_tp fleet.prefill_hardware
    fleet.prefill_max_batched_tokens fleet.kv_link_gb_s fleet.kv_link_latency_ms hardware.usd_per_gpu_hour
    hardware.peak_tflops_fp8 hardware.peak_tflops_fp4 engine.expert_parallel
    model.config_json model.dtype model.kv_dtype model.vocab model.heads model.head_dim model.kv_lora_rank
    model.qk_rope_head_dim model.experts model.experts_per_token model.moe_layers model.expert_gb
    calibration.stall_rate_hz calibration.stall_median_ms calibration.stall_sigma calibration.fitted_to
    engine.prefix_caching workload.system_prompts workload.sessions workload.trace_hash_block
    fleet.prefix_weight engine.async_scheduling workload.warmup workload.concurrency workload.ramp_s
    workload.think_s workload.prompt.range_ratio workload.output.range_ratio calibration.moe_layer_overhead_us
    hardware.scaleup_gpus hardware.scaleout_gb_s hardware.scaleout_latency_us engine.dp
    model.window_layers model.window_tokens model.window_kind model.linear_layers model.linear_state_bytes
    model.sparse_topk model.index_heads model.index_head_dim model.mtp_layers engine.speculative""".split()
    assert sorted(contract) == sorted(LEAF_KEYS)


def test_limit_is_min_of_batch_and_cap():
    assert Config().with_values({"engine.max_batch": 64, "engine.max_concurrent": 16}).engine.limit == 16
    assert Config().with_values({"engine.max_batch": 8, "engine.max_concurrent": 16}).engine.limit == 8


def test_overrides_are_yaml_scalars():
    assert parse_override("workload.rate=40") == ("workload.rate", 40)
    assert parse_override("engine.max_concurrent=null") == ("engine.max_concurrent", None)
    assert parse_override("engine.policy=static") == ("engine.policy", "static")
    assert parse_override("sweep.workload.seed=[1, 2]") == ("sweep.workload.seed", [1, 2])


def test_extends_merges_and_replaces_the_grid(tmp_path, root):
    study = tmp_path / "study.yaml"
    study.write_text(f"extends: {root / 'configs/reference.yaml'}\nengine:\n  max_batch: 256\n"
                     "sweep:\n  engine.policy: [static, continuous]\n")
    c = load_config(study)
    assert c.engine.max_batch == 256 and c.workload.rng == "stdlib"  # merged over the base
    assert c.sweep == {"engine.policy": ["static", "continuous"]}  # the study's own grid


def test_validation_never_touches_disk(monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "open", lambda *a, **k: pytest.fail("validation opened a file"))
    Config().with_values({"engine.policy": "dynamic", "sweep": {"workload.rate": [1, 2]}})


BAD = [
    (["--set", "engine.policy=foo"], "engine.policy: must be one of static, dynamic, continuous"),
    (["--set", "engine.polcy=static"], "engine.polcy: unknown key"),
    (["--set", "workload.rate=0"], "workload.rate:"),
    (["--set", "workload.rate=-3"], "workload.rate:"),
    (["--set", "workload.rate=.nan"], "workload.rate: Input should be a finite number"),
    (["--set", "workload.rate=.inf"], "workload.rate: Input should be a finite number"),
    (["--set", "workload.rate=fast"], "workload.rate: Input should be a valid number"),
    (["--set", "workload.n_requests=0"], "workload.n_requests:"),
    (["--set", "engine.max_batch=0"], "engine.max_batch:"),
    (["--set", "engine.max_batch=2.5"], "engine.max_batch: Input should be a valid integer"),
    (["--set", "engine.max_concurrent=0"], "engine.max_concurrent:"),
    (["--set", "engine.window_ms=-1"], "engine.window_ms:"),
    (["--set", "workload.output.min=50", "--set", "workload.output.max=10"], "workload.output: min (50) must not exceed max (10)"),
    (["--set", "workload.rng=torch"], "workload.rng: Input should be 'stdlib' or 'numpy'"),
    (["--set", "workload.output.dist=pareto"], "workload.output.dist:"),
    (["--set", "sweep.engine.max_batch=[]"], "axis 'engine.max_batch' is empty"),
    (["--set", "sweep.engine.bogus=[1]"], "'engine.bogus' is not a config key"),
    (["--set", "sweep.workload.rate=[8, 8]"], "repeats a value"),
    (["--set", "workload.rate.x=1"], "workload.rate: is a value, not a section"),
    (["--set", "norate"], "expected dotted.key=value"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_naming_the_key(root, args, message):
    result = CliRunner().invoke(app, ["run", str(root / "configs/reference.yaml"), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback


@pytest.mark.parametrize(
    "text,message",
    [
        ("engine:\n  policy: [static\n", "line 3, column 1: YAML syntax error"),
        ("- 1\n- 2\n", "expected a mapping of sections"),
        ("engine:\n  max_batch: '64'\n", "engine.max_batch: Input should be a valid integer"),
        ("hardware: 3\n", "hardware: Input should be a valid dictionary"),
        ("extends: nowhere.yaml\n", "no such config file"),
        ("sweep:\n  engine.policy: static\n", "sweep.engine.policy: Input should be a valid list"),
    ],
)
def test_bad_files_exit_2(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["run", str(path)])
    assert result.exit_code == 2
    assert message in result.stderr, result.stderr


def test_missing_file_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["run", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "no such config file" in result.stderr


def test_api_raises_config_error():
    with pytest.raises(ConfigError, match="engine.max_batch"):
        Config().with_values({"engine.max_batch": -1})


def test_scientific_notation_in_files_and_overrides(tmp_path):
    path = tmp_path / "sci.yaml"
    path.write_text("workload:\n  rate: 1e3\n  n_requests: 1e4\n  output:\n    mu: 2.5e-3\n"
                    "sweep:\n  workload.rate: [1e2, 2.5E+2]\n")
    c = load_config(path)
    assert (c.workload.rate, c.workload.n_requests, c.workload.output.mu) == (1000.0, 10_000, 0.0025)
    assert type(c.workload.n_requests) is int
    assert c.sweep == {"workload.rate": [100.0, 250.0]}
    assert parse_override("workload.rate=1e3") == ("workload.rate", 1000.0)
    assert parse_override("workload.rate=-2.5e-3") == ("workload.rate", -0.0025)
    assert parse_override("engine.policy=1e") == ("engine.policy", "1e")  # not a number: a string
    result = CliRunner().invoke(app, ["run", str(path), "--set", "workload.n_requests=2e3", "--json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("value,ok", [(1e6, True), (1000000.0, True), (64, True), (1.5, False), (True, False),
                                      (float("nan"), False), ("64", False)])
def test_integer_fields_take_integral_floats_only(value, ok):
    if ok:
        c = Config().with_values({"workload.n_requests": value})
        assert c.workload.n_requests == int(value) and type(c.workload.n_requests) is int
    else:
        with pytest.raises(ConfigError, match="workload.n_requests: Input should be a valid integer"):
            Config().with_values({"workload.n_requests": value})


def test_booleans_are_not_numbers():
    for key in ("workload.rate", "engine.max_batch", "engine.window_ms"):
        with pytest.raises(ConfigError, match=key):
            Config().with_values({key: True})


def test_integral_overrides(root):
    cfg = str(root / "configs/reference.yaml")
    ok = CliRunner().invoke(app, ["run", cfg, "--set", "engine.max_batch=1.6e1", "--set", "workload.n_requests=5e2"])
    assert ok.exit_code == 0 and "max_batch 16" in ok.stdout and "500 requests" in ok.stdout
    bad = CliRunner().invoke(app, ["run", cfg, "--set", "engine.max_batch=1.5e0"])
    assert bad.exit_code == 2
    assert bad.stderr.strip() == "error: engine.max_batch: Input should be a valid integer (got 1.5)"


AXIS_VALUES = [0, 1, 2, 7, -1, 1e3, 1.5, 2.0, True, None, "x", "numpy", "poisson", "lognormal", "paged", 0.5, 3.35,
               float("inf"), float("nan"), 1e20, 2**40]


@pytest.mark.parametrize("key", [k for k in LEAF_KEYS if coupled_section(k) is None])
def test_a_long_axis_validated_at_once_is_the_same_as_value_by_value(key):
    """What build_grid's one-call path gives (or refuses) is what validating each value in its
    section gives: the same value, of the same type."""
    base = Config()
    at_once = axis_validator(base, key)
    if at_once is None:  # a field with a validator of its own: value by value only
        return
    section = key.rsplit(".", 1)[0] if "." in key else ""
    one = section_validator(base, section)
    for value in AXIS_VALUES:
        try:
            want = get_dotted(one({key: value}), key[len(section) + 1:] if section else key)
        except ConfigError:
            want = ConfigError
        try:
            got = at_once([value])[0]
        except ConfigError:
            got = ConfigError
        if want is ConfigError or got is ConfigError:
            assert want is got, (key, value)
        else:
            assert type(got) is type(want) and (got == want or got != got and want != want), (key, value)


def test_a_refused_value_of_a_long_axis_is_named(root):
    config = Config().model_copy(update={"sweep": {"workload.seed": [*range(300), -4]}})
    with pytest.raises(ConfigError, match=r"sweep axis 'workload.seed', value -4: workload.seed"):
        build_grid(config)
