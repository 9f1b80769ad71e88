"""Configurations that can never run: exit 2, one line naming the keys and the numbers (the
checks that span sections, run before anything is simulated)."""

import pytest
from typer.testing import CliRunner

from fastsim import Config, ConfigError, simulate
from fastsim.cli import app


NEVER = [
    ({"model.preset": "llama-3.1-8b", "engine.tp": 3, "hardware.preset": "h100-sxm"},
     "engine.tp (3) must divide the 8 KV heads of model.preset llama-3.1-8b"),
    ({"model.preset": "llama-3.1-70b", "hardware.preset": "h100-sxm"},
     "model.weight_gb (141.107) does not fit: engine.tp (1) x (hardware.mem_gb (80) x engine.gpu_memory_utilization (0.9) "
     "- engine.reserved_gb (2)) = 70 GB"),
    ({"workload.prefix_tokens": 1000}, "workload.prefix_tokens (1000) must be shorter than every prompt"),
    ({"engine.kv_cache_gb": 0.1}, "the longest request (workload.prompt 1000 + output 2000 = 3000 tokens) "
                                  "does not fit in the KV cache (47 blocks of engine.block_tokens 16 = 752 tokens"),
    ({"calibration.compute_efficiency": 1.5}, "calibration.compute_efficiency: Input should be less than or equal to 1"),
    ({"calibration.bandwidth_efficiency": 0}, "calibration.bandwidth_efficiency: Input should be greater than 0"),
    ({"engine.gpu_memory_utilization": 1.2}, "engine.gpu_memory_utilization: Input should be less than or equal to 1"),
    ({"engine.max_batched_tokens": 32}, "engine.max_batched_tokens (32) must be at least the running limit"),
    ({"engine.tp": 2}, "engine.tp (2) > 1 needs hardware.link_gb_s and model.n_layers and model.hidden"),
    ({"engine.kv_alloc": "lazy"}, "engine.kv_alloc: Input should be 'paged' or 'reserve'"),
    ({"calibration.layer_overhead_us": 10}, "calibration.layer_overhead_us (10) needs model.n_layers"),
    ({"model.preset": "llama-3.1-405b", "hardware.preset": "l40s", "engine.tp": 16},
     "engine.tp (16) spans 2 scale-up domains of hardware.scaleup_gpus (8) GPUs, but hardware.scaleout_gb_s is null"),
    ({"model.preset": "llama-3.1-405b", "hardware.preset": "h100-sxm", "engine.tp": 12},
     "engine.tp (12) must divide the 8 KV heads"),
    ({"model.preset": "qwen3-235b-a22b", "hardware.preset": "h100-sxm", "engine.tp": 12},
     "engine.tp (12) spans scale-up domains of hardware.scaleup_gpus (8) GPUs unevenly: give a multiple of 8"),
]


@pytest.mark.parametrize("values,message", NEVER, ids=[m[:40] for _, m in NEVER])
def test_configurations_that_cannot_run_exit_2(root, values, message):
    args = [a for k, v in values.items() for a in ("--set", f"{k}={'null' if v is None else v}")]
    config = "h100" if "model.preset" in values else "reference"  # the reference sets the model's fields
    result = CliRunner().invoke(app, ["run", str(root / f"configs/{config}.yaml"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_bad_combination_in_a_sweep_names_the_point(tmp_path, root):
    path = tmp_path / "tp.yaml"
    path.write_text(f"extends: {root / 'configs/h100.yaml'}\nsweep:\n  engine.tp: [1, 2, 3]\n")
    result = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "x.nc"), "--quiet"])
    assert result.exit_code == 2
    assert "sweep point {'engine.tp': 3}: engine.tp (3) must divide the 8 KV heads" in result.stderr


def test_api_refuses_with_config_error(root):
    import fastsim

    with pytest.raises(ConfigError, match="does not fit in the KV cache"):
        simulate(Config().with_values({"engine.kv_cache_gb": 0.1}))
    with pytest.raises(ConfigError, match="does not fit in the KV cache"):
        fastsim.load_config(root / "configs/reference.yaml", {"engine.kv_cache_gb": 0.1})
