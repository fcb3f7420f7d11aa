"""Attention shapes of real workloads, as the stress and bench tools run them (standard library only).

``shapes(name, resolution)`` returns the shape dicts of the stress/bench JSON documents:
``{"name", "family": "workload", "b", "h", "hkv", "sq", "sk", "d", "causal", "dtype"}``, with
q of shape (b, h, sq, d) and k/v of shape (b, hkv, sk, d). Each workload names the upstream
files its numbers come from (``WORKLOADS[name].sources``); ``docs/validation.md`` has the table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from contract.names import DTYPES

SHAPE_KEYS = ("name", "family", "b", "h", "hkv", "sq", "sk", "d", "causal", "dtype")

# Qwen-Image's text stream: the prompt wrapped in the pipeline's chat template, minus the 34
# template tokens it drops (prompt_template_encode_start_idx=34), about 100 for a typical
# prompt. 100 keeps the joint sequence off every tile boundary (6132, 6989), as real ones are.
QWEN_TEXT_TOKENS = 100
# CLIP's text encoder: SD1.5 and SDXL cross-attend to 77 tokens.
CLIP_TOKENS = 77
TINY_SEQ = 64
TINY_MIN_SEQ = 17


class WorkloadError(ValueError):
    """A resolution or shape the workload cannot take; the message is one sentence for users."""


@dataclass(frozen=True)
class Workload:
    """One workload: what it is, where its numbers come from, and how its shapes are made."""

    name: str
    summary: str
    sources: tuple[str, ...]
    resolutions: tuple[tuple[int, int], ...]  # default (width, height); () when it takes none
    make: Callable[[int | None, int | None], list[dict]]


def shape(name: str, b: int, h: int, hkv: int, sq: int, sk: int, d: int, causal: bool, dtype: str):
    """One shape dict of the contract (q: b×h×sq×d, k/v: b×hkv×sk×d)."""
    return {
        "name": name,
        "family": "workload",
        "b": int(b),
        "h": int(h),
        "hkv": int(hkv),
        "sq": int(sq),
        "sk": int(sk),
        "d": int(d),
        "causal": bool(causal),
        "dtype": dtype,
    }


def _qwen_image(width: int | None, height: int | None) -> list[dict]:
    # VAE downsample x8, then 2x2 patches: (H/16)*(W/16) image tokens; the pipeline floors sizes
    # to multiples of 16. Joint attention over [text, image], non-causal, Hq = Hkv = 24, d = 128.
    sizes = [(width, height)] if width else list(WORKLOADS["qwen-image"].resolutions)
    out = []
    for w, h in sizes:
        img = (h // 16) * (w // 16)
        s = QWEN_TEXT_TOKENS + img
        out.append(shape(f"qwen-image-{w}x{h}-joint", 1, 24, 24, s, s, 128, False, "bf16"))
    return out


# Flux.1-dev's text stream: T5 at max_length 512 (256 for schnell).
FLUX_TEXT_TOKENS = 512


def _flux(width: int | None, height: int | None) -> list[dict]:
    # As Qwen-Image: VAE x8, 2x2 patches, joint attention over [text, image], 24 heads x 128,
    # bf16. ComfyUI users saw black (NaN) images from bf16 SDPA on gfx1151 and gfx1201
    # (Comfy-Org/ComfyUI#14249, #14379), which the workload check's forced runs look for.
    w, h = (width, height) if width else WORKLOADS["flux"].resolutions[0]
    s = FLUX_TEXT_TOKENS + (h // 16) * (w // 16)
    return [shape(f"flux-{w}x{h}-joint", 1, 24, 24, s, s, 128, False, "bf16")]


def _halvings(n: int, times: int) -> int:
    """A latent side after ``times`` stride-2 convolutions (kernel 3, padding 1): ceil each time."""
    for _ in range(times):
        n = math.ceil(n / 2)
    return n


def _sd15(width: int | None, height: int | None) -> list[dict]:
    # 8 heads at every level (config's attention_head_dim is the head count); channels
    # 320/640/1280 give head dims 40/80/160. Self-attention over the latent grid, cross-attention
    # to 77 CLIP tokens. Batch 2: classifier-free guidance runs both prompts in one batch.
    w, h = (width, height) if width else WORKLOADS["sd15"].resolutions[0]
    lw, lh = w // 8, h // 8
    out = []
    for level, d in enumerate((40, 80, 160)):
        s = _halvings(lw, level) * _halvings(lh, level)
        out.append(shape(f"sd15-{w}x{h}-l{level + 1}-self-d{d}", 2, 8, 8, s, s, d, False, "fp16"))
        out.append(
            shape(
                f"sd15-{w}x{h}-l{level + 1}-cross-d{d}", 2, 8, 8, s, CLIP_TOKENS, d, False, "fp16"
            )
        )
    return out


def _sdxl(width: int | None, height: int | None) -> list[dict]:
    # Head dim 64 everywhere; 10 heads at the 640-channel level (latent / 2), 20 heads at the
    # 1280-channel level (latent / 4); the 320-channel level has no attention.
    w, h = (width, height) if width else WORKLOADS["sdxl"].resolutions[0]
    lw, lh = w // 8, h // 8
    out = []
    for level, heads in ((1, 10), (2, 20)):
        s = _halvings(lw, level) * _halvings(lh, level)
        tag = f"sdxl-{w}x{h}-l{level + 1}"
        out.append(shape(f"{tag}-self-h{heads}", 2, heads, heads, s, s, 64, False, "fp16"))
        out.append(
            shape(f"{tag}-cross-h{heads}", 2, heads, heads, s, CLIP_TOKENS, 64, False, "fp16")
        )
    return out


def _llm(width: int | None, height: int | None) -> list[dict]:
    # Causal GQA prefill, head dim 128: Llama-3-8B's 32 query / 8 key-value heads, and a wider
    # 64 / 8 model at batch 8 (two causal rows of AITER's MHA benchmark table).
    return [
        shape("llm-gqa-b1-h32-kv8-s1024-causal", 1, 32, 8, 1024, 1024, 128, True, "bf16"),
        shape("llm-gqa-b8-h64-kv8-s4096-causal", 8, 64, 8, 4096, 4096, 128, True, "bf16"),
    ]


# ViT encoders: patch 14, non-causal self-attention over the patch grid (plus a class token where
# the model has one), batch 1. Head dims 72 and 80 are the sizes reported to fall back to math
# on gfx1151 (ROCm/ATOM#1357, aiter#4065's head-dim-tiled kernel).
VIT_PATCH = 14
VIT_MODELS = (
    # (head dim, heads, class token, model)
    (72, 16, False, "siglip-so400m"),
    (80, 16, True, "vit-h14"),
)


def _vit(width: int | None, height: int | None) -> list[dict]:
    sizes = [(width, height)] if width else list(WORKLOADS["vit"].resolutions)
    out = []
    for w, h in sizes:
        patches = (w // VIT_PATCH) * (h // VIT_PATCH)
        for d, heads, cls, model in VIT_MODELS:
            s = patches + (1 if cls else 0)
            out.append(shape(f"vit-{w}x{h}-{model}-d{d}", 1, heads, heads, s, s, d, False, "fp16"))
    return out


WORKLOADS: dict[str, Workload] = {
    "qwen-image": Workload(
        "qwen-image",
        "Qwen-Image MMDiT joint text+image attention: 24 heads x 128, non-causal, "
        f"{QWEN_TEXT_TOKENS} text + (H/16)*(W/16) image tokens",
        (
            "huggingface/diffusers src/diffusers/models/transformers/transformer_qwenimage.py "
            "(QwenDoubleStreamAttnProcessor2_0: cat([txt, img]), is_causal=False) and "
            "src/diffusers/pipelines/qwenimage/pipeline_qwenimage.py (vae_scale_factor 8, "
            "2x2 packing, prompt_template_encode_start_idx=34), commit 58eb52c0, 2026-08-23; "
            "https://github.com/huggingface/diffusers",
            "Qwen/Qwen-Image transformer/config.json (num_attention_heads 24, attention_head_dim "
            "128); https://huggingface.co/Qwen/Qwen-Image",
            "QwenLM/Qwen-Image README.md, aspect_ratios (1:1 1328x1328, 16:9 1664x928); "
            "https://github.com/QwenLM/Qwen-Image",
        ),
        ((1664, 928), (1328, 1328)),
        _qwen_image,
    ),
    "sd15": Workload(
        "sd15",
        "Stable Diffusion 1.5 UNet: 8 heads, head dims 40/80/160, self-attention and "
        f"{CLIP_TOKENS}-token cross-attention, batch 2 (CFG)",
        (
            "stable-diffusion-v1-5/stable-diffusion-v1-5 (formerly runwayml/) unet/config.json (attention_head_dim 8, "
            "block_out_channels [320, 640, 1280, 1280], cross_attention_dim 768); "
            "https://huggingface.co/stable-diffusion-v1-5/stable-diffusion-v1-5",
            "huggingface/diffusers src/diffusers/models/unets/unet_2d_condition.py "
            "(attention_head_dim is the number of heads), commit 58eb52c0, 2026-08-23; "
            "https://github.com/huggingface/diffusers",
        ),
        ((512, 512),),
        _sd15,
    ),
    "sdxl": Workload(
        "sdxl",
        "Stable Diffusion XL UNet: head dim 64, 10 and 20 heads, self-attention and "
        f"{CLIP_TOKENS}-token cross-attention, batch 2 (CFG)",
        (
            "stabilityai/stable-diffusion-xl-base-1.0 unet/config.json (attention_head_dim "
            "[5, 10, 20], block_out_channels [320, 640, 1280]); "
            "https://huggingface.co/stabilityai/stable-diffusion-xl-base-1.0",
            "Stability-AI/generative-models configs/inference/sd_xl_base.yaml "
            "(num_head_channels 64, transformer_depth [0, 2, 10]); "
            "https://github.com/Stability-AI/generative-models",
        ),
        ((1024, 1024),),
        _sdxl,
    ),
    "llm": Workload(
        "llm",
        "LLM prefill: causal GQA, head dim 128 (32/8 heads at 1k, 64/8 heads x batch 8 at 4k)",
        (
            "ROCm/aiter op_tests/cpp/mha/README.md, commit 0403bcdf: BF16 hd128 GQA rows "
            "(B1 Hq32 Hkv8 S1024 causal; B8 Hq64 Hkv8 S4096 causal); https://github.com/ROCm/aiter",
            "meta-llama/Meta-Llama-3-8B config.json (num_attention_heads 32, "
            "num_key_value_heads 8, hidden_size 4096); https://huggingface.co/meta-llama/Meta-Llama-3-8B",
        ),
        (),
        _llm,
    ),
}
WORKLOADS["flux"] = Workload(
    "flux",
    "FLUX.1-dev MMDiT joint text+image attention: 24 heads x 128, non-causal, bf16, "
    f"{FLUX_TEXT_TOKENS} text + (H/16)*(W/16) image tokens",
    (
        "black-forest-labs/flux src/flux/util.py (flux-dev: hidden_size 3072, num_heads 24) and "
        "src/flux/cli.py (load_t5(max_length=256 if is_schnell else 512)), read 2026-12-04; "
        "https://github.com/black-forest-labs/flux",
        "Comfy-Org/ComfyUI#14249 (2026-06-05, bf16 NaN through SDPA's efficient backend on "
        "gfx1151) and #14379 (2026-06-10, NaN on gfx1201); https://github.com/Comfy-Org/ComfyUI",
    ),
    ((1024, 1024),),
    _flux,
)
WORKLOADS["vit"] = Workload(
    "vit",
    "ViT image encoders, patch 14, batch 1, fp16: SigLIP so400m (16 heads x 72, no class token) "
    "and ViT-H/14 (16 heads x 80, class token) at 224 and 336 px",
    (
        "google/siglip-so400m-patch14-384 config.json (vision hidden_size 1152, "
        "num_attention_heads 16, patch_size 14); https://huggingface.co/google/siglip-so400m-patch14-384",
        "laion/CLIP-ViT-H-14-laion2B-s32B-b79K config.json (vision hidden_size 1280, "
        "num_attention_heads 16, patch_size 14); https://huggingface.co/laion/CLIP-ViT-H-14-laion2B-s32B-b79K",
        "ROCm/ATOM#1357 and ROCm/aiter#4065: ViT head dim 72 falls back to math on gfx1151; "
        "https://github.com/ROCm/aiter/issues/4065",
    ),
    ((224, 224), (336, 336)),
    _vit,
)
CUSTOM = "custom"


def _with_resolutions() -> str:
    return ", ".join(n for n, wl in WORKLOADS.items() if wl.resolutions)


def names() -> list[str]:
    """Every workload name, ``custom`` last."""
    return [*WORKLOADS, CUSTOM]


def parse_resolution(text: str) -> tuple[int, int]:
    """'1664x928' -> (1664, 928)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text or "")
    if not m or int(m.group(1)) <= 0 or int(m.group(2)) <= 0:
        raise WorkloadError(f"--resolution {text!r} is not WIDTHxHEIGHT, e.g. 1664x928.")
    return int(m.group(1)), int(m.group(2))


