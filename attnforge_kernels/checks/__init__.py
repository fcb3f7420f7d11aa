"""The kernels' correctness harness, apart from the kernel sources.

One case type and its name grammar (``case``), the grids as data (``grids``), one reference
family (``reference``, ``dropout_ref``), one judge (``judge``: flash-attention's error rule), the
runs of each kind (``attention``, ``variants``, ``layouts``: packed, KV-cache and paged inputs) and the entry points the validation
suite and ``python -m attnforge_kernels.check`` use (``suite``).
"""
