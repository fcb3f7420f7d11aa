"""The release channels `invoke pins.update` reads, and the arch whose device packages it counts
by default: apart from update.py and its imports (the recipes, the plans, pydantic), because the
task's --help shows them and every invoke run declares the task."""

CHANNELS = ("stable", "nightly", "pytorch-org")
DEFAULT_ARCH = "gfx1151"
