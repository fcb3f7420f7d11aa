"""Fail a pytorch-source build whose PyTorch tree pins another AOTriton than the aotriton layer built.

Run inside the build: python3 check_aotriton_pin.py <pytorch-src> <versions.json>. It reads the pin
with attnforge/aotriton_pin.py (shipped in the same build context) and compares it with the
aotriton layer's SOURCE_REF in the image's versions manifest. Stdlib only.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "attnforge"))
from aotriton_pin import AotritonPinError, read_aotriton_pin  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: check_aotriton_pin.py PYTORCH_SRC VERSIONS_JSON", file=sys.stderr)
        return 2
    try:
        pin = read_aotriton_pin(Path(argv[1]))
    except AotritonPinError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    built = json.loads(Path(argv[2]).read_text()).get("aotriton", {}).get("SOURCE_REF")
    if built is None:
        print("error: the image has no aotriton layer in its versions manifest", file=sys.stderr)
        return 1
    if pin.commit != built:
        print(
            f"error: PyTorch pins AOTriton {pin.version} at {pin.commit} ({pin.source}), but the "
            f"aotriton layer built {built}; set aotriton's source.ref to {pin.commit}",
            file=sys.stderr,
        )
        return 1
    print(f"AOTriton pin ok: PyTorch pins {pin.version} at {pin.commit}, as built")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
