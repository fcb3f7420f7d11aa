"""A wheel and source mirror: everything a plan fetches from outside, in one folder.

layout (pure): the folder's shape (a PEP 503 index under simple/, the files under files/, bare git
repositories under git/<host>/<path>.git, manifest.json with every file's sha256) and its checks.
needs (pure): what a plan's layers fetch (the requirements their Dockerfiles' pip lines name, with
the plan's args filled in, and each source repository at its pinned commit), and which build
argument the mirror replaces. gather: fill a mirror (pip download, git clone --mirror, local
files). serve: the mirror over loopback HTTP for one build (static files and git's smart HTTP).
"""