def parse_shape(text: str, dtype: str = "bf16") -> dict:
    """'b,h,hkv,sq,sk,d[,causal]' -> a shape dict (causal: 1/0, true/false, causal)."""
    parts = [p.strip() for p in (text or "").split(",")]
    if len(parts) not in (6, 7):
        raise WorkloadError(
            f"--shape {text!r} needs b,h,hkv,sq,sk,d[,causal], e.g. 1,24,24,6132,6132,128."
        )
    try:
        b, h, hkv, sq, sk, d = (int(p) for p in parts[:6])
    except ValueError:
        raise WorkloadError(f"--shape {text!r}: the first six fields must be integers.") from None
    causal = False
    if len(parts) == 7:
        flag = parts[6].lower()
        if flag not in ("0", "1", "true", "false", "causal", "noncausal"):
            raise WorkloadError(f"--shape {text!r}: causal is 1/0, true/false or causal/noncausal.")
        causal = flag in ("1", "true", "causal")
    if min(b, h, hkv, sq, sk, d) <= 0:
        raise WorkloadError(f"--shape {text!r}: every size must be at least 1.")
    if h % hkv:
        raise WorkloadError(f"--shape {text!r}: h ({h}) must be a multiple of hkv ({hkv}).")
    tag = f"custom-b{b}-h{h}-kv{hkv}-q{sq}-k{sk}-d{d}" + ("-causal" if causal else "")
    return shape(tag, b, h, hkv, sq, sk, d, causal, dtype)


