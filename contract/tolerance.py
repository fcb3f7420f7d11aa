"""flash-attention's error rule, said once (standard library only).

The validation suite's SDPA and flash_attn checks (``validate.checks.numerics.judge``) and the
bundled kernels' checks (``attnforge_kernels.checks.judge.Judge``) both judge with it, from this
package that travels beside both (validate.Dockerfile copies all three), so that neither imports the
other for it: validate must work where ``import attnforge_kernels`` fails (no triton), and
attnforge_kernels never imports validate.

With ``ref`` the attention computed in fp32 from the same inputs (rounded to the input dtype, as
flash-attention's ``attention_ref`` returns it) and ``pt`` the same math in the input dtype:

    max|out - ref| <= factor * max|pt - ref| + eps * max(max|ref|, MIN_MAGNITUDE)

``factor`` is 2 as in flash-attention's tests (3 for gradients where the kernels' checks use
it, as flash-attention's varlen tests do). The floor is one unit of rounding (``eps``: the
input dtype's machine epsilon, bf16 2**-7, fp16 2**-10) at the reference's magnitude, like FA3's
``fwd_atol``, so a 1-ulp difference where the low-precision reference happens to round exactly
is not a failure. Magnitudes under MIN_MAGNITUDE count as MIN_MAGNITUDE: a gradient that is zero
analytically (one key: dK = 0) still carries the rounding of the output it was computed from.
"""

from __future__ import annotations

FACTOR = 2.0
GRAD_FACTOR = 3.0
MIN_MAGNITUDE = 1e-2


def tolerance(pt_err: float, ref_max: float, eps: float, factor: float = FACTOR) -> float:
    """The largest error the rule allows."""
    return factor * pt_err + eps * max(ref_max, MIN_MAGNITUDE)


def within(
    err: float, pt_err: float, ref_max: float, eps: float, factor: float = FACTOR
) -> tuple[bool, float]:
    """(whether ``err`` keeps the rule, the bound it was held to)."""
    bound = tolerance(pt_err, ref_max, eps, factor)
    return err <= bound, bound
