"""Hardware and model presets: data, one registry each. A preset fills the fields of its config
section that the config does not set (explicit keys win).

Hardware: datasheet dense (no sparsity) BF16 tensor TFLOP/s, HBM bandwidth, memory, and the
per-GPU, per-direction bandwidth of the link that tensor parallelism's all-reduces cross, with
a typical small-message all-reduce latency (:data:`DATASHEETS`); and an on-demand price per
GPU-hour (USD), from the source and date noted beside it (list prices move:
``hardware.usd_per_gpu_hour`` overrides it), or none where no list price was found.

Models: each is a Hugging Face ``config.json`` shipped in the package (:data:`MODELS`), read by
:mod:`.hf_config` like a ``model.config_json`` a user names.
"""

from __future__ import annotations

from pathlib import Path

HARDWARE: dict[str, dict[str, float | None]] = {
    # NVLink 4: 900 GB/s bidirectional per GPU
    "h100-sxm": dict(peak_tflops=989.0, peak_tflops_fp8=1979.0, peak_tflops_fp4=None, mem_bandwidth_tb_s=3.35,
                     mem_gb=80.0, link_gb_s=450.0, link_latency_us=5.0, usd_per_gpu_hour=2.69,
                     scaleup_gpus=8, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
    "h200": dict(peak_tflops=989.0, peak_tflops_fp8=1979.0, peak_tflops_fp4=None, mem_bandwidth_tb_s=4.8,
                 mem_gb=141.0, link_gb_s=450.0, link_latency_us=5.0, usd_per_gpu_hour=3.59,
                 scaleup_gpus=8, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
    # NVLink 3: 600 GB/s bidirectional
    "a100-80gb": dict(peak_tflops=312.0, peak_tflops_fp8=None, peak_tflops_fp4=None, mem_bandwidth_tb_s=2.039,
                      mem_gb=80.0, link_gb_s=300.0, link_latency_us=5.0, usd_per_gpu_hour=1.39,
                      scaleup_gpus=8, scaleout_gb_s=25.0, scaleout_latency_us=10.0),
    # NVLink 5: 1.8 TB/s bidirectional
    "b200": dict(peak_tflops=2250.0, peak_tflops_fp8=4500.0, peak_tflops_fp4=9000.0, mem_bandwidth_tb_s=8.0,
                 mem_gb=180.0, link_gb_s=900.0, link_latency_us=5.0, usd_per_gpu_hour=5.98,
                 scaleup_gpus=8, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
    # no NVLink: PCIe Gen4 x16
    "l40s": dict(peak_tflops=362.0, peak_tflops_fp8=733.0, peak_tflops_fp4=None, mem_bandwidth_tb_s=0.864,
                 mem_gb=48.0, link_gb_s=32.0, link_latency_us=10.0, usd_per_gpu_hour=0.79,
                 scaleup_gpus=8, scaleout_gb_s=None, scaleout_latency_us=0.0),
    # Infinity Fabric: 7 links of 64 GB/s per direction
    "mi300x": dict(peak_tflops=1307.0, peak_tflops_fp8=2614.9, peak_tflops_fp4=None, mem_bandwidth_tb_s=5.3,
                   mem_gb=192.0, link_gb_s=448.0, link_latency_us=5.0, usd_per_gpu_hour=1.85,
                   scaleup_gpus=8, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
    # Without a price below (None: cost is NaN until hardware.usd_per_gpu_hour is set). PCIe parts'
    # tensor-parallel link is PCIe (per direction), with the latency of the other PCIe preset.
    "h100-pcie": dict(peak_tflops=756.5, peak_tflops_fp8=1513.0, peak_tflops_fp4=None, mem_bandwidth_tb_s=2.0,
                      mem_gb=80.0, link_gb_s=64.0, link_latency_us=10.0, usd_per_gpu_hour=None,
                      scaleup_gpus=8, scaleout_gb_s=None, scaleout_latency_us=0.0),
    "b300": dict(peak_tflops=2250.0, peak_tflops_fp8=4500.0, peak_tflops_fp4=13125.0, mem_bandwidth_tb_s=8.0,
                 mem_gb=288.0, link_gb_s=900.0, link_latency_us=5.0, usd_per_gpu_hour=None,
                 scaleup_gpus=8, scaleout_gb_s=100.0, scaleout_latency_us=10.0),
    "gb200": dict(peak_tflops=2500.0, peak_tflops_fp8=5000.0, peak_tflops_fp4=10000.0, mem_bandwidth_tb_s=8.0,
                  mem_gb=186.0, link_gb_s=900.0, link_latency_us=5.0, usd_per_gpu_hour=None,
                  scaleup_gpus=72, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
    "a100-40gb": dict(peak_tflops=312.0, peak_tflops_fp8=None, peak_tflops_fp4=None, mem_bandwidth_tb_s=1.555,
                      mem_gb=40.0, link_gb_s=300.0, link_latency_us=5.0, usd_per_gpu_hour=None,
                      scaleup_gpus=8, scaleout_gb_s=25.0, scaleout_latency_us=10.0),
    "l4": dict(peak_tflops=121.0, peak_tflops_fp8=242.5, peak_tflops_fp4=None, mem_bandwidth_tb_s=0.3, mem_gb=24.0,
               link_gb_s=32.0, link_latency_us=10.0, usd_per_gpu_hour=None,
               scaleup_gpus=8, scaleout_gb_s=None, scaleout_latency_us=0.0),
    "rtx-pro-6000": dict(peak_tflops=500.0, peak_tflops_fp8=1000.0, peak_tflops_fp4=2000.0, mem_bandwidth_tb_s=1.597,
                         mem_gb=96.0, link_gb_s=64.0, link_latency_us=10.0, usd_per_gpu_hour=None,
                         scaleup_gpus=8, scaleout_gb_s=None, scaleout_latency_us=0.0),
    "mi325x": dict(peak_tflops=1307.4, peak_tflops_fp8=2614.9, peak_tflops_fp4=None, mem_bandwidth_tb_s=6.0,
                   mem_gb=256.0, link_gb_s=448.0, link_latency_us=5.0, usd_per_gpu_hour=None,
                   scaleup_gpus=8, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
    "mi355x": dict(peak_tflops=2516.6, peak_tflops_fp8=5033.2, peak_tflops_fp4=10066.3, mem_bandwidth_tb_s=8.0,
                   mem_gb=288.0, link_gb_s=537.6, link_latency_us=5.0, usd_per_gpu_hour=None,
                   scaleup_gpus=8, scaleout_gb_s=50.0, scaleout_latency_us=10.0),
}

DATASHEETS: dict[str, str] = {
    "h100-sxm": "NVIDIA H100 Tensor Core GPU Datasheet, H100 SXM (2023-2024): BF16 1,979 and FP8 3,958 TFLOPS with sparsity, "
                "3.35 TB/s, 80 GB, NVLink 900 GB/s",
    "h200": "NVIDIA H200 product page/datasheet, H200 SXM (2024): BF16 1,979 and FP8 3,958 TFLOPS with sparsity, 4.8 TB/s, "
            "141 GB, NVLink 900 GB/s",
    "a100-80gb": "NVIDIA A100 Tensor Core GPU Datasheet (June 2021), A100 80GB SXM: BF16 312 TFLOPS, 2,039 GB/s, "
                 "NVLink 600 GB/s",
    "b200": "NVIDIA HGX platform page, HGX B200, and DGX B200 Datasheet (2024): BF16 36, FP8 72, FP4 "
            "72 PF dense per 8 GPUs, 1,440 GB and 64 TB/s per 8 GPUs; 8.0 TB/s also in Vultr's HGX B200 docs (2026-03)",
    "l40s": "NVIDIA L40S Datasheet (2023): BF16 362.05 and FP8 733 TFLOPS, 864 GB/s, 48 GB, PCIe Gen4 x16 64 GB/s",
    "mi300x": "AMD Instinct MI300X Data Sheet (Dec 2023): BF16 1,307.4 and FP8 2,614.9 TFLOPS, 5.3 TB/s, 192 GB, Infinity "
              "Fabric 896 GB/s",
    "h100-pcie": "NVIDIA H100 Datasheet (2022) and H100 PCIe Product Brief PB-11133-001_v02 (Nov 2022): BF16 1,513 "
                 "and FP8 3,026 TFLOPS with sparsity, 2 TB/s, 80 GB, PCIe Gen5 128 GB/s",
    "b300": "NVIDIA HGX platform page, HGX B300 (2025): BF16 36 and FP8 72 PF with sparsity, FP4 105 PF dense, per 8 "
            "GPUs; 288 GB and 8 TB/s per GPU, NVLink 1.8 TB/s",
    "gb200": "NVIDIA GB200 NVL72 page (2024-2025): BF16 360, FP8 720, FP4 1,440 PF with sparsity and 576 TB/s per 72 GPUs, 13.4 TB HBM3e, "
             "NVLink 130 TB/s",
    "a100-40gb": "NVIDIA A100 Datasheet (2020 revision), A100 40GB SXM: BF16 312 TFLOPS, 1,555 GB/s, NVLink 600 GB/s",
    "l4": "NVIDIA L4 Tensor Core GPU Datasheet (2023): BF16 242 and FP8 485 TFLOPS with sparsity, 300 GB/s, 24 GB, "
          "PCIe Gen4",
    "rtx-pro-6000": "NVIDIA RTX PRO 6000 Blackwell Server Edition page (2025): 96 GB GDDR7, 1,597 GB/s, PCIe Gen5; "
                    "BF16 and FP8 not printed: derived from 4,000 FP4 TOPS with sparsity (uncertain)",
    "mi325x": "AMD Instinct MI325X product page (Oct 2024): BF16 1,307.4 and FP8 2,614.9 TFLOPS, 6 TB/s, 256 GB",
    "mi355x": "AMD Instinct MI355X product page (June 2025): BF16 2.5, FP8 5.0, FP4 10.1 PF dense, 8 TB/s, 288 GB; Infinity Fabric 1,075.2 "
              "GB/s (uncertain)",
}
"""Where each hardware preset's figures come from: dense is half a with-sparsity figure where the
vendor prints only that; per-direction links are half a bidirectional total. FP8 and FP4 peaks
follow the same sources (FP4 only on Blackwell and CDNA 4). Checked against a second source:
B200's 8 TB/s and dense 2,250 / 4,500 / 9,000 TFLOPS BF16 / FP8 / FP4 (Vultr's HGX B200 docs,
2026-03; glennklockwood.com's B200 page); MI355X's 8 TB/s, 288 GB and 10 PF dense FP4 (several
vendor summaries). Still uncertain: MI355X's Infinity Fabric per direction, and the RTX PRO
6000's tensor rates, derived from one marketing figure."""

NETWORK = ("Scale-up domains and networks: 8 GPUs on one NVSwitch or Infinity Fabric board (NVIDIA HGX/DGX "
           "H100, H200, A100, B200, B300 datasheets; AMD MI300X/MI325X/MI355X platform briefs), 72 on GB200 NVL72 "
           "(its product page); one network adapter per GPU: DGX H100/H200/B200 and GB200 NVL72 8x or 72x "
           "ConnectX-7 400 Gb/s (50 GB/s), DGX B300 ConnectX-8 800 Gb/s (100 GB/s), DGX A100 ConnectX-6 200 Gb/s "
           "(25 GB/s), MI3xx platforms 400 Gb/s adapters (50 GB/s, a typical build, not a datasheet figure). "
           "PCIe presets carry no network: a group beyond their 8 GPUs is refused. Latency between domains "
           "(10 us a ring step) is an estimate of an InfiniBand hop plus NCCL's protocol, not a datasheet figure.")
"""Where the presets' scale-up domains and scale-out networks come from."""

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


CONFIGS = Path(__file__).with_name("configs")

MODELS: dict[str, str] = {d.name: str(d / "config.json") for d in sorted(CONFIGS.iterdir())
                          if (d / "config.json").is_file()}
"""Model preset name -> its Hugging Face config.json, shipped in the package (sources and
licences in ``configs/README.md``); read by the same parser as ``model.config_json``."""
