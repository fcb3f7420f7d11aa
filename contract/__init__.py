"""The contract that validate/, attnforge_kernels/ and attnforge/ agree on, said once (standard
library only).

- ``contract.names``: backend names and labels, statuses and their failing subset, modes, dtypes,
  and the kinds and versions of the documents a run writes;
- ``contract.documents``: the readers of report.json and of the documents beside it (bench.json,
  bench_train.json, stress-*.json, baseline-compare.json);
- ``contract.tolerance``: flash-attention's error rule that every numerical check judges with;
- ``contract.arches``: the facts of recipes/arches.yaml (the image carries them as JSON).

Images carry this package beside validate/ and attnforge_kernels/
(dockerfiles/validate.Dockerfile): validate imports attnforge_kernels and both import this, never
the reverse, and attnforge_kernels never imports validate.
"""
