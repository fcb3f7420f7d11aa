"""The applications' own attention code, run in the image (``python -m validate apps``).

PyTorch's SDPA working is not the same as transformers' or diffusers' attention working: each
app picks its implementation itself, checks its own preconditions and calls SDPA or flash_attn
its own way. So tiny random-weight models are built *from configs* (no hub download) and run
once per attention implementation the image offers, forward and, where training matters,
backward, with each output and gradient judged against the app's eager/math path by the grid's
rule (``validate.checks.numerics.judge``: fp32 eager is the reference, the same eager path in
bf16 sets the allowed error). Per implementation the check reports whether it ran, whether it
is correct, which kernel ran (profiler op names, the SDPA shim's routing counts) and the app's
or PyTorch's reason where it refused.

The models (one table, ``MODELS``): a 2-layer Llama-style decoder with grouped-query attention
and a tiny ViT (transformers: ``attn_implementation`` eager, sdpa, flash_attention_2); the
attention block of a Stable Diffusion UNet (diffusers ``Transformer2DModel`` with
``AttnProcessor`` / ``AttnProcessor2_0``); diffusers' ``QwenImageTransformer2DModel`` (the code
path of the Qwen-Image crash reports) over its attention backends. Each SDPA-based
implementation runs once more with the bundled kernels' SDPA shim on
(``attnforge_kernels.sdpa_shim``).

A refusal fails the check only where the implementation must run: SDPA always, and
flash_attn-based ones where flash_attn is installed and a GPU is present (vLLM fell back
silently where its flash_attn probe failed, vllm#50449).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Nothing here may reach a model hub: the models are built from configs.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
DTYPE = "bf16"
SEED = 0


@dataclass(frozen=True)
class Impl:
    """One attention implementation of an app: ``name`` as the app spells it; ``shim``: run
    with the bundled kernels' SDPA shim on; ``needs``: the module it needs (flash_attn);
    ``always``: it must run wherever the app is installed (SDPA); ``reference``: the eager/math
    path the others are judged against."""

    name: str
    shim: bool = False
    needs: str | None = None
    always: bool = False
    reference: bool = False

    @property
    def label(self) -> str:
        return f"{self.name}+shim" if self.shim else self.name


@dataclass(frozen=True)
class AppModel:
    """A tiny model built from a config, and the implementations it is run with."""

    name: str
    app: str  # the distribution (transformers, diffusers)
    title: str
    impls: tuple[Impl, ...]
    backward: bool
    why: str
    min_version: str | None = None  # of the app, where the model class is newer
    extra: dict[str, Any] = field(default_factory=dict)


_TF_IMPLS = (
    Impl("eager", reference=True),
    Impl("sdpa", always=True),
    Impl("sdpa", shim=True),
    Impl("flash_attention_2", needs="flash_attn"),
)
_PROCESSORS = (
    Impl("AttnProcessor", reference=True),
    Impl("AttnProcessor2_0", always=True),
    Impl("AttnProcessor2_0", shim=True),
)
_BACKENDS = (
    Impl("_native_math", reference=True),
    Impl("native", always=True),
    Impl("native", shim=True),
    Impl("_native_flash"),
    Impl("_native_efficient"),
    Impl("flash", needs="flash_attn"),
    Impl("flash_varlen", needs="flash_attn"),
)

MODELS: tuple[AppModel, ...] = (
    AppModel("llama-gqa", "transformers", "2-layer Llama decoder, GQA 4:2", _TF_IMPLS, True,
             "LLM training and inference in transformers; grouped-query attention"),
    AppModel("vit", "transformers", "2-layer ViT, 32 px, 8 px patches", _TF_IMPLS, True,
             "vision encoders (ViT, CLIP, SigLIP) run the same attention classes"),
    AppModel("unet-attn", "diffusers", "SD UNet attention block (Transformer2DModel)",
             _PROCESSORS, True,
             "Stable Diffusion 1.5/XL UNets: self- and cross-attention through attention processors"),
    AppModel("qwen-image", "diffusers", "QwenImageTransformer2DModel, 2 layers", _BACKENDS,
             False, "the Qwen-Image DiT of the 2026 crash reports, over diffusers' attention "
             "backends (dispatch_attention_fn)", min_version="0.35"),
)  # fmt: skip
BY_NAME = {m.name: m for m in MODELS}


class Refused(Exception):
    """The app (or PyTorch) would not run this implementation; the message is its reason."""


# ---------------------------------------------------------------------------- models


def _seeded(torch):
    torch.manual_seed(SEED)
    return torch.Generator().manual_seed(SEED)


def _llama(torch, tf):
    cfg = tf.LlamaConfig(
        vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=64,
        attn_implementation="eager", tie_word_embeddings=False,
    )  # fmt: skip
    _seeded(torch)
    model = tf.LlamaModel(cfg).eval()
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(2, 32, 128, generator=gen)

    def inputs(dtype):
        return {"inputs_embeds": x.to(dtype)}

    def output(model, inp):
        return model(**inp, use_cache=False).last_hidden_state

    return model, inputs, output, "inputs_embeds", ("q_proj.weight",)


def _vit(torch, tf):
    cfg = tf.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        image_size=32, patch_size=8, num_channels=3, attn_implementation="eager",
    )  # fmt: skip
    _seeded(torch)
    model = tf.ViTModel(cfg, add_pooling_layer=False).eval()
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(2, 3, 32, 32, generator=gen)

    def inputs(dtype):
        return {"pixel_values": x.to(dtype)}

    def output(model, inp):
        return model(**inp).last_hidden_state

    return model, inputs, output, "pixel_values", ("q_proj.weight", "query.weight")


def _unet_attn(torch, df):
    _seeded(torch)
    model = df.Transformer2DModel(
        num_attention_heads=2, attention_head_dim=32, in_channels=64, norm_num_groups=8,
        cross_attention_dim=32, num_layers=1,
    ).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(SEED + 1)
    x = torch.randn(2, 64, 8, 8, generator=gen)
    text = torch.randn(2, 8, 32, generator=gen)

    def inputs(dtype):
        return {"hidden_states": x.to(dtype), "encoder_hidden_states": text.to(dtype)}

    def output(model, inp):
        return model(**inp).sample

    return model, inputs, output, "hidden_states", ("to_q.weight",)


def _qwen_image(torch, df):
    _seeded(torch)
    model = df.QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=32,
        num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(8, 12, 12),
    ).eval()  # fmt: skip
    gen = torch.Generator().manual_seed(SEED + 1)
    img = torch.randn(1, 16, 16, generator=gen)  # 4x4 packed latent patches
    txt = torch.randn(1, 8, 32, generator=gen)

    def inputs(dtype):
        return {
            "hidden_states": img.to(dtype),
            "encoder_hidden_states": txt.to(dtype),
            "encoder_hidden_states_mask": None,
            "timestep": torch.tensor([0.5], dtype=dtype),
            "img_shapes": [(1, 4, 4)],
        }

    def output(model, inp):
        return model(**inp).sample

    return model, inputs, output, None, None


BUILDERS: dict[str, Callable[..., Any]] = {
    "llama-gqa": _llama,
    "vit": _vit,
    "unet-attn": _unet_attn,
    "qwen-image": _qwen_image,
}


# ---------------------------------------------------------------------------- implementations


def _select(spec: AppModel, model, impl: Impl) -> None:
    """Switch ``model`` to ``impl`` the way a user of the app does; Refused with the app's
    reason where it will not."""
    try:
        if spec.app == "transformers":
            model.set_attn_implementation(impl.name)
            got = model.config._attn_implementation
            if got != impl.name:
                raise Refused(f"transformers kept attn_implementation {got!r}")
        elif spec.name == "unet-attn":
            import diffusers.models.attention_processor as ap

            blocks = [m for m in model.modules() if isinstance(m, ap.Attention)]
            for block in blocks:
                block.set_processor(getattr(ap, impl.name)())
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.set_attention_backend(impl.name)
    except Refused:
        raise
    except Exception as exc:  # noqa: BLE001 - the app's refusal, in its own words
        raise Refused(_first_line(exc)) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text.splitlines()[0][:400]}"


def _first_attention(model):
    """The first attention module of a model: the first whose class name ends in Attention and
    that holds no other such module (LlamaAttention, ViTSelfAttention, diffusers' Attention)."""

    def is_attn(m) -> bool:
        return type(m).__name__.endswith("Attention")

    for m in model.modules():
        if is_attn(m) and not any(is_attn(c) for c in m.modules() if c is not m):
            return m
    return None


def _run(torch, spec: AppModel, model, inputs, output, grad_input, grad_param, dtype):
    """Forward (and backward) once: {"attn": the first attention layer's output, "out": the
    model's, "d_<input>": ..., "d_<param>": ...}. The first attention layer is judged on its
    own too: a deep model's residual stream can dilute a wrong attention below the rule."""
    inp = inputs(dtype)
    if spec.backward and grad_input:
        inp[grad_input] = inp[grad_input].clone().requires_grad_(True)
    seen: dict[str, Any] = {}

    def hook(_module, _args, result):
        first = result[0] if isinstance(result, (tuple, list)) else result
        seen.setdefault("attn", first.detach().clone())

    layer = _first_attention(model)
    handle = layer.register_forward_hook(hook) if layer is not None else None
    try:
        with torch.set_grad_enabled(spec.backward):
            out = output(model, inp)
    finally:
        if handle is not None:
            handle.remove()
    got = {**seen, "out": out.detach()}
    if spec.backward:
        gen = torch.Generator().manual_seed(SEED + 2)
        g = torch.randn(out.shape, generator=gen).to(device=out.device, dtype=out.dtype)
        # The first attention layer's query projection: its gradient flows through the
        # attention backward (names differ between app versions, hence the suffixes).
        name, param = next((n, p) for n, p in model.named_parameters() if n.endswith(grad_param))
        d_in, d_param = torch.autograd.grad(out, (inp[grad_input], param), g)
        got[f"d_{grad_input}"] = d_in
        got[f"d_{name.rsplit('.', 2)[-2]}"] = d_param
    return got


def _kernel(sdpa, ops: list[str], kernels: list[str], impl: Impl, shim_stats) -> str:
    """Which attention kernel ran, in words, from the profile and the shim's counts."""
    parts = []
    if shim_stats is not None:
        routed, fallback = shim_stats["routed"], shim_stats["fallback"]
        reasons = ", ".join(f"{k} x{v}" for k, v in sorted(shim_stats["reasons"].items()))
        parts.append(
            f"bundled kernels: {routed} call(s) routed, {fallback} fell back"
            + (f" ({reasons})" if reasons else "")
        )
    backend = sdpa.backend_from_ops(ops)
    if backend:
        parts.append(f"SDPA {backend} ({', '.join(o.split('::')[-1] for o in ops[:2])})")
    elif ops:
        parts.append(", ".join(o.split("::")[-1] for o in ops[:3]))
    if kernels:
        parts.append("kernels: " + ", ".join(k[:80] for k in kernels[:2]))
    if not parts:
        parts.append("no fused attention op (eager matmul + softmax)")
    return "; ".join(parts)


def _must_run(impl: Impl, gpu: bool) -> bool:
    if impl.always or impl.reference:
        return True
    if impl.needs:
        return gpu and importlib.util.find_spec(impl.needs) is not None
    return False


def _interpret_without_gpu(torch) -> bool:
    """The bundled kernels run in Triton's interpreter where there is no GPU (as the kernels
    checks do); set before the kernels are first imported in this process."""
    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True


# What each model's builder reaches in its app (attribute access imports transformers' and
# diffusers' lazy submodules): imported ahead by warm_up.
WARM_UP_NAMES = {
    "llama-gqa": ("LlamaConfig", "LlamaModel"),
    "vit": ("ViTConfig", "ViTModel"),
    "unet-attn": ("Transformer2DModel", "models.attention_processor"),
    "qwen-image": ("QwenImageTransformer2DModel", "models.attention_processor"),
}


def warm_up(params: dict[str, Any]) -> None:
    """Run ahead in the apps checks' worker while the checks before them use the device
    (validate/pool.py ``start_early``): the apps' imports (several seconds each), the bundled
    kernels' SDPA shim and the device context, set up as :func:`run` sets them up. What fails
    here is left to the checks, which report it."""
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    import torch

    _interpret_without_gpu(torch)
    for name in params.get("models", []):
        spec = BY_NAME[name]
        if importlib.util.find_spec(spec.app) is None:
            continue
        app = importlib.import_module(spec.app)
        for attr in WARM_UP_NAMES.get(name, ()):
            if attr.startswith("models."):
                importlib.import_module(f"{spec.app}.{attr}")
            else:
                getattr(app, attr)
    if importlib.util.find_spec("attnforge_kernels") is not None:
        importlib.import_module("attnforge_kernels.sdpa_shim")
    if torch.cuda.is_available():
        torch.zeros(1, device="cuda")


# ---------------------------------------------------------------------------- where kernels come from
#
# transformers 5.25 (2026-12-01) makes Hugging Face's `kernels` a dependency and, with
# USE_HUB_KERNELS defaulting to yes, lets `attn_implementation="flash_attention_2"` fall back to
# `kernels.get_kernel("kernels-community/flash-attn2")`: a kernel downloaded at run time, which
# the image never validated (transformers integrations/hub_kernels.py, the 5.25.0 wheel). The
# check runs every implementation with the network off and any Hub kernel fetch refused, and
# says where each implementation's attention kernel came from.

HUB_SWITCH = "USE_HUB_KERNELS"  # transformers' switch; NO turns Hub kernels off
_OFF = {"0", "NO", "FALSE", "OFF"}


class NetworkOff:
    """While entered: connections to anything but this host are refused and recorded, and so
    are Hub kernel fetches (``kernels.get_kernel``, wherever a module bound it), recorded with
    the repository asked for. Restores everything on exit."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.hub: list[str] = []
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> NetworkOff:
        import socket

        real_connect = socket.socket.connect

        def connect(sock, address):
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address):
                self.attempts.append(f"{address[0]}:{address[1]}")
                raise OSError(f"validate runs the apps with the network off ({address[0]})")
            return real_connect(sock, address)

        self._swap(socket.socket, "connect", connect)
        self._watch_hub()
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, value in reversed(self._undo):
            setattr(owner, name, value)
        self._undo.clear()

    def _swap(self, owner, name: str, value) -> None:
        self._undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _watch_hub(self) -> None:
        import sys

        if "kernels" not in sys.modules and importlib.util.find_spec("kernels") is not None:
            importlib.import_module("kernels")  # bind the Hub API before the app looks it up
        hub = sys.modules.get("kernels")
        original = getattr(hub, "get_kernel", None)
        if original is None:  # no Hugging Face `kernels` API imported in this process
            return

        def get_kernel(repo_id, *args, **kwargs):
            self.hub.append(str(repo_id))
            raise RuntimeError(
                f"validate refused to fetch the Hub kernel {repo_id}: a validated image runs "
                "only the kernels it holds"
            )

        for module in list(sys.modules.values()):  # `from kernels import get_kernel as ...`
            for name, value in list(getattr(module, "__dict__", {}).items()):
                if value is original:
                    self._swap(module, name, get_kernel)


def _loopback(address) -> bool:
    host = str(address[0]) if isinstance(address, tuple) and address else ""
    return host in ("localhost", "::1") or host.startswith("127.")


def hub_setting(environ: dict[str, str]) -> dict[str, Any]:
    """What the image's environment says of Hub kernels, as the check found it."""
    value = environ.get(HUB_SWITCH)
    return {"variable": HUB_SWITCH, "value": value, "off": (value or "").upper() in _OFF}


def kernel_source(torch, spec: AppModel, impl: Impl, ran: bool, hub: list[str]) -> str:
    """Where an implementation's attention kernel came from, in words."""
    if hub:
        return f"a Hub kernel ({', '.join(dict.fromkeys(hub))})"
    if not ran:
        return "none (refused)"
    if impl.needs == "flash_attn":
        import sys

        fa = sys.modules.get("flash_attn")
        where = getattr(fa, "__file__", None) or "?"
        return f"the image's flash_attn {getattr(fa, '__version__', '?')} ({where})"
    if impl.shim:
        return "the bundled kernels (attnforge_kernels.sdpa_shim) behind torch's SDPA"
    if impl.reference and impl.name != "_native_math":
        return f"{spec.app} eager attention (matmul + softmax)"
    return f"torch's SDPA (torch {torch.__version__})"


# ---------------------------------------------------------------------------- the check


@dataclass
class _Setup:
    """What every implementation of one app model is run and judged with."""

    torch: Any
    spec: AppModel
    sdpa: Any
    numerics: Any
    interpret: bool
    gpu: bool
    device: str
    dt: Any
    low: Any  # the model in DTYPE with the reference implementation
    inputs: Callable[..., Any]
    output: Callable[..., Any]
    grad: tuple[Any, Any]  # (input name, parameter suffix)
    reference: Impl
    ref: dict[str, Any]
    ref_lp: dict[str, Any]

    def forward(self, model, dtype):
        return _run(self.torch, self.spec, model, self.inputs, self.output, *self.grad, dtype)


def run(params: dict[str, Any], ctx) -> dict[str, Any]:
    """One app model under every implementation its app offers here, with the network off."""
    spec = BY_NAME[params["model"]]
    hub = hub_setting(dict(os.environ))  # the image's own, before this check sets anything
    for k, v in OFFLINE_ENV.items():
        os.environ.setdefault(k, v)
    if importlib.util.find_spec(spec.app) is None:
        return {
            "status": "skip",
            "message": f"{spec.app} is not installed (a stack includes the apps layer to have it)",
            "details": {"app": spec.app, "model": spec.name},
        }
    import torch

    app, version, details = _import_app(spec, ctx)
    details["hub_kernels"] = hub
    if spec.min_version and _older(version, spec.min_version):
        return {
            "status": "skip",
            "message": f"{spec.app} {version} predates {spec.title.split(',')[0]} "
            f"({spec.min_version})",
            "details": details,
        }
    setup = _setup(torch, spec, app, ctx)
    failures: list[str] = []
    for impl in spec.impls:
        ctx.progress(f"{spec.name}: {impl.label}")
        row, problems = _run_impl(setup, impl)
        details["implementations"].append(row)
        failures += problems
    return _verdict(spec, version, setup.reference, details, failures)


def _import_app(spec: AppModel, ctx) -> tuple[Any, str, dict[str, Any]]:
    ctx.progress(f"import {spec.app}")
    app = importlib.import_module(spec.app)
    try:  # the apps' info logs ("attention backends are experimental") are noise here
        importlib.import_module(f"{spec.app}.utils.logging").set_verbosity_error()
    except (ImportError, AttributeError):
        pass
    version = str(getattr(app, "__version__", "?"))
    details: dict[str, Any] = {
        "app": spec.app, "app_version": version, "model": spec.name, "title": spec.title,
        "why": spec.why, "backward": spec.backward, "dtype": DTYPE, "implementations": [],
    }  # fmt: skip
    return app, version, details


def _setup(torch, spec: AppModel, app, ctx) -> _Setup:
    """The model built from its config, on the device, and the reference outputs: the eager or
    math path in fp32 and in DTYPE (numerics.judge's rule)."""
    from validate.checks import numerics, sdpa

    interpret = _interpret_without_gpu(torch)
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    ctx.progress(f"build {spec.name} from its config")
    base, make, output, grad_input, grad_param = BUILDERS[spec.name](torch, app)
    base = base.to(device)

    def inputs(dtype):
        inp = make(dtype)
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inp.items()}

    reference = next(i for i in spec.impls if i.reference)
    dt = numerics.torch_dtype(DTYPE)
    ctx.progress(f"{spec.name}: reference {reference.name} in fp32 and {DTYPE}")
    setup = _Setup(torch, spec, sdpa, numerics, interpret, gpu, device, dt, None, inputs, output,
                   (grad_input, grad_param), reference, {}, {})  # fmt: skip
    ref_model = copy.deepcopy(base)
    _select(spec, ref_model, reference)
    setup.ref = setup.forward(ref_model, torch.float32)
    setup.low = copy.deepcopy(base).to(dt)
    _select(spec, setup.low, reference)
    setup.ref_lp = setup.forward(setup.low, dt)
    return setup


