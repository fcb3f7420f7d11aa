"""The public API: flash_attn's functions (fixed, varlen, packed, FP8, KV cache), their argument
checks and errors, and the SDPA shim's router. Calls the device code through the launch wing."""
