"""How a check's subprocess ended -> pass/fail/skip/crash/timeout (validate.runner.classify)."""

import pytest

from validate.runner import Outcome, classify, is_device_fault, signal_name, tail


@pytest.mark.parametrize(
    ("outcome", "status", "in_message"),
    [
        pytest.param(
            Outcome(0, False, {"status": "pass", "message": "ok"}), "pass", "ok", id="pass"
        ),
        pytest.param(
            Outcome(0, False, {"status": "skip", "message": "no GPU"}),
            "skip",
            "no GPU",
            id="skip-keeps-reason",
        ),
        pytest.param(
            Outcome(0, False, {"status": "fail", "message": "bad"}), "fail", "bad", id="fail"
        ),
        pytest.param(
            Outcome(-11, False, None, "x\nlast words\n"),
            "crash",
            "killed by SIGSEGV: last words",
            id="segfault",
        ),
        pytest.param(Outcome(-6, False, None), "crash", "SIGABRT", id="abort"),
        pytest.param(
            Outcome(139, False, None),
            "crash",
            "killed by SIGSEGV (exit status 139)",
            id="shell-style-signal",
        ),
        pytest.param(
            Outcome(None, True, None, "", ["forced flash run"]),
            "timeout",
            "during forced flash run",
            id="hang",
        ),
        pytest.param(
            Outcome(3, False, None),
            "crash",
            "exited with status 3 without a result",
            id="exit-without-result",
        ),
        pytest.param(
            Outcome(
                -6,
                False,
                None,
                "Memory access fault by GPU node-1 (Agent handle: 0x1) on address 0x7f. Reason: Page not present",
            ),
            "crash",
            "GPU memory fault",
            id="hip-memory-fault-abort",
        ),
        pytest.param(
            Outcome(0, False, {"status": "bogus"}), "crash", "unknown status", id="unknown-status"
        ),
        pytest.param(
            Outcome(1, False, {"status": "pass", "message": "ok"}),
            "crash",
            "exited with status 1",
            id="died-after-pass",
        ),
        pytest.param(
            Outcome(0, False, {"status": "crash", "message": "GPU fault: x"}),
            "crash",
            "GPU fault",
            id="worker-reported-fault",
        ),
    ],
)
def test_classify(outcome, status, in_message):
    got_status, message = classify(outcome)
    assert got_status == status
    assert in_message in message


def test_timeout_wins_over_a_partial_result():
    assert classify(Outcome(-9, True, {"status": "pass"}))[0] == "timeout"


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("CUDA error: an illegal memory access was encountered", True),
        ("torch.AcceleratorError: CUDA error: an illegal memory access was encountered", True),
        (
            "Memory access fault by GPU node-2 (Agent handle: 0x55) on address 0x0. Reason: Page not present",
            True,
        ),
        ("HIP error: hipErrorIllegalAddress", True),
        ("device-side assert triggered", True),
        ("RuntimeError: No available kernel. Aborting execution.", False),
        ("ValueError: deliberate", False),
        ("", False),
    ],
)
def test_is_device_fault(text, fault):
    assert is_device_fault(text) is fault


def test_signal_name_of_unknown_number():
    assert signal_name(11) == "SIGSEGV"
    assert signal_name(250) == "signal 250"


def test_tail_keeps_last_non_empty_lines():
    assert tail("a\n\nb\n  \nc\n", 2) == ["b", "c"]
