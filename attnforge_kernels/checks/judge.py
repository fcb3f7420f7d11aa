"""The one judge of the kernels' checks: flash-attention's error rule, tensor by tensor.

The rule: the kernel's max error against the fp32 reference is at most ``factor`` times the
error of the same computation in the input dtype (the yardstick; 2x for outputs, 3x for
gradients), plus a small floor (perf.md section 6). The rule itself is imported here and nowhere
else in the harness.
"""

from __future__ import annotations

from contract import tolerance

FACTOR = tolerance.FACTOR
GRAD_FACTOR = tolerance.GRAD_FACTOR
GRADS = ("dq", "dk", "dv")
LSE_BOUND = 1e-2  # finite log-sum-exp rows must agree this closely


class Judge:
    """Verdicts of one case: ``ok`` is every verdict so far; per tensor name the worst error
    seen and the bound it was held to (``metrics()``)."""

    def __init__(self, eps: float, keys: tuple[str, ...] = ()) -> None:
        self.eps = eps
        self.ok = True
        self.worst: dict[str, float] = dict.fromkeys(keys, 0.0)
        self.bounds: dict[str, float] = dict.fromkeys(keys, 0.0)

    def tensor(self, key: str, mine, ref, pt, *, factor: float | None = None, extra=0.0) -> bool:
        """flash-attention's rule for one tensor: ``mine`` against the fp32 ``ref``, with the
        yardstick ``max|pt - ref|`` widened to ``extra`` where the kernel's algorithm has an
        error the references do not model. ``factor``: 3 for gradients, else 2, unless given."""
        import torch

        if factor is None:
            factor = GRAD_FACTOR if key in GRADS else FACTOR
        mine, ref, pt = mine.reshape(ref.shape).float(), ref.float(), pt.float()
        if not torch.isfinite(mine).all():
            return self._record(key, float("inf"), self.bounds.get(key, 0.0), False)
        if mine.numel() == 0:
            return True
        err = (mine - ref).abs().max().item()
        yardstick = max((pt - ref).abs().max().item(), extra)
        good, bound = tolerance.within(err, yardstick, ref.abs().max().item(), self.eps, factor)
        return self._record(key, err, bound, good)

    def lse(self, mine, ref, bound: float = LSE_BOUND) -> bool:
        """Log-sum-exp: finite rows within ``bound``; rows that see no key +inf on both sides."""
        import torch

        mine = mine.reshape(ref.shape).float()
        fin = torch.isfinite(ref)
        if not torch.equal(fin, torch.isfinite(mine)):
            return self._record("lse", float("inf"), bound, False)
        err = (mine[fin] - ref[fin]).abs().max().item() if fin.any() else 0.0
        return self._record("lse", err, bound, err <= bound)

    def value(self, key: str, err: float, good: bool, bound: float | None = None) -> bool:
        """A verdict reached elsewhere (a cache's contents, a poisoned output), recorded."""
        if bound is None:
            self.worst[key] = max(self.worst.get(key, 0.0), err)
            self.ok &= bool(good)
            return bool(good)
        return self._record(key, err, bound, good)

    def _record(self, key: str, err: float, bound: float, good: bool) -> bool:
        if err >= self.worst.get(key, 0.0):
            self.worst[key], self.bounds[key] = err, bound
        self.ok &= bool(good)
        return bool(good)

    def metrics(self) -> dict[str, float]:
        """``err_<key>`` and ``bound_<key>`` for every tensor judged."""
        m = {f"err_{k}": v for k, v in self.worst.items()}
        m.update({f"bound_{k}": v for k, v in self.bounds.items()})
        return m


def summary(metrics: dict[str, float], keys) -> str:
    """``out=<err>/<bound>, dq=...`` for the keys that have both."""
    have = [k for k in keys if f"err_{k}" in metrics and f"bound_{k}" in metrics]
    return ", ".join(f"{k}={metrics['err_' + k]:.2e}/{metrics['bound_' + k]:.2e}" for k in have)
