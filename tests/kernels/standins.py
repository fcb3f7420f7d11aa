"""Stand-ins for recorded launches, for the CPU tests of the launch plans
(test_launch_plans.py) and of the native launch path (test_native.py)."""


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
