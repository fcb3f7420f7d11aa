"""Check functions. Each runs inside its own subprocess: ``func(params, ctx) -> result dict``."""
