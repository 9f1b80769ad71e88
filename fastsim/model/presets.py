"""Hardware and model presets: data, one registry each. A preset fills the fields of its config
section that the config does not set (explicit keys win).

Hardware: datasheet dense (no sparsity) BF16 tensor TFLOP/s, HBM bandwidth, memory, and the
per-GPU, per-direction bandwidth of the link that tensor parallelism's all-reduces cross, with
a typical small-message all-reduce latency (:data:`DATASHEETS`); and an on-demand price per
GPU-hour (USD), from the source and date noted beside it (list prices move:
``hardware.usd_per_gpu_hour`` overrides it), or none where no list price was found.

Models: shapes from each model's Hugging Face ``config.json``. Weights are BF16 (2 bytes per
parameter); the KV cache holds K and V for every layer and KV head: 2 x n_layers x kv_heads x
head_dim x 2 bytes per token; ``attn_dim`` = heads x head_dim. For a mixture of experts,
``params_b`` counts the parameters active per token (what a token's FLOPs scale with) and
``weight_gb`` all of them (what a step reads).
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_PER_PARAM = 2  # BF16

HARDWARE: dict[str, dict[str, float | None]] = {
    # NVLink 4: 900 GB/s bidirectional per GPU
    "h100-sxm": dict(peak_tflops=989.0, mem_bandwidth_tb_s=3.35, mem_gb=80.0, link_gb_s=450.0, link_latency_us=5.0,
                     usd_per_gpu_hour=2.69),
    "h200": dict(peak_tflops=989.0, mem_bandwidth_tb_s=4.8, mem_gb=141.0, link_gb_s=450.0, link_latency_us=5.0,
                 usd_per_gpu_hour=3.59),
    # NVLink 3: 600 GB/s bidirectional
    "a100-80gb": dict(peak_tflops=312.0, mem_bandwidth_tb_s=2.039, mem_gb=80.0, link_gb_s=300.0, link_latency_us=5.0,
                      usd_per_gpu_hour=1.39),
    # NVLink 5: 1.8 TB/s bidirectional
    "b200": dict(peak_tflops=2250.0, mem_bandwidth_tb_s=8.0, mem_gb=180.0, link_gb_s=900.0, link_latency_us=5.0,
                 usd_per_gpu_hour=5.98),
    # no NVLink: PCIe Gen4 x16
    "l40s": dict(peak_tflops=362.0, mem_bandwidth_tb_s=0.864, mem_gb=48.0, link_gb_s=32.0, link_latency_us=10.0,
                 usd_per_gpu_hour=0.79),
    # Infinity Fabric: 7 links of 64 GB/s per direction
    "mi300x": dict(peak_tflops=1307.0, mem_bandwidth_tb_s=5.3, mem_gb=192.0, link_gb_s=448.0, link_latency_us=5.0,
                   usd_per_gpu_hour=1.85),
    # Without a price below (None: cost is NaN until hardware.usd_per_gpu_hour is set). PCIe parts'
    # tensor-parallel link is PCIe (per direction), with the latency of the other PCIe preset.
    "h100-pcie": dict(peak_tflops=756.5, mem_bandwidth_tb_s=2.0, mem_gb=80.0, link_gb_s=64.0, link_latency_us=10.0,
                      usd_per_gpu_hour=None),
    "b300": dict(peak_tflops=2250.0, mem_bandwidth_tb_s=8.0, mem_gb=288.0, link_gb_s=900.0, link_latency_us=5.0,
                 usd_per_gpu_hour=None),
    "gb200": dict(peak_tflops=2500.0, mem_bandwidth_tb_s=8.0, mem_gb=186.0, link_gb_s=900.0, link_latency_us=5.0,
                  usd_per_gpu_hour=None),
    "a100-40gb": dict(peak_tflops=312.0, mem_bandwidth_tb_s=1.555, mem_gb=40.0, link_gb_s=300.0, link_latency_us=5.0,
                      usd_per_gpu_hour=None),
    "l4": dict(peak_tflops=121.0, mem_bandwidth_tb_s=0.3, mem_gb=24.0, link_gb_s=32.0, link_latency_us=10.0,
               usd_per_gpu_hour=None),
    "rtx-pro-6000": dict(peak_tflops=500.0, mem_bandwidth_tb_s=1.597, mem_gb=96.0, link_gb_s=64.0,
                         link_latency_us=10.0, usd_per_gpu_hour=None),
    "mi325x": dict(peak_tflops=1307.4, mem_bandwidth_tb_s=6.0, mem_gb=256.0, link_gb_s=448.0, link_latency_us=5.0,
                   usd_per_gpu_hour=None),
    "mi355x": dict(peak_tflops=2516.6, mem_bandwidth_tb_s=8.0, mem_gb=288.0, link_gb_s=537.6, link_latency_us=5.0,
                   usd_per_gpu_hour=None),
}

DATASHEETS: dict[str, str] = {
    "h100-sxm": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM (2023-2024): BF16 1,979 TFLOPS with sparsity, "
                "3.35 TB/s, 80 GB, NVLink 900 GB/s",
    "h200": "NVIDIA H200 product page/datasheet, H200 SXM (2024): BF16 1,979 TFLOPS with sparsity, 4.8 TB/s, 141 GB, "
            "NVLink 900 GB/s",
    "a100-80gb": "NVIDIA A100 Tensor Core GPU Datasheet (June 2021), A100 80GB SXM: BF16 312 TFLOPS, 2,039 GB/s, "
                 "NVLink 600 GB/s",
    "b200": "NVIDIA HGX platform page, HGX B200, and DGX B200 Datasheet (2024): BF16 36 PF with sparsity per 8 GPUs, "
            "1,440 GB and 64 TB/s per 8 GPUs; 8.0 TB/s also in Vultr's HGX B200 docs (2026-03)",
    "l40s": "NVIDIA L40S Datasheet (2023): BF16 362.05 TFLOPS, 864 GB/s, 48 GB, PCIe Gen4 x16 64 GB/s",
    "mi300x": "AMD Instinct MI300X Data Sheet (Dec 2023): BF16 1,307.4 TFLOPS, 5.3 TB/s, 192 GB, Infinity Fabric "
              "896 GB/s",
    "h100-pcie": "NVIDIA H100 Datasheet (2022) and H100 PCIe Product Brief PB-11133-001_v02 (Nov 2022): BF16 1,513 "
                 "TFLOPS with sparsity, 2 TB/s, 80 GB, PCIe Gen5 128 GB/s",
    "b300": "NVIDIA HGX platform page, HGX B300 (2025): BF16 36 PF with sparsity per 8 GPUs, 288 GB and 8 TB/s per "
            "GPU, NVLink 1.8 TB/s",
    "gb200": "NVIDIA GB200 NVL72 page (2024-2025): BF16 360 PF with sparsity and 576 TB/s per 72 GPUs, 13.4 TB HBM3e, "
             "NVLink 130 TB/s",
    "a100-40gb": "NVIDIA A100 Datasheet (2020 revision), A100 40GB SXM: BF16 312 TFLOPS, 1,555 GB/s, NVLink 600 GB/s",
    "l4": "NVIDIA L4 Tensor Core GPU Datasheet (2023): BF16 242 TFLOPS with sparsity, 300 GB/s, 24 GB, PCIe Gen4",
    "rtx-pro-6000": "NVIDIA RTX PRO 6000 Blackwell Server Edition page (2025): 96 GB GDDR7, 1,597 GB/s, PCIe Gen5; "
                    "BF16 not printed: derived from 4,000 FP4 TOPS with sparsity (uncertain)",
    "mi325x": "AMD Instinct MI325X product page (Oct 2024): BF16 1,307.4 TFLOPS, 6 TB/s, 256 GB",
    "mi355x": "AMD Instinct MI355X product page (June 2025): BF16 2.5 PF, 8 TB/s, 288 GB; Infinity Fabric 1,075.2 "
              "GB/s (uncertain)",
}
"""Where each hardware preset's figures come from: dense BF16 is half a with-sparsity figure
where the vendor prints only that; per-direction links are half a bidirectional total."""

PRICE_SOURCES: dict[str, str] = {
    # NVIDIA parts: RunPod Secure Cloud on-demand list (per GPU, SXM where there is a choice)
    "h100-sxm": "RunPod Secure Cloud on-demand, H100 SXM 80GB; deploybase.ai/articles/runpod-gpu-pricing, 2026-03-10",
    "h200": "RunPod Secure Cloud on-demand, H200 141GB; deploybase.ai/articles/runpod-gpu-pricing, 2026-03-10",
    "a100-80gb": "RunPod Secure Cloud on-demand, A100 SXM 80GB; deploybase.ai/articles/runpod-gpu-pricing, 2026-03-10",
    "b200": "RunPod Secure Cloud on-demand, B200 192GB; deploybase.ai/articles/runpod-gpu-pricing, 2026-03-10",
    "l40s": "RunPod Secure Cloud on-demand, L40S 48GB; deploybase.ai/articles/runpod-gpu-pricing, 2026-03-10",
    # RunPod lists no MI300X there: Vultr's on-demand rate
    "mi300x": "Vultr on-demand, MI300X 192GB; cliffcenter.com/research/amd-inference-economics, 2026-05-18",
}
"""Where each preset's ``usd_per_gpu_hour`` comes from, and as of when."""


