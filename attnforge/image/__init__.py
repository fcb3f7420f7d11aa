"""Scripts that run inside an image, sent to its Python on stdin: standard library only, no
import of attnforge (smoke_runner.py: a layer's smoke checks; envprobe.py: what a Python
environment holds). The host reads them as text (`Path(module.__file__).read_text()`).
attnforge/patches.py and attnforge/aotriton_pin.py also run in builds but stay at the top:
their repository path is part of the layers' cache keys."""
