"""How calls reach the kernels: per-call launch plans, the native (C++) replay of them, the
parameters a replay packs, and opt-in autotuning. Imports the device wing only."""