@dataclass(frozen=True)
class ModelShape:
    params_b: float  # parameters per token (active), billions
    total_params_b: float  # parameters stored, billions
    n_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    architecture: str = "LlamaForCausalLM"  # config.json's architectures[0]

    def fields(self) -> dict[str, float]:
        """The ``model:`` config fields this shape fills."""
        return dict(
            weight_gb=round(self.total_params_b * BYTES_PER_PARAM, 6),
            kv_bytes_per_token=float(2 * self.n_layers * self.kv_heads * self.head_dim * BYTES_PER_PARAM),
            params_b=self.params_b,
            n_layers=self.n_layers,
            attn_dim=self.heads * self.head_dim,
            hidden=self.hidden,
            kv_heads=self.kv_heads,
        )


MODEL_SHAPES: dict[str, ModelShape] = {
    "llama-3.1-8b": ModelShape(8.03, 8.03, 32, 4096, 32, 8, 128),
    "llama-3.1-70b": ModelShape(70.55, 70.55, 80, 8192, 64, 8, 128),
    "llama-2-7b": ModelShape(6.74, 6.74, 32, 4096, 32, 32, 128),
    "llama-2-70b": ModelShape(68.98, 68.98, 80, 8192, 64, 8, 128),
    "codellama-34b": ModelShape(33.74, 33.74, 48, 8192, 64, 8, 128),
    "qwen2.5-7b": ModelShape(7.62, 7.62, 28, 3584, 28, 4, 128, "Qwen2ForCausalLM"),
    "mistral-7b": ModelShape(7.24, 7.24, 32, 4096, 32, 8, 128, "MistralForCausalLM"),
    # 8 experts, 2 active per token: 12.9 B of 46.7 B parameters work on each token
    "mixtral-8x7b": ModelShape(12.9, 46.7, 32, 4096, 32, 8, 128, "MixtralForCausalLM"),
}

MODELS: dict[str, dict[str, float]] = {name: shape.fields() for name, shape in MODEL_SHAPES.items()}

REGISTRIES: dict[str, dict[str, dict[str, float]]] = {"hardware": HARDWARE, "model": MODELS}
"""Config section -> {preset name -> the fields it fills}."""
