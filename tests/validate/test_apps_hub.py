"""Apps that fetch kernels: `validate apps` runs every implementation with the network off,
refuses and records any Hub kernel fetch (Hugging Face's `kernels.get_kernel`, which
transformers 5.25 falls back to for flash_attention_2 while USE_HUB_KERNELS is yes), and says
where each implementation's attention kernel came from. The unit tests plant a stand-in
`kernels` package in a temp folder; the run at the end plants the fallback in transformers."""

from __future__ import annotations

import importlib
import socket
import sys
import types

import pytest

from validate.checks import apps

STANDIN = """
CALLS = []

def get_kernel(repo_id, revision=None, version=None, **kwargs):
    CALLS.append(repo_id)  # the real one downloads the repository from the Hub here
    return None
"""


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A stand-in for Hugging Face's `kernels` (the bundled kernels import as
    `attnforge_kernels`), and a module that bound its get_kernel at import, as transformers'
    integrations/hub_kernels.py does (`from kernels import get_kernel as get_kernel_hub`)."""
    pkg = tmp_path / "site" / "kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STANDIN)
    (tmp_path / "site" / "consumer.py").write_text(
        "from kernels import get_kernel as get_kernel_hub\n"
    )
    for name in ("kernels", "consumer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    hub = importlib.import_module("kernels")
    consumer = importlib.import_module("consumer")
    yield hub, consumer
    for name in ("kernels", "consumer"):
        sys.modules.pop(name, None)


def test_a_hub_fetch_is_refused_recorded_and_undone(standin):
    hub, consumer = standin
    original = hub.get_kernel
    with apps.NetworkOff() as net:
        with pytest.raises(RuntimeError, match="refused to fetch the Hub kernel kernels-comm"):
            consumer.get_kernel_hub("kernels-community/flash-attn2")
        with pytest.raises(RuntimeError):
            hub.get_kernel("kernels-community/flash-attn3", version=2)
    assert net.hub == ["kernels-community/flash-attn2", "kernels-community/flash-attn3"]
    assert hub.CALLS == []  # the stand-in's download was never reached
    assert hub.get_kernel is original and consumer.get_kernel_hub is original
    consumer.get_kernel_hub("x")  # restored: the stand-in runs again
    assert hub.CALLS == ["x"]


def test_the_network_is_off_but_this_host_is_not():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with apps.NetworkOff() as net:
            with pytest.raises(OSError, match="network off"):
                socket.create_connection(("192.0.2.1", 443), timeout=1)  # TEST-NET-1
            with socket.create_connection(server.getsockname(), timeout=5):
                pass
    assert net.attempts == ["192.0.2.1:443"]


def test_a_hub_fallback_fails_the_row_naming_the_switch(standin):
    hub, consumer = standin
    impl = apps.Impl("flash_attention_2", needs="flash_attn")
    with apps.NetworkOff() as net:
        with pytest.raises(RuntimeError):
            consumer.get_kernel_hub("kernels-community/flash-attn2")
    [failure] = apps.network_failures(impl, net)
    assert failure == (
        "flash_attention_2 fell back to a Hub kernel (kernels-community/flash-attn2) instead "
        "of the image's: set USE_HUB_KERNELS=NO in the image's environment"
    )
    torch = types.SimpleNamespace(__version__="2.15.0")
    spec = apps.BY_NAME["llama-gqa"]
    assert apps.kernel_source(torch, spec, impl, False, net.hub) == (
        "a Hub kernel (kernels-community/flash-attn2)"
    )


def test_a_hub_fallback_despite_the_switch_does_not_name_the_switch_as_the_remedy(standin):
    """transformers 5.25.0 takes its flash_attention_2 fallback without reading USE_HUB_KERNELS
    (seen with the real 5.25.0 in tests/validate/test_newest_torch.py): where the switch is
    already off, the failure says so and names what does keep the fallback away."""
    hub, consumer = standin
    impl = apps.Impl("flash_attention_2", needs="flash_attn")
    with apps.NetworkOff() as net:
        with pytest.raises(RuntimeError):
            consumer.get_kernel_hub("kernels-community/flash-attn2")
    [failure] = apps.network_failures(impl, net, switch_off=True)
    assert failure == (
        "flash_attention_2 fell back to a Hub kernel (kernels-community/flash-attn2) although "
        "USE_HUB_KERNELS=NO, which does not gate this fallback: install the image's own "
        "flash_attn, or keep transformers below 5.25 (whose `kernels` is optional)"
    )


@pytest.mark.parametrize(
    ("name", "impl", "source"),
    [
        ("llama-gqa", apps.Impl("sdpa", always=True), "torch's SDPA (torch 2.15.0)"),
        ("llama-gqa", apps.Impl("sdpa", shim=True),
         "the bundled kernels (attnforge_kernels.sdpa_shim) behind torch's SDPA"),
        ("llama-gqa", apps.Impl("eager", reference=True),
         "transformers eager attention (matmul + softmax)"),
        ("qwen-image", apps.Impl("_native_math", reference=True), "torch's SDPA (torch 2.15.0)"),
    ],
)  # fmt: skip
def test_each_implementation_says_where_its_kernel_came_from(name, impl, source):
    torch = types.SimpleNamespace(__version__="2.15.0")
    assert apps.kernel_source(torch, apps.BY_NAME[name], impl, True, []) == source


def test_flash_attn_paths_name_the_images_flash_attn(monkeypatch, tmp_path):
    fa = types.ModuleType("flash_attn")
    fa.__file__, fa.__version__ = str(tmp_path / "flash_attn/__init__.py"), "2.8.3"
    monkeypatch.setitem(sys.modules, "flash_attn", fa)
    torch = types.SimpleNamespace(__version__="2.15.0")
    impl = apps.Impl("flash_attention_2", needs="flash_attn")
    assert apps.kernel_source(torch, apps.BY_NAME["llama-gqa"], impl, True, []) == (
        f"the image's flash_attn 2.8.3 ({fa.__file__})"
    )
    assert apps.kernel_source(torch, apps.BY_NAME["llama-gqa"], impl, False, []) == (
        "none (refused)"
    )


@pytest.mark.parametrize(
    ("env", "off"), [({}, False), ({"USE_HUB_KERNELS": "YES"}, False),
                     ({"USE_HUB_KERNELS": "NO"}, True), ({"USE_HUB_KERNELS": "0"}, True)],
)  # fmt: skip
def test_the_image_s_hub_switch_is_reported_as_found(env, off):
    assert apps.hub_setting(env) == {
        "variable": "USE_HUB_KERNELS", "value": env.get("USE_HUB_KERNELS"), "off": off,
    }  # fmt: skip


def test_the_apps_layer_sets_the_switch_in_the_image():
    from tests.conftest import REPO

    text = (REPO / "dockerfiles/apps.Dockerfile").read_text()
    assert "\nENV USE_HUB_KERNELS=NO\n" in text