def _run_impl(setup: _Setup, impl: Impl) -> tuple[dict[str, Any], list[str]]:
    """One implementation, with the network off: its row of the report and what failed."""
    row: dict[str, Any] = {
        "impl": impl.label, "reference": impl.reference, "must_run": _must_run(impl, setup.gpu),
        "ran": False, "correct": None, "kernel": None, "source": None, "reason": None,
        "judgements": {},
    }  # fmt: skip
    model, shim, seen, got = copy.deepcopy(setup.low), None, [], {}
    failures: list[str] = []
    with NetworkOff() as net:
        try:
            _select(setup.spec, model, impl)
            if impl.shim:
                shim = importlib.import_module("attnforge_kernels.sdpa_shim")
                shim.reset_stats()
                shim.enable()
            with setup.sdpa.captured_warnings() as seen:
                kernels, ops = setup.sdpa.profile_kernels(
                    setup.torch, lambda: got.update(setup.forward(model, setup.dt)), setup.device
                )
        except Refused as exc:
            row["reason"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - a refusal at run time, with PyTorch's reason
            why = [w for w in dict.fromkeys(seen) if _is_reason(w)]
            row["reason"] = _first_line(exc) + (f" ({'; '.join(why[:3])})" if why else "")
        else:
            row["ran"] = True
            failures += _judge_row(setup, impl, row, got, ops, kernels, shim)
        finally:
            if shim is not None:
                shim.disable()
    row["source"] = kernel_source(setup.torch, setup.spec, impl, row["ran"], net.hub)
    failures += network_failures(impl, net, hub_setting(dict(os.environ))["off"])
    if not row["ran"] and row["must_run"]:
        failures.append(f"{impl.label} refused where it must run: {row['reason']}")
    return row, failures


def _judge_row(setup: _Setup, impl: Impl, row, got, ops, kernels, shim) -> list[str]:
    stats = shim.stats() if shim else None
    row["kernel"] = _kernel(setup.sdpa, ops, kernels, impl, stats)
    if stats is not None:
        row["shim"] = stats
        if setup.interpret and stats["routed"]:
            row["kernel"] += " (Triton interpreter)"
    verdicts = {k: setup.numerics.judge(got[k], setup.ref[k], setup.ref_lp[k]) for k in setup.ref}
    row["judgements"] = {k: j.to_json() for k, j in verdicts.items()}
    row["correct"] = all(j.ok for j in verdicts.values())
    if row["correct"]:
        return []
    bad = [f"{k}: {j.message}" for k, j in verdicts.items() if not j.ok]
    return [f"{impl.label} diverges from {setup.reference.name} ({'; '.join(bad)})"]


def network_failures(impl: Impl, net: NetworkOff, switch_off: bool = False) -> list[str]:
    """The run's Hub fetches and network reaches as failures. ``switch_off``: the environment
    already says USE_HUB_KERNELS=NO, so naming it would be no remedy: transformers 5.25.0 takes
    its flash_attention_2 fallback whenever flash_attn is missing and Hugging Face's `kernels`
    is installed, without reading the switch (modeling_utils.py,
    _check_and_adjust_attn_implementation; the switch gates only integrations/hub_kernels.py's
    kernel mapping)."""
    out = []
    if net.hub:
        remedy = (
            f"although {HUB_SWITCH}=NO, which does not gate this fallback: install the image's "
            "own flash_attn, or keep transformers below 5.25 (whose `kernels` is optional)"
            if switch_off
            else f"instead of the image's: set {HUB_SWITCH}=NO in the image's environment"
        )
        out.append(
            f"{impl.label} fell back to a Hub kernel ({', '.join(dict.fromkeys(net.hub))}) {remedy}"
        )
    if net.attempts:
        out.append(
            f"{impl.label} reached for the network ({', '.join(dict.fromkeys(net.attempts))}); "
            "a validated image runs offline"
        )
    return out


def _verdict(spec: AppModel, version: str, reference: Impl, details, failures) -> dict[str, Any]:
    ran = [r for r in details["implementations"] if r["ran"]]
    refused = [r["impl"] for r in details["implementations"] if not r["ran"]]
    obs = {f"apps.{spec.name}.works": not failures}
    if failures:
        return {
            "status": "fail",
            "message": f"{spec.app} {version} {spec.name}: " + "; ".join(failures),
            "observations": obs,
            "details": details,
        }
    summary = (
        f"{spec.app} {version}: {len(ran)} implementation(s) ran and matched "
        f"{reference.name}" + (f"; refused: {', '.join(refused)}" if refused else "")
    )
    return {"status": "pass", "message": summary, "observations": obs, "details": details}


def _is_reason(line: str) -> bool:
    """A captured line that explains a refusal (PyTorch's TORCH_WARN text), not profiler or
    deprecation noise."""
    low = line.lower()
    noise = ("profiler", "usdt", "deprecat", "futurewarning", "experimental feature")
    return bool(line.strip()) and not any(n in low for n in noise)


def _older(version: str, minimum: str) -> bool:
    def nums(v: str) -> tuple[int, ...]:
        out = []
        for part in v.split(".")[:3]:
            digits = "".join(ch for ch in part if ch.isdigit())
            out.append(int(digits or 0))
        return tuple(out)

    return nums(version) < nums(minimum)
