"""The bad-input battery: anything a user can give (a config, an override, an option, a trace, a
measured file, a dataset, a path) either works or stops with exit code 2 and one line on stderr
that names the key, file or option, never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import xarray as xr
from typer.testing import CliRunner

from fastsim.cli import app
from tests.conftest import ROOT

SMALL = ["--set", "workload.n_requests=50"]
H100 = "configs/h100.yaml"
REF = "configs/reference.yaml"
PLAN = "tests/data/plan-eight.yaml"

# Files a case may name as {name}; written into the test's folder.
FILES: dict[str, bytes | str] = {
    "binary.yaml": bytes(range(256)) * 4,
    "utf16.yaml": "engine:\n  max_batch: 8\n".encode("utf-16"),
    "latin1.yaml": "description: caf\xe9\n".encode("latin-1"),
    "extends_utf16.yaml": "extends: utf16.yaml\n",
    "extends_binary.yaml": "extends: binary.yaml\n",
    "extends_missing.yaml": "extends: nowhere.yaml\n",
    "extends_self.yaml": "extends: extends_self.yaml\n",
    "extends_number.yaml": "extends: 5\n",
    "dup_top.yaml": "engine:\n  max_batch: 8\nengine:\n  max_batch: 16\n",
    "dup_nested.yaml": "engine: {max_batch: 64, max_batch: 128}\n",
    "dup_sweep.yaml": "sweep:\n  workload.rate: [1]\n  workload.rate: [2]\n",
    "list.yaml": "- 1\n- 2\n",
    "unhashable_key.yaml": "engine:\n  ? [1, 2]\n  : 3\n",
    "scalar.yaml": "42\n",
    "syntax.yaml": "engine: [\n",
    "tabs.yaml": "engine:\n\tmax_batch: 8\n",
    "nul.yaml": "engine:\n  max_batch: 8\x00\n",
    "section_scalar.yaml": "engine: 5\n",
    "unknown_section.yaml": "engines:\n  max_batch: 8\n",
    "sweep_scalar.yaml": "sweep:\n  workload.rate: 5\n",
    "sweep_list.yaml": "sweep: [1, 2]\n",
    "sweep_unknown.yaml": "sweep:\n  engine.nope: [1]\n",
    "sweep_empty.yaml": "sweep:\n  workload.rate: []\n",
    "sweep_repeat.yaml": "sweep:\n  workload.rate: [1, 1]\n",
    "sweep_bad_value.yaml": "sweep:\n  engine.max_batch: [8, 1e30]\n",
    "trace_binary.csv": bytes(range(256)) * 4,
    "trace_utf16.csv": "arrival_s,prompt_tokens,output_tokens\n0,10,10\n".encode("utf-16"),
    "trace_header.csv": "a,b,c\n0,10,10\n",
    "trace_empty.csv": "",
    "trace_header_only.csv": "arrival_s,prompt_tokens,output_tokens\n",
    "trace_huge_count.csv": "arrival_s,prompt_tokens,output_tokens\n0,100000000000000000000,10\n",
    "trace_huge_output.csv": "arrival_s,prompt_tokens,output_tokens\n0,10,100000000000000000000\n",
    "trace_negative.csv": "arrival_s,prompt_tokens,output_tokens\n0,-5,10\n",
    "trace_zero_output.csv": "arrival_s,prompt_tokens,output_tokens\n0,5,0\n",
    "trace_float.csv": "arrival_s,prompt_tokens,output_tokens\n0,5.5,10\n",
    "trace_nan_time.csv": "arrival_s,prompt_tokens,output_tokens\nnan,5,10\n",
    "trace_inf_time.csv": "arrival_s,prompt_tokens,output_tokens\ninf,5,10\n",
    "trace_text_time.csv": "arrival_s,prompt_tokens,output_tokens\nsoon,5,10\n",
    "trace_short_row.csv": "arrival_s,prompt_tokens,output_tokens\n0,5\n",
    "trace_backwards.csv": "arrival_s,prompt_tokens,output_tokens\n5,5,10\n1,5,10\n",
    "trace_nul.csv": "arrival_s,prompt_tokens,output_tokens\n0,5\x00,10\n",
    "trace_azure_bad_date.csv": "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,5,10\n",
    "measured_binary.csv": bytes(range(256)) * 4,
    "measured_utf16.csv": "workload.rate,ttft_mean_s\n8,0.05\n".encode("utf-16"),
    "measured_empty.csv": "",
    "measured_header_only.csv": "workload.rate,ttft_mean_s\n",
    "measured_bad_column.csv": "workload.rate,nope\n8,1\n",
    "measured_no_metric.csv": "workload.rate\n8\n",
    "measured_bad_yaml.csv": "workload.n_requests,ttft_mean_s\n\"[1,2\",0.05\n",
    "measured_nul.csv": "workload.n_requests,ttft_mean_s\n5\x00,0.05\n",
    "measured_bad_key_value.csv": "engine.max_batch,ttft_mean_s\n1e30,0.05\n",
    "measured_text_metric.csv": "workload.rate,ttft_mean_s\n8,fast\n",
    "measured_negative_metric.csv": "workload.rate,ttft_mean_s\n8,-1\n",
    "measured_nan_metric.csv": "workload.rate,ttft_mean_s\n8,nan\n",
    "measured_short_row.csv": "workload.rate,ttft_mean_s\n8\n",
    "measured_bad_rate.csv": "workload.rate,ttft_mean_s\n-8,0.05\n",
    "notjson.json": "{not json",
    # model config.json files (model.config_json)
    "hf_notjson.json": '{"architectures": ["LlamaForCausalLM"], ',
    "hf_list.json": "[1, 2]",
    "hf_no_arch.json": '{"hidden_size": 4096}',
    "hf_hybrid.json": '{"architectures": ["FalconH1ForCausalLM"], "hidden_size": 4096}',
    "hf_missing.json": '{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32, '
                       '"intermediate_size": 11008, "vocab_size": 32000}',
    "hf_moe_missing.json": '{"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32, '
                           '"num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 32000, '
                           '"num_local_experts": 8}',
    "hf_text_field.json": '{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32, '
                          '"num_hidden_layers": "32", "intermediate_size": 11008, "vocab_size": 32000}',
    "hf_awq.json": '{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32, '
                   '"num_hidden_layers": 32, "intermediate_size": 11008, "vocab_size": 32000, '
                   '"quantization_config": {"quant_method": "awq", "bits": 4}}',
    "both_models.yaml": "model:\n  preset: llama-3.1-8b\n  config_json: hf_missing.json\n",
    "binary.json": bytes(range(256)) * 4,
    "list.json": "[1, 2]",
    # traces with prefix information
    "hash_not_list.jsonl": '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": "1,2"}\n',
    "hash_text_ids.jsonl": '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, "b"]}\n',
    "hash_wrong_count.jsonl": '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2, 3]}\n',
    "hash_not_json.jsonl": '{"timestamp": 0, "input_length": 600\n',
    "hash_no_ids.jsonl": '{"timestamp": 0, "input_length": 600, "output_length": 5}\n',
    "conv_parent_later.csv": "chat_id,parent_chat_id,timestamp,input_length,output_length\na,b,0,100,10\nb,,1,50,10\n",
    "conv_parent_missing.csv": "chat_id,parent_chat_id,timestamp,input_length,output_length\na,zz,0,100,10\n",
}


def _vllm(**changes) -> str:
    data = {"request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None, "num_prompts": 3,
            "input_lens": [100, 200, 300], "output_lens": [10, 20, 30], "mean_ttft_ms": 50.0, "mean_e2el_ms": 500.0}
    data.update(changes)
    return json.dumps({k: v for k, v in data.items() if v is not ...})


FILES |= {
    "vllm_burst_null.json": _vllm(burstiness=None),
    "vllm_burst_text.json": _vllm(burstiness="high"),
    "vllm_burst_negative.json": _vllm(burstiness=-1),
    "vllm_prompts_text.json": _vllm(num_prompts="three"),
    "vllm_prompts_float.json": _vllm(num_prompts=2.5),
    "vllm_prompts_mismatch.json": _vllm(num_prompts=5),
    "vllm_huge_lens.json": _vllm(input_lens=[1e20, 200, 300]),
    "vllm_float_lens.json": _vllm(input_lens=[100.5, 200, 300]),
    "vllm_text_lens.json": _vllm(output_lens=["a", "b", "c"]),
    "vllm_nested_lens.json": _vllm(output_lens=[[1], [2], [3]]),
    "vllm_lens_not_list.json": _vllm(output_lens=7),
    "vllm_no_lens.json": _vllm(input_lens=...),
    "vllm_zero_len.json": _vllm(output_lens=[0, 20, 30]),
    "vllm_rate_text.json": _vllm(request_rate="fast"),
    "vllm_rate_zero.json": _vllm(request_rate=0),
    "vllm_rate_bool.json": _vllm(request_rate=True),
    "vllm_concurrency.json": _vllm(max_concurrency=8),
    "vllm_metric_text.json": _vllm(mean_ttft_ms="fast"),
    "vllm_metric_negative.json": _vllm(mean_ttft_ms=-5),
    "vllm_no_metric.json": _vllm(mean_ttft_ms=..., mean_e2el_ms=...),
    "vllm_no_rate.json": _vllm(request_rate=...),
    "vllm_rate_inf.json": _vllm(request_rate="inf", model_id="meta-llama/Llama-3.1-8B-Instruct"),
    "not_netcdf.nc": "hello",
    "binary.nc": bytes(range(256)) * 4,
    "empty.nc": "",
}

# (id, arguments, what the message must name, whether running is an answer too); {name} is a file
# or folder of the test's folder.
CASES: list[tuple[str, list[str], str, bool]] = []


def case(id: str, args: list[str], names: str = "", may_run: bool = False) -> None:
    CASES.append((id, args, names, may_run))


# --- models as deployed: config.json imports, precisions, experts
for name, names in [("hf_notjson.json", "not JSON"), ("hf_list.json", "JSON object"),
                    ("hf_no_arch.json", "architectures"), ("hf_hybrid.json", "FalconH1ForCausalLM"),
                    ("hf_missing.json", "num_hidden_layers"), ("hf_moe_missing.json", "num_experts_per_tok"),
                    ("hf_text_field.json", "num_hidden_layers"), ("hf_awq.json", "awq"),
                    ("nowhere.json", "no such file")]:
    case(f"model-config-json-{name}", ["run", H100, "--set", "model.config_json={%s}" % name, *SMALL],
         "model.config_json: " if name in ("hf_list.json", "nowhere.json") else names)
case("model-both-preset-and-config-json", ["run", "{both_models.yaml}"], "model.preset")

# --- warm-ups
for id, value in [("negative", "-5"), ("fraction", "1.5"), ("unit", "3 days"), ("no-number", "s"),
                  ("words", "a while"), ("not-below", "50"), ("infinite", "inf s")]:
    case(f"warmup-{id}", ["run", H100, "--set", f"workload.warmup={value}", *SMALL], "workload.warmup")

# --- closed-loop clients and benchmark lengths
CLIENTS = ["--set", "workload.rate=null", *SMALL]
for id, args, names in [
    ("zero", ["workload.concurrency=0", *CLIENTS], "workload.concurrency"),
    ("fraction", ["workload.concurrency=2.5", *CLIENTS], "workload.concurrency"),
    ("with-rate", ["workload.concurrency=8", *SMALL], "workload: concurrency (8 clients: a closed loop) and rate"),
    ("with-arrival", ["workload.concurrency=8", "--set", "workload.arrival=constant", *CLIENTS],
     "concurrency (8 clients: a closed loop) and arrival (constant)"),
    ("with-trace", ["workload.concurrency=8", "--set", "workload.trace=traces/AzureLLMInferenceTrace_conv.csv", *CLIENTS],
     "workload.concurrency: not with a workload.trace"),
    ("static", ["workload.concurrency=8", "--set", "engine.policy=static", *CLIENTS],
     "workload.concurrency needs engine.policy continuous"),
    ("warmup-duration", ["workload.concurrency=8", "--set", "workload.warmup=10s", *CLIENTS], "workload.warmup"),
    ("warmup-not-below", ["workload.concurrency=8", "--set", "workload.warmup=50", *CLIENTS], "workload.warmup"),
    ("think-alone", ["workload.think_s.mean=2", *SMALL], "think_s"),
    ("range-ratio-above", ["workload.prompt.range_ratio=1.5", *SMALL], "workload.prompt.range_ratio"),
    ("range-ratio-zero", ["workload.output.range_ratio=0", *SMALL], "workload.output.range_ratio"),
]:
    case(f"clients-{id}", ["run", H100, "--set", *args], names)
case("clients-capacity", ["capacity", H100, "--set", "workload.concurrency=8", *CLIENTS], "workload.concurrency")

# --- the prefix cache, sessions and prefix-aware routing
CACHE = ["--set", "engine.prefix_caching=true"]
SESSIONS = ["--set", "workload.sessions.turns.max=4"]
for id, args, names in [
    # static and dynamic batching run without the prefix cache they do not have, but not what needs one
    ("sessions-static", [*CACHE, *SESSIONS, "--set", "engine.policy=static"], "workload.sessions"),
    ("sessions-dynamic", [*SESSIONS, "--set", "engine.policy=dynamic", "--set", "engine.prefix_caching=false"],
     "workload.sessions"),
    ("prefix-aware-static", [*CACHE, "--set", "engine.policy=static", "--set", "fleet.replicas=2",
                             "--set", "fleet.router=prefix_aware"], "fleet.router"),
    ("prefix-caching-reserve", [*CACHE, "--set", "engine.kv_alloc=reserve"], "engine.kv_alloc"),
    ("prefix-caching-unlimited", [*CACHE, "--set", "hardware.mem_gb=null", "--set", "hardware.preset=null"],
     "engine.prefix_caching"),
    ("system-prompt-too-long", ["--set", "workload.system_prompts.tokens=1000"], "workload.system_prompts.tokens"),
    ("system-prompt-and-prefix", ["--set", "workload.system_prompts.tokens=10", "--set", "workload.prefix_tokens=5"],
     "workload.system_prompts"),
    ("system-prompt-count-0", ["--set", "workload.system_prompts.tokens=10", "--set", "workload.system_prompts.count=0"],
     "workload.system_prompts.count"),
    ("system-prompt-popularity", ["--set", "workload.system_prompts.tokens=10",
                                  "--set", "workload.system_prompts.popularity=pareto"],
     "workload.system_prompts.popularity"),
    ("sessions-with-trace", [*SESSIONS, "--set", "workload.trace=AzureLLMInferenceTrace_conv.csv"], "workload.sessions"),
    ("sessions-turns-below-1", ["--set", "workload.sessions.turns.min=0"], "workload.sessions.turns.min"),
    ("sessions-fixed-turns-0", ["--set", "workload.sessions.turns.dist=fixed", "--set", "workload.sessions.turns.value=0"],
     "workload.sessions.turns.value"),
    ("sessions-think-negative", ["--set", "workload.sessions.think_s.value=-1"], "workload.sessions.think_s.value"),
    ("sessions-think-mean-negative", ["--set", "workload.sessions.think_s.mean=-0.5"], "workload.sessions.think_s.mean"),
    ("sessions-stdlib", [*SESSIONS, "--set", "workload.rng=stdlib"], "workload.sessions"),
    ("sessions-pinned-prefix", [*SESSIONS, "--set", "workload.prefix_tokens=100", "--set", "engine.prefix_caching=false"],
     "workload.prefix_tokens"),
    ("sessions-context-too-long", [*SESSIONS, "--set", "workload.sessions.max_context=10000000",
                                   "--set", "workload.sessions.followup.dist=fixed",
                                   "--set", "workload.sessions.followup.value=300000"], "workload.sessions.max_context"),
    ("prefix-aware-without-cache", ["--set", "fleet.replicas=2", "--set", "fleet.router=prefix_aware", "--set", "engine.prefix_caching=false"],
     "fleet.router"),
    ("prefix-weight-negative", [*CACHE, "--set", "fleet.prefix_weight=-1"], "fleet.prefix_weight"),
    ("trace-hash-block-0", [*CACHE, "--set", "workload.trace_hash_block=0"], "workload.trace_hash_block"),
]:
    case(f"prefix-{id}", ["run", H100, *SMALL, *args], names)
for policy in ("static", "dynamic"):  # runs, without the prefix cache these have not
    case(f"prefix-caching-{policy}", ["run", H100, *SMALL, *CACHE, "--set", f"engine.policy={policy}"], may_run=True)
    case(f"prefix-caching-{policy}-max-memory", ["run", H100, *CACHE, "--set", f"engine.policy={policy}",
                                                 "--max-memory", "1kB"], "requests need ~")
for name, names in [("hash_not_list.jsonl", "hash_ids"), ("hash_text_ids.jsonl", "hash_ids"),
                    ("hash_wrong_count.jsonl", "workload.trace_hash_block"), ("hash_not_json.jsonl", "not JSON"),
                    ("hash_no_ids.jsonl", "hash_ids"), ("conv_parent_later.csv", "parent_chat_id"),
                    ("conv_parent_missing.csv", "parent_chat_id")]:
    case(f"prefix-trace-{name}", ["run", H100, *CACHE, "--set", "workload.trace={%s}" % name,
                                  "--set", "workload.n_requests=null"], names)
for key, value, names in [
    ("model.dtype", "fp6", "model.dtype"), ("model.kv_dtype", "fp4", "model.kv_dtype"),
    ("model.preset", "qwen4-1t", "qwen4-1t"), ("model.experts_per_token", "9", "model.experts_per_token"),
    ("model.moe_layers", "99", "model.moe_layers"), ("model.expert_gb", "5", "model.expert_gb"),
    ("engine.expert_parallel", "true", "engine.expert_parallel"), ("engine.tp", "3", "engine.tp"),
    ("model.vocab", "32000", "model.vocab")]:
    preset = [] if key in ("engine.expert_parallel", "model.vocab") else ["--set", "model.preset=mixtral-8x7b"]
    unset = ["--set", "model.preset=null", "--set", "model.hidden=null"] if key == "model.vocab" else []
    case(f"model-{key}-{value}", ["run", H100, *preset, *unset, "--set", f"{key}={value}", *SMALL], names)
case("model-fp4-does-not-fit", ["run", H100, "--set", "model.preset=deepseek-v3", "--set", "model.dtype=fp4",
                                "--set", "hardware.preset=l4", *SMALL], "model.weight_gb")
case("model-tp-kv-heads-import", ["run", H100, "--set", "model.preset=qwen3-30b-a3b", "--set", "engine.tp=3",
                                  *SMALL], "engine.tp")
# attention data parallelism: a layout vLLM could not serve, or fastsim does not model
DP = ["--set", "model.preset=qwen3-30b-a3b", "--set", "engine.expert_parallel=true", *SMALL]
for id, args, names in [
    ("zero", ["--set", "engine.dp=0"], "engine.dp"),
    ("dense", ["--set", "model.preset=llama-3.1-8b", "--set", "engine.expert_parallel=false", "--set", "engine.dp=2"],
     "engine.dp"),
    ("no-expert-parallel", ["--set", "engine.expert_parallel=false", "--set", "engine.dp=2"], "engine.expert_parallel"),
    ("beyond-domain", ["--set", "engine.dp=16", "--set", "hardware.scaleout_gb_s=null"], "hardware.scaleout_gb_s"),
    ("uneven-domains", ["--set", "engine.dp=3", "--set", "engine.tp=4"], "hardware.scaleup_gpus"),
    ("static", ["--set", "engine.dp=2", "--set", "engine.policy=static"], "engine.policy"),
    ("prefill-pool", ["--set", "engine.dp=2", "--set", "fleet.prefill_replicas=1"], "fleet.prefill_replicas"),
    ("prefix-aware", ["--set", "engine.dp=2", "--set", "fleet.replicas=2", "--set", "fleet.router=prefix_aware"],
     "prefix_aware"),
    ("kv-per-rank", ["--set", "engine.dp=2", "--set", "engine.kv_cache_gb=0.001"], "KV cache"),
]:
    case(f"dp-{id}", ["run", H100, *DP, *args], names)
# hybrid attention: local and linear-attention layers that do not add up, or hold nothing
for id, args, names in [
    ("no-window", ["--set", "model.window_layers=16"], "model.window_tokens"),
    ("window-zero", ["--set", "model.window_layers=16", "--set", "model.window_tokens=0"], "model.window_tokens"),
    ("every-layer", ["--set", "model.window_layers=16", "--set", "model.linear_layers=16", "--set",
                     "model.window_tokens=128"], "model.window_layers"),
    ("no-state", ["--set", "model.linear_layers=8"], "model.linear_state_bytes"),
    ("negative-state", ["--set", "model.linear_state_bytes=-1"], "model.linear_state_bytes"),
    ("kind", ["--set", "model.window_kind=diagonal"], "model.window_kind"),
    ("no-layers", ["--set", "model.n_layers=null", "--set", "model.window_layers=4", "--set",
                   "model.window_tokens=128"], "model.n_layers"),
    ("shared-content", ["--set", "model.preset=gpt-oss-20b", "--set", "workload.prefix_tokens=100"],
     "model.window_layers"),
    ("sparse-dense", ["--set", "model.sparse_topk=2048"], "model.sparse_topk"),
    ("sparse-window", ["--set", "model.preset=deepseek-v3.2", "--set", "model.window_layers=4", "--set",
                       "model.window_tokens=128"], "model.sparse_topk"),
]:
    case(f"hybrid-{id}", ["run", H100, "--set", "model.preset=null", "--set", "model.n_layers=32", *args, *SMALL]
         if id not in ("shared-content", "sparse-window") else ["run", H100, *args, *SMALL], names)

# speculative decoding: a draft that cannot be, or an engine that cannot verify it
R1 = ["--set", "model.preset=deepseek-r1", "--set", "hardware.preset=h200", "--set", "engine.tp=8"]


def speculative(**keys) -> list[str]:
    return [a for k, v in keys.items() for a in ("--set", f"engine.speculative.{k}={v}")]


for id, spec, more, names in [
    ("no-tokens", speculative(method="mtp", tokens=0, acceptance=0.7), R1, "engine.speculative.tokens"),
    ("above-one", speculative(method="mtp", tokens=2, acceptance=1.5), R1, "engine.speculative.acceptance"),
    ("negative", speculative(method="mtp", tokens=2, acceptance="[0.8, -0.1]"), R1, "engine.speculative.acceptance"),
    ("too-long", speculative(method="mtp", tokens=2, acceptance="[0.9, 0.8, 0.7]"), R1, "engine.speculative.tokens"),
    ("no-method", speculative(tokens=2, acceptance=0.7), R1, "engine.speculative.method"),
    ("method", speculative(method="medusa", tokens=2, acceptance=0.7), R1, "engine.speculative.method"),
    ("no-mtp", speculative(method="mtp", tokens=2, acceptance=0.7), [], "model.mtp_layers"),
    ("larger-draft", speculative(method="draft", tokens=2, acceptance=0.7, draft_model="llama-3.1-70b"), [],
     "engine.speculative.draft_model"),
    ("unknown-draft", speculative(method="draft", tokens=2, acceptance=0.7, draft_model="llama-9"), [],
     "engine.speculative.draft_model"),
    ("draft-without-model", speculative(method="draft", tokens=2, acceptance=0.7), [],
     "engine.speculative.draft_model"),
    ("static", speculative(method="ngram", tokens=2, acceptance=0.7), ["--set", "engine.policy=static"],
     "engine.policy"),
    ("reserve", speculative(method="ngram", tokens=2, acceptance=0.7),
     ["--set", "engine.kv_alloc=reserve", "--set", "engine.prefix_caching=false"], "engine.kv_alloc"),
    ("budget", speculative(method="ngram", tokens=3, acceptance=0.7), ["--set", "engine.max_batched_tokens=512"],
     "engine.max_batched_tokens"),
    ("shared", speculative(method="ngram", tokens=2, acceptance=0.7), ["--set", "workload.prefix_tokens=100"],
     "engine.prefix_caching"),
]:
    case(f"spec-{id}", ["run", H100, *spec, *more, *SMALL], names)

# --- config files
for name in ["binary.yaml", "utf16.yaml", "latin1.yaml", "extends_utf16.yaml", "extends_binary.yaml",
             "nul.yaml"]:
    case(f"config-{name}", ["run", "{%s}" % name], "UTF-8" if "nul" not in name else name.split(".")[0])
for name, names in [("extends_missing.yaml", "nowhere.yaml"), ("extends_self.yaml", "itself"),
                    ("extends_number.yaml", "extends"), ("dup_top.yaml", "engine"),
                    ("dup_nested.yaml", "max_batch"), ("unhashable_key.yaml", "unhashable"),
                    ("dup_sweep.yaml", "workload.rate"),
                    ("list.yaml", "mapping"), ("scalar.yaml", "mapping"), ("syntax.yaml", "syntax"),
                    ("tabs.yaml", "syntax"), ("section_scalar.yaml", "engine"),
                    ("unknown_section.yaml", "engines"), ("sweep_scalar.yaml", "workload.rate"),
                    ("sweep_list.yaml", "sweep"), ("sweep_unknown.yaml", "engine.nope"),
                    ("sweep_empty.yaml", "workload.rate"), ("sweep_repeat.yaml", "workload.rate"),
                    ("sweep_bad_value.yaml", "engine.max_batch")]:
    case(f"config-{name}", ["sweep", "{%s}" % name, "--out", "{out.nc}", "-q"], names)
case("config-missing", ["run", "{nowhere.yaml}"], "no such config")
case("config-directory", ["run", "{folder}"], "folder")
case("config-none", ["run"], "config")
case("trace-lesson-stream", ["run", REF, "--set", "workload.trace={trace_negative.csv}"], "workload.rng")

# --- every integer key, far beyond what a machine could hold, and every key with a wrong kind
for key in ["engine.max_batch", "engine.max_concurrent", "engine.max_batched_tokens", "engine.tp",
            "engine.block_tokens", "workload.n_requests", "workload.seed", "workload.prefix_tokens",
            "workload.prompt.value", "workload.output.value", "workload.output.max", "workload.prompt.max",
            "fleet.replicas", "fleet.prefill_replicas", "fleet.prefill_tp", "fleet.prefill_max_batched_tokens",
            "model.n_layers", "model.attn_dim", "model.hidden"]:
    for value in ["1e19", "1e30", "-1e30", "9223372036854775808", "1e400"]:
        case(f"int-{key}={value}", ["run", H100, *SMALL, "--set", f"{key}={value}"], key)
for key in ["engine.kv_cache_gb", "hardware.mem_gb", "model.weight_gb", "model.kv_bytes_per_token",
            "hardware.mem_bandwidth_tb_s", "hardware.peak_tflops", "model.params_b", "workload.rate",
            "engine.reserved_gb", "calibration.step_overhead_ms", "fleet.kv_link_gb_s",
            "engine.window_ms", "hardware.link_gb_s"]:
    for value in ["1e300", "1e-300", "nan", "inf", "-1", "text", "[1]", "{a: 1}", "true"]:
        case(f"float-{key}={value}", ["run", H100, "--set", f"{key}={value}", *SMALL], key, may_run="e" in value)
VALUES = [("engine.policy", "greedy", ""), ("engine.kv_alloc", "lazy", ""), ("fleet.router", "magic", ""),
          ("workload.arrival", "burst", ""), ("workload.rng", "dice", ""), ("hardware.preset", "tpu", ""),
          ("model.preset", "gpt-9", ""), ("fleet.prefill_hardware", "tpu", ""), ("workload.prompt.dist", "zipf", ""),
          ("workload.output.mu", "1500", "workload.output: mu"), ("workload.trace", "5", ""),
          ("engine.max_batch", "1.5", ""), ("engine.max_batch", "true", ""),
          ("engine.gpu_memory_utilization", "1.5", ""), ("workload.prompt.min", "-1", "")]
for key, value, names in VALUES:
    case(f"value-{key}={value}", ["run", H100, "--set", f"{key}={value}", *SMALL], names or key)

# --- overrides
for text, names in [("nokey", "nokey"), ("=5", "=5"), ("engine.nope=5", "engine.nope"), ("engine=5", "engine"),
                    ("engine.max_batch.x=5", "engine.max_batch"), ("workload.rate=[1,2", "workload.rate"),
                    ("sweep.workload.rate=5", "workload.rate"), ("sweep.engine.nope=[1]", "engine.nope"),
                    ("sweep.workload.rate=[]", "workload.rate"), ("nope.key=1", "nope"),
                    ("sweep.workload.sessions.turns.nope=[1]", "workload.sessions.turns has no 'nope'"),
                    ("sweep.workload.system_prompts.count=[2]", "workload.system_prompts.tokens"),
                    ("sweep.workload.sessions.think_s.mean=[-1]", "workload.sessions.think_s.mean")]:
    case(f"set-{text}", ["sweep", H100, "--set", text, "--out", "{out.nc}", "-q"], names)

# --- hopeless work and scenarios that cannot run
for sets, names in [(["engine.max_batched_tokens=1e19"], "max_batched_tokens"),
                    (["fleet.replicas=1e9", "workload.n_requests=200"], "fleet.replicas"),
                    (["fleet.prefill_replicas=1e9", "workload.n_requests=200"], "fleet.prefill_replicas"),
                    (["workload.output.dist=fixed", "workload.output.value=1e15", "workload.output.max=1e15",
                      "engine.kv_cache_gb=null", "hardware.mem_gb=null", "engine.prefix_caching=false",
                      "workload.n_requests=1"], "output"),
                    (["workload.n_requests=1e15"], "n_requests"),
                    (["engine.max_batch=1e15", "engine.max_batched_tokens=1e15"], ""),  # runs: at most every request
                    (["engine.max_batched_tokens=9e15"], ""),  # runs: a budget beyond any need is the need
                    (["workload.prompt.value=1e9"], "workload.prompt")]:
    case(f"work-{'-'.join(sets)}", ["run", H100, *(x for s in sets for x in ("--set", s))], names, may_run=not names)
LONG = ["--set", "workload.output.dist=fixed", "--set", "workload.output.value=1e12", "--set",
        "workload.output.max=1e12", "--set", "workload.n_requests=50", "--set", "workload.rate=1000"]  # hours
for policy in ("static", "dynamic", "continuous"):
    case(f"work-lesson-long-outputs-{policy}", ["run", REF, *LONG, "--set", f"engine.policy={policy}"],
         "workload.output")
    case(f"work-lesson-max_batch-1e15-{policy}", ["run", REF, "--set", "engine.max_batch=1e15", "--set",
                                                  f"engine.policy={policy}"], may_run=True)
case("work-sweep-long-outputs", ["sweep", REF, *LONG, "--set", "sweep.workload.rate=[10, 20]", "--out", "{out.nc}",
                                 "-q"], "workload.output")
case("work-fleet-long-outputs", ["run", REF, *LONG, "--set", "fleet.replicas=4"], "workload.output")

# --- traces
for name, names in [("trace_binary.csv", "UTF-8"), ("trace_utf16.csv", "UTF-8"), ("trace_header.csv", "header"),
                    ("trace_empty.csv", "trace_empty"), ("trace_header_only.csv", "trace_header_only"),
                    ("trace_huge_count.csv", "row 2"), ("trace_huge_output.csv", "row 2"),
                    ("trace_negative.csv", "row 2"), ("trace_zero_output.csv", "row 2"),
                    ("trace_float.csv", "row 2"), ("trace_nan_time.csv", "row 2"), ("trace_inf_time.csv", "row 2"),
                    ("trace_text_time.csv", "row 2"), ("trace_short_row.csv", "row 2"),
                    ("trace_backwards.csv", "row 3"), ("trace_nul.csv", "trace_nul"),
                    ("trace_azure_bad_date.csv", "row 2"), ("nowhere.csv", "no such file"),
                    ("folder", "folder")]:
    case(f"trace-{name}", ["run", H100, "--set", "workload.trace={%s}" % name, "--set", "workload.n_requests=null"],
         names)

# --- options
LONG = "{%s.nc}" % ("x" * 300)  # a file name longer than a file system takes (255 bytes)
LONGISH = "{%s.nc}" % ("y" * 245)  # one that fits, but not its temporary name
for command in (["sweep", H100, "--out", "{out.nc}"], ["capacity", H100, "--out", "{out.nc}"],
                ["plan", PLAN, "--out", "{out.nc}"]):
    name = command[0]
    for option, names in [(["--workers", "0"], "--workers"), (["--workers", "-3"], "--workers"),
                          (["--workers", "many"], "--workers"), (["--workers", "1e30"], "--workers"),
                          (["--scheduler", "not a url"], "--scheduler"), (["--scheduler", "tcp://"], "--scheduler"),
                          (["--scheduler", "tcp://host:notaport"], "--scheduler"),
                          (["--max-memory", "1.2.3GB"], "--max-memory"), (["--max-memory", "."], "--max-memory"),
                          (["--max-memory", "1e400"], "--max-memory"), (["--max-memory", "-5GB"], "--max-memory"),
                          (["--max-memory", "5XB"], "--max-memory"), (["--max-memory", ""], "--max-memory"),
                          (["--max-memory", "nan"], "--max-memory"), (["--max-memory", "1KB"], "allowed"),
                          (["--nope"], "--nope"), (["--out"], "--out"), (["--out", "{blocker}/x.nc"], "blocker"),
                          (["--out", "{folder}"], "folder"), (["--out", LONG], "name too long"),
                          (["--out", LONGISH], "name too long"), (["--out", LONG + "/x.nc"], "name too long")]:
        case(f"option-{name}-{' '.join(option)}", [*command, "-q", *SMALL, *option], names)
for option, names in [(["--attainment", "2"], "--attainment"), (["--attainment", "-0.5"], "--attainment"),
                      (["--attainment", "nan"], "--attainment"), (["--target", "ttft_p99_s<1"], "ttft_p99_s<1"),
                      (["--target", "nope<=1"], "nope"), (["--target", "ttft_p99_s<=abc"], "abc"),
                      (["--target", "ttft_p99_s<=nan"], "nan"), (["--target", "ttft_p99_s<=-1"], "ttft_p99_s"),
                      (["--target", ""], "--target")]:
    case(f"option-capacity-{' '.join(option)}", ["capacity", H100, "--out", "{out.nc}", "-q", *SMALL, *option],
         names)
for option, names in [(["--max-replicas", "0"], "--max-replicas"), (["--max-replicas", "1e30"], "--max-replicas"),
                      (["--max-replicas", "99999999999999999999"], "--max-replicas")]:
    case(f"option-plan-{' '.join(option)}", ["plan", PLAN, "--out", "{out.nc}", "-q", *option], names)
for option, names in [(["--n", "0"], "--n"), (["--n", "1e30"], "--n"), (["--repeats", "0"], "--repeats"),
                      (["--sweep-points", "3"], "--sweep-points"), (["--n", "99999999999999999999"], "--n"),
                      (["--n", "1000000000"], "requests")]:
    case(f"option-bench-{' '.join(option)}", ["bench", *option], names)
case("command-unknown", ["simulate"], "simulate")
case("keys-unknown-section", ["keys", "engines"], "engines")
case("requests-out-blocked", ["run", REF, "--requests-out", "{blocker}/x.nc"], "blocker")
case("requests-out-folder", ["run", REF, "--requests-out", "{folder}"], "folder")
case("requests-out-long", ["run", REF, "--requests-out", LONG], "name too long")
case("requests-out-longish", ["run", REF, "--requests-out", LONGISH], "name too long")

# --- calibrate
for name, names in [("measured_binary.csv", "UTF-8"), ("measured_utf16.csv", "UTF-8"),
                    ("measured_empty.csv", "empty"), ("measured_header_only.csv", "no runs"),
                    ("measured_bad_column.csv", "nope"), ("measured_no_metric.csv", "metric"),
                    ("measured_bad_yaml.csv", "row 2, column workload.n_requests"),
                    ("measured_nul.csv", "measured_nul"),
                    ("measured_bad_key_value.csv", "engine.max_batch"), ("measured_text_metric.csv", "row 2"),
                    ("measured_negative_metric.csv", "row 2"), ("measured_nan_metric.csv", "row 2"),
                    ("measured_short_row.csv", "row 2"), ("measured_bad_rate.csv", "workload.rate"),
                    ("notjson.json", "JSON"), ("binary.json", "binary.json"), ("list.json", "list.json"),
                    ("vllm_burst_null.json", "burstiness"), ("vllm_burst_text.json", "burstiness"),
                    ("vllm_burst_negative.json", "burstiness"), ("vllm_prompts_text.json", "num_prompts"),
                    ("vllm_prompts_float.json", "num_prompts"), ("vllm_prompts_mismatch.json", "num_prompts"),
                    ("vllm_huge_lens.json", "input_lens"), ("vllm_float_lens.json", "input_lens"),
                    ("vllm_text_lens.json", "output_lens"), ("vllm_nested_lens.json", "output_lens"),
                    ("vllm_lens_not_list.json", "output_lens"), ("vllm_no_lens.json", "input_lens"),
                    ("vllm_zero_len.json", "output_lens"), ("vllm_rate_text.json", "request_rate"),
                    ("vllm_rate_zero.json", "request_rate"), ("vllm_rate_bool.json", "request_rate"),
                    ("vllm_concurrency.json", "max_concurrency"), ("vllm_metric_text.json", "mean_ttft_ms"),
                    ("vllm_metric_negative.json", "mean_ttft_ms"), ("vllm_no_metric.json", "mean_"),
                    ("vllm_no_rate.json", "request_rate"), ("nowhere.csv", "no such file"),
                    ("folder", "folder")]:
    case(f"calibrate-{name}", ["calibrate", H100, "{%s}" % name], names)
case("calibrate-vllm_rate_inf.json", ["calibrate", H100, "{vllm_rate_inf.json}", "--fit", "calibration.api_overhead_ms",
                                     "--out", "{fit.yaml}"], may_run=True)  # every request at t = 0
for option, names in [(["--fit", "nope"], "nope"), (["--fit", ","], "--fit"),
                      (["--fit", "engine.max_batch"], "engine.max_batch"), (["--out", "{blocker}/x.yaml"], "blocker"),
                      (["--out", LONG.replace(".nc", ".yaml")], "name too long")]:
    case(f"calibrate-option-{' '.join(option)}", ["calibrate", H100, "configs/calibration/vllm-2026-02-h100.csv", *option],
         names)

# --- datasets: compare and plot
for name, names in [("not_netcdf.nc", "not_netcdf.nc"), ("binary.nc", "binary.nc"), ("empty.nc", "empty.nc"),
                    ("nowhere.nc", "nowhere.nc"), ("folder", "folder"), ("requests.nc", "requests.nc")]:
    case(f"compare-{name}", ["compare", "{sweep.nc}", "{%s}" % name], names)
    case(f"plot-{name}", ["plot", "{%s}" % name, "--out", "{fig.png}"], names)
case("compare-sweep-capacity", ["compare", "{sweep.nc}", "{capacity.nc}"], "")
case("compare-text-metric", ["compare", "{sweep.nc}", "{text_metric.nc}"], "throughput_tok_s")
case("compare-text-baseline", ["compare", "{text_metric.nc}", "{sweep.nc}"], "throughput_tok_s")
case("compare-text-metric-named", ["compare", "{sweep.nc}", "{text_metric.nc}", "--metric", "throughput_tok_s"],
     "throughput_tok_s")
case("compare-rtol", ["compare", "{sweep.nc}", "{sweep.nc}", "--rtol", "-1"], "--rtol")
case("compare-metric", ["compare", "{sweep.nc}", "{sweep.nc}", "--metric", "nope"], "nope")
for option, names in [(["--x", "rate", "--hue", "rate"], "rate"), (["--x", "nope"], "nope"),
                      (["--y", "nope"], "nope"), (["--hue", "nope"], "nope"),
                      (["--x", "max_batch", "--col", "max_batch"], "max_batch"),
                      (["--sel", "nope=1"], "nope"), (["--sel", "rate"], "rate"), (["--sel", "rate=abc"], "rate"),
                      (["--sel", "rate=999"], "999"), (["--out", "{fig.xyz}"], "xyz"), (["--y", "rate"], "rate"),
                      (["--out", "{blocker}/fig.png"], "blocker"), (["--out", "{folder}"], "folder"),
                      (["--out", LONG.replace(".nc", ".png")], "name too long")]:
    case(f"plot-sweep-{' '.join(option)}", ["plot", "{sweep.nc}", *option], names)
for option, names in [(["--y", "binding"], "binding"), (["--x", "rate"], "rate")]:
    case(f"plot-capacity-{' '.join(option)}", ["plot", "{capacity.nc}", *option, "--out", "{fig.png}"], names)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """The files the cases name, and small sweep and capacity datasets made once."""
    root, tmp = ROOT, tmp_path_factory.mktemp("bad-input")
    for name, content in FILES.items():
        (tmp / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    (tmp / "folder").mkdir()
    (tmp / "blocker").write_text("a file, not a folder")
    runner = CliRunner()
    small = ["--set", "workload.n_requests=100", "--set", "sweep.engine.max_batch=[64]",
             "--set", "sweep.engine.max_batched_tokens=[8192]", "--set", "sweep.workload.rate=[4,8]"]
    for command, name in [("sweep", "sweep.nc"), ("capacity", "capacity.nc")]:
        result = runner.invoke(app, [command, str(root / H100), "--out", str(tmp / name), "-q", *small])
        assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["run", str(root / REF), "--requests-out", str(tmp / "requests.nc"), *SMALL])
    assert result.exit_code == 0, result.output
    with xr.open_dataset(tmp / "sweep.nc") as ds:  # a metric that holds numbers as text
        ds.load().assign(throughput_tok_s=ds.throughput_tok_s.astype(str)).to_netcdf(tmp / "text_metric.nc")
    return tmp


def _args(args: list[str], folder: Path, root: Path) -> list[str]:
    """``configs/...`` from the repository's root, ``{name}`` from the test's folder."""
    return [str(root / a) if a.startswith(("configs/", "tests/data/")) else
            re.sub(r"\{([^}]*)\}", lambda m: str(folder / m.group(1)), a) for a in args]


def test_the_battery_is_large():
    assert len(CASES) >= 150
    assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("args,names,may_run", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(args, names, may_run, folder, root):
    before = sorted(p.name for p in folder.iterdir())
    result = CliRunner().invoke(app, _args(args, folder, root))
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        f"{type(result.exception).__name__}: {result.exception}"
    if may_run and result.exit_code == 0:
        return
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()  # no empty line either
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    assert names in lines[0], lines[0]
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing left behind
