"""Device code: the Triton and Gluon kernels, the tiles they compile with per GPU family, and the
CPU interpreter's patches they need. Imports nothing from the other wings."""
