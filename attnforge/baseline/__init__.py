"""Performance baselines: gate.py compares a bench.json with a baseline's (pure, standard
library only; also `python -m attnforge.baseline BASE NOW`), store.py says where a baseline
comes from and keeps the default one."""
