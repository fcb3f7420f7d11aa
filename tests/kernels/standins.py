"""Stand-ins for recorded launches, for the CPU tests of the launch plans
(test_launch_plans.py, test_split_kv.py) and of the native launch path (test_native.py), a spy on
a kernel's launches for the tests of what the launchers choose, the gradients of one call
under a config override (the tests that compare two kernel variants' backwards), and the check
that only Hopper's configs set a flag measured on Hopper alone."""


class Fill:
    """A stand-in for a recorded launch (``attnforge_kernels.launch.plans.Launch``): fills tensors
    of the call (by position, ``t5=2.0``) with values when the Python path replays it, and carries a
    native description (``native``) as a recorded launch does, or None."""

    scratch = False

    def __init__(self, native=None, **fills):
        self.native = native
        self.fills = {int(i.removeprefix("t")): x for i, x in fills.items()}
        self.calls = 0

    def __call__(self, stream, tensors):
        self.calls += 1
        for i, x in self.fills.items():
            tensors[i].fill_(x)


class LaunchSpy:
    """Wraps a jit kernel (``spy = LaunchSpy(interface.attn_fwd)``, then monkeypatched in its
    place): notes the keyword arguments of each ``[grid](...)`` launch in ``calls``, its grid in
    ``grids``, and runs it."""

    def __init__(self, fn):
        self.fn, self.calls, self.grids = fn, [], []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(kwargs)
            self.grids.append(tuple(grid))
            return self.fn[grid](*args, **kwargs)

        return launch

    def values(self, name: str) -> list:
        """The launches' values of one keyword argument, in order."""
        return [kw[name] for kw in self.calls]


def grads_under(monkeypatch, override, call, tensors, seed=3, with_out=False):
    """The gradients of ``call(*tensors)`` (as fresh leaves) under the config override
    ``override`` (``ATTNFORGE_KERNELS_CONFIG``; None: the default config), backpropagating
    ``1 + out``; ``seed`` draws the dropout mask. ``with_out``: ``out`` first, then them."""
    import torch

    monkeypatch.delenv("ATTNFORGE_KERNELS_CONFIG", raising=False)
    if override:
        monkeypatch.setenv("ATTNFORGE_KERNELS_CONFIG", override)
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    torch.manual_seed(seed)
    out = call(*leaves)
    out.backward(torch.ones_like(out) + out.detach())
    grads = [t.grad for t in leaves]
    return [out.detach(), *grads] if with_out else grads


def assert_only_hopper_sets(flag: str) -> None:
    """Hopper's default and dropout configs set the AttnConfig field ``flag`` at every head dim
    (64, 128, 256); no AMD or Ampere family's config does."""
    from attnforge_kernels.device import configs

    for d in (64, 128, 256):
        assert getattr(configs.config_for("hopper", d), flag)
        assert getattr(configs.config_for("hopper", d, dropout=True), flag)
        for family in ("rdna3", "rdna3.5", "rdna4", "cdna2", "cdna3", "cdna4", "ampere"):
            assert not getattr(configs.config_for(family, d), flag), family