def shapes(
    name: str,
    resolution: str | tuple[int, int] | None = None,
    *,
    custom: str | None = None,
    dtype: str | None = None,
) -> list[dict]:
    """The shape dicts of workload ``name`` (at ``resolution`` 'WxH' where it takes one; without
    it, the workload's default resolutions). ``custom`` is the 'b,h,hkv,sq,sk,d[,causal]' text
    of the custom workload; ``dtype`` overrides the workload's own. Raises WorkloadError."""
    if dtype is not None and dtype not in DTYPES:
        raise WorkloadError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}.")
    if name == CUSTOM:
        if resolution is not None:
            raise WorkloadError(
                f"--resolution applies to {_with_resolutions()}; custom takes --shape."
            )
        if not custom:
            raise WorkloadError("the custom workload needs --shape b,h,hkv,sq,sk,d[,causal].")
        return [parse_shape(custom, dtype or "bf16")]
    if custom:
        raise WorkloadError(f"--shape is for --workload custom, not {name}.")
    wl = WORKLOADS.get(name)
    if wl is None:
        raise WorkloadError(f"unknown workload {name!r}; choose one of {', '.join(names())}.")
    width = height = None
    if resolution is not None:
        if not wl.resolutions:
            raise WorkloadError(
                f"--resolution applies to {_with_resolutions()}, not {name} (its shapes are fixed)."
            )
        width, height = parse_resolution(resolution) if isinstance(resolution, str) else resolution
        step = 16 if name in ("qwen-image", "flux") else 8
        if width < 64 or height < 64 or width % step or height % step:
            raise WorkloadError(
                f"{name} needs a width and height that are multiples of {step} and at least 64, "
                f"not {width}x{height}."
            )
    out = wl.make(width, height)
    if dtype is not None:
        out = [{**s, "dtype": dtype} for s in out]
    return out


def tiny(s: dict) -> dict:
    """The same shape shrunk for CPU runs and tests: batch 1, 2 heads (GQA: one key/value head and
    up to 8 query heads), sequence lengths scaled to at most 64 with Sq != Sk kept; head dim,
    causality and dtype unchanged."""
    rep = s["h"] // s["hkv"]
    h, hkv = (min(s["h"], 2), min(s["h"], 2)) if rep == 1 else (min(rep, 8), 1)
    factor = min(1.0, TINY_SEQ / max(s["sq"], s["sk"]))

    def seq(n: int) -> int:
        return n if n <= TINY_MIN_SEQ else max(TINY_MIN_SEQ, round(n * factor))

    return {
        **s,
        "name": s["name"] + "-tiny",
        "b": 1,
        "h": h,
        "hkv": hkv,
        "sq": seq(s["sq"]),
        "sk": seq(s["sk"]),
    }


def flops(s: dict, mode: str = "fwd") -> float:
    """flash-attention's FLOP count: 4*b*sq*sk*h*d, halved when causal; x2.5 bwd, x3.5 fwd_bwd."""
    f = 4.0 * s["b"] * s["sq"] * s["sk"] * s["h"] * s["d"] / (2 if s["causal"] else 1)
    return f * {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}[mode]
