"""The one module that talks to a container engine: Docker (BuildKit) first, Podman second.

Everything here is I/O. Requests are values (`BuildRequest`, `RunRequest`) so that a dry run can
print them and tests can record them; the engines execute them for real.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from .errors import UserError

ENGINES = ("docker", "podman")
HOW_TO_START = (
    "start one with `sudo systemctl start docker` (or `sudo dockerd &`), point DOCKER_HOST at a "
    "remote engine, or pass --engine podman"
)


def no_engine_hint(docker_host: str | None) -> str:
    """What to do when no engine answers; suggesting DOCKER_HOST to someone who set it helps no one."""
    if docker_host:
        return (
            f"DOCKER_HOST is set to {docker_host}, and that engine did not answer: start it, "
            "fix DOCKER_HOST, or unset it to use the local engine"
        )
    return HOW_TO_START


def check_engine_name(name: str) -> str:
    if name not in ENGINES:
        raise UserError(f"unknown engine {name!r}; valid engines: {', '.join(ENGINES)}")
    return name


class RegistryUnavailable(UserError):
    """A registry did not answer a lookup (down, refused the credentials, unknown host)."""


def _registry_of(ref: str) -> str:
    first = ref.split("/", 1)[0]
    return (
        first
        if "/" in ref and ("." in first or ":" in first or first == "localhost")
        else "docker.io"
    )


class BuildFailed(Exception):
    def __init__(self, returncode: int) -> None:
        super().__init__(f"build exited with status {returncode}")
        self.returncode = returncode


@dataclass(frozen=True)
class BuildRequest:
    """One image build: a staged context folder, its Dockerfile, args, labels and secrets."""

    context: Path
    dockerfile: Path
    build_args: dict[str, str]
    labels: dict[str, str]
    iidfile: Path
    secrets: dict[str, Path] = field(default_factory=dict)  # id -> file; never in a layer
    # A named BuildKit builder (`docker buildx --builder NAME`), or a buildkitd address such as
    # tcp://buildkitd:1234 (what BUILDKIT_HOST holds) for `buildctl`; None: the engine's own.
    builder: str | None = None
    # With a builder: push the result straight to this ref instead of loading it into the engine
    # (the engine then pulls it for the smoke checks). Never a content or moving tag: those move
    # only after the smoke checks pass.
    push_to: str | None = None
    # The build's network (`host` reaches a mirror served on the host's loopback); None: default.
    network: str | None = None

    @property
    def via_buildctl(self) -> bool:
        return self.builder is not None and "://" in self.builder

    def argv(self, cli: Sequence[str], mode: str) -> list[str]:
        if self.via_buildctl:
            return self.buildctl_argv()
        if self.builder is not None:
            if mode == "podman":
                raise UserError(
                    "--builder names a BuildKit builder, which podman cannot use",
                    hint="use --engine docker with docker buildx, or leave --builder out",
                )
            out = (
                ["--output", f"type=image,name={self.push_to},push=true"]
                if self.push_to
                else ["--load"]
            )
            cmd = [*cli, "buildx", "build", "--builder", self.builder, *out, "--progress=plain"]
        elif mode == "podman":
            cmd = [*cli, "build"]
        elif mode == "buildx":
            cmd = [*cli, "buildx", "build", "--load", "--progress=plain"]
        else:
            cmd = [*cli, "build", "--progress=plain"]
        cmd += ["-f", str(self.dockerfile), "--iidfile", str(self.iidfile)]
        if self.network:
            cmd += ["--network", self.network]
        for key, value in sorted(self.build_args.items()):
            cmd += ["--build-arg", f"{key}={value}"]
        for key, value in sorted(self.labels.items()):
            cmd += ["--label", f"{key}={value}"]
        for sid, path in sorted(self.secrets.items()):
            cmd += ["--secret", f"id={sid},src={path}"]
        return [*cmd, str(self.context)]

    @property
    def tarball(self) -> Path:
        """buildctl without push_to: where the image is written (type=docker) for `docker load`."""
        return self.iidfile.with_name("image.tar")

    @property
    def metadata_file(self) -> Path:
        """buildctl's build metadata; its containerimage.config.digest is the image id."""
        return self.iidfile.with_name("metadata.json")

    def buildctl_argv(self, buildctl: str = "buildctl") -> list[str]:
        """The same build for a standalone buildkitd: the Dockerfile frontend's `build-arg:` and
        `label:` options are what `docker buildx build` sends it for --build-arg and --label, and
        --metadata-file records `containerimage.config.digest` (moby/buildkit README, "Building
        a Dockerfile with buildctl" and "Metadata", read 2026-11-24)."""
        assert self.builder is not None
        cmd = [
            buildctl, "--addr", self.builder, "build", "--progress=plain",
            "--frontend", "dockerfile.v0",
            "--local", f"context={self.context}",
            "--local", f"dockerfile={self.dockerfile.parent}",
            "--opt", f"filename={self.dockerfile.name}",
        ]  # fmt: skip
        for key, value in sorted(self.build_args.items()):
            cmd += ["--opt", f"build-arg:{key}={value}"]
        for key, value in sorted(self.labels.items()):
            cmd += ["--opt", f"label:{key}={value}"]
        for sid, path in sorted(self.secrets.items()):
            cmd += ["--secret", f"id={sid},src={path}"]
        output = (
            f"type=image,name={self.push_to},push=true"
            if self.push_to
            else f"type=docker,dest={self.tarball}"  # no name: loading it moves no tag
        )
        return [*cmd, "--metadata-file", str(self.metadata_file), "--output", output]


@dataclass(frozen=True)
class RunRequest:
    """One container run: image, command, and the host resources it gets."""

    image: str
    command: list[str]
    devices: list[str] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)  # host, container, read-only
    env: dict[str, str] = field(default_factory=dict)
    extra: list[str] = field(default_factory=list)  # e.g. --ipc=host, --gpus=all
    network: str | None = None
    stdin: bool = False

    def argv(self, cli: Sequence[str]) -> list[str]:
        cmd = [*cli, "run", "--rm"]
        if self.stdin:
            cmd.append("-i")
        if self.network:
            cmd += ["--network", self.network]
        for dev in self.devices:
            cmd += ["--device", dev]
        for group in self.groups:
            cmd += ["--group-add", group]
        for host, target, ro in self.mounts:
            cmd += ["-v", f"{host}:{target}{':ro' if ro else ''}"]
        for key, value in sorted(self.env.items()):
            cmd += ["-e", f"{key}={value}"]
        return [*cmd, *self.extra, self.image, *self.command]


class Engine(Protocol):
    """What the executor and the tasks need of a container engine; tests record it."""

    name: str

    def describe(self) -> str: ...
    def build_argv(self, req: BuildRequest) -> list[str]: ...
    def build(
        self, req: BuildRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> str: ...
    def image_id(self, ref: str) -> str | None: ...
    def existing(self, refs: Iterable[str]) -> set[str]: ...
    def tag(self, image: str, ref: str) -> None: ...
    def run(
        self, req: RunRequest, input: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]: ...
    def run_streaming(
        self, req: RunRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> int: ...
    def push(self, ref: str, log: IO[str]) -> None: ...
    def untag(self, ref: str) -> None: ...
    def labels(self, ref: str) -> dict[str, str]: ...
    def remote_has(self, ref: str) -> bool: ...
    def pull(self, ref: str, log: IO[str]) -> str: ...
    def registry_digest(self, ref: str) -> str: ...
    def repo_digests(self, ref: str) -> list[str]: ...
    def data_root(self) -> str | None: ...


def podman_version(path: str | None = None) -> str | None:
    """`podman --version` (None when podman is not on `path`, default PATH): whether a user of
    the docker engine could pass --engine podman. Asks the client only; no engine is started."""
    exe = shutil.which("podman", path=path)
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=20)
        return out.stdout.strip() or exe
    except (OSError, subprocess.TimeoutExpired):
        return exe


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGINT when the parent dies, so a build
    client outlives a SIGKILLed `invoke build` by no more than its own clean-up (SIGINT is how
    the docker CLI cancels a build). Elsewhere, nothing: the client runs on until it ends."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stream(
    argv: list[str], log: IO[str], on_line: Callable[[str], None] | None, env: dict[str, str],
    cwd: Path | None = None,
) -> int:  # fmt: skip
    """Run argv, copying its output into log line by line; Ctrl-C stops the child too."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
        env=env, cwd=cwd, start_new_session=True, preexec_fn=_die_with_parent,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if on_line:
                on_line(line.rstrip("\n"))
        return proc.wait()
    except BaseException:
        # Interrupted: stop the build client (and with it the build) before unwinding.
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        raise


def _client_major(cli: str) -> int | None:
    try:
        out = subprocess.run(
            [cli, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            text=True,
            timeout=20,
        ).stdout.strip()
        return int(out.split(".")[0])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def _docker_clis() -> list[str]:
    chosen = os.environ.get("ATTNFORGE_DOCKER")
    if chosen:
        if not (os.path.isfile(chosen) and os.access(chosen, os.X_OK)):
            raise UserError(
                f"ATTNFORGE_DOCKER={chosen} is not an executable file",
                hint="point it at a docker CLI that can use BuildKit (e.g. /usr/bin/docker), or unset it",
            )
        return [chosen]
    found: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin"]:
        cand = os.path.join(d, "docker")
        if os.access(cand, os.X_OK) and os.path.realpath(cand) not in map(os.path.realpath, found):
            found.append(cand)
    return found


def pick_docker_cli() -> tuple[str, str]:
    """(cli path, mode): a docker CLI that can drive BuildKit, with buildx or built in (< 23)."""
    clis = _docker_clis()
    if not clis:
        raise UserError(
            "no docker command found", hint="install Docker (Debian: apt-get install docker.io)"
        )
    for cli in clis:
        ok = (
            subprocess.run([cli, "buildx", "version"], capture_output=True, timeout=20).returncode
            == 0
        )
        if ok:
            return cli, "buildx"
    for cli in clis:
        major = _client_major(cli)
        if major is not None and major < 23:  # these clients run BuildKit themselves
            return cli, "classic"
    raise UserError(
        f"no docker CLI here can use BuildKit: {', '.join(clis)} lack the buildx plugin",
        hint="install docker-buildx (or Debian's docker.io 20.10 CLI), or set ATTNFORGE_DOCKER to one that has it",
    )


class _CliEngine:
    """What Docker and Podman do the same way: builds, runs and pushes through their CLI."""

    name = ""
    cli = ""
    mode = ""
    env: dict[str, str] = {}

    def build_argv(self, req: BuildRequest) -> list[str]:
        return req.argv([self.cli], self.mode)

    def build(
        self, req: BuildRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> str:
        argv = self.build_argv(req)
        log.write("$ " + " ".join(argv) + "\n")
        code = _stream(argv, log, on_line, self.env)
        if code != 0:
            raise BuildFailed(code)
        return req.iidfile.read_text().strip()

    def existing(self, refs: Iterable[str]) -> set[str]:
        return {r for r in refs if r and self.image_id(r)}

    def image_id(self, ref: str) -> str | None:
        raise NotImplementedError

    def run(
        self, req: RunRequest, input: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            req.argv([self.cli]),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )

    def run_streaming(
        self, req: RunRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> int:
        return _stream(req.argv([self.cli]), log, on_line, self.env)

    def pull(self, ref: str, log: IO[str]) -> str:
        """Pull ref (credentials from the engine's own config); the local image id."""
        code = _stream([self.cli, "pull", ref], log, None, self.env)
        image = self.image_id(ref) if code == 0 else None
        if image is None:
            raise RegistryUnavailable(f"pulling {ref} failed (exit {code}); see the layer's log")
        return image

    def untag(self, ref: str) -> None:
        """Remove the tag `ref` only: the image stays while another tag names it."""
        argv = [self.cli, "untag", ref, ref] if self.name == "podman" else [
            self.cli, "image", "rm", "--no-prune", ref]  # fmt: skip
        subprocess.run(argv, capture_output=True, env=self.env)

    def push(self, ref: str, log: IO[str]) -> None:
        code = _stream([self.cli, "push", ref], log, None, self.env)
        if code != 0:
            raise UserError(
                f"pushing {ref} failed (exit {code}); is the registry reachable and are you logged in?"
            )


class DockerEngine(_CliEngine):
    """Docker: builds through the CLI with BuildKit, inspects and tags through the SDK."""

    name = "docker"

    def __init__(self) -> None:
        import docker  # the SDK; imported here so planning never needs it

        # With DOCKER_HOST the engine is asked first: whether it answers needs no CLI here.
        base_url = os.environ.get("DOCKER_HOST")
        if not base_url:
            self.cli, self.mode = pick_docker_cli()
            base_url = self._context_host()
        try:
            self.client = docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
            self.client.ping()
        except Exception as exc:  # noqa: BLE001 - any failure here means: no engine to talk to
            where = base_url or "the default socket (unix:///var/run/docker.sock)"
            raise UserError(
                f"no Docker engine is reachable at {where} ({type(exc).__name__})",
                hint=no_engine_hint(os.environ.get("DOCKER_HOST")),
            ) from None
        if not self.cli:
            self.cli, self.mode = pick_docker_cli()
        self.env = dict(os.environ, DOCKER_BUILDKIT="1")
        if base_url:
            self.env["DOCKER_HOST"] = base_url

    def _context_host(self) -> str | None:
        """The endpoint of the current docker context, so a remote context works like DOCKER_HOST."""
        try:
            out = subprocess.run(
                [self.cli, "context", "inspect", "--format", "{{.Endpoints.docker.Host}}"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        host = out.stdout.strip()
        return (
            host if out.returncode == 0 and host and host != "unix:///var/run/docker.sock" else None
        )

    def check_builder(self, builder: str) -> None:
        """A UserError, before anything is planned, when the builder cannot be used from here."""
        if "://" in builder:
            if not shutil.which("buildctl"):
                raise UserError(
                    f"--builder {builder} is a buildkitd address, and buildctl is not installed",
                    hint="install buildctl (moby/buildkit releases) on PATH, or name a buildx "
                    "builder instead (`docker buildx create --name NAME --driver remote ADDRESS`)",
                )
            return
        if self.mode != "buildx":
            raise UserError(
                f"--builder {builder} needs docker buildx, and {self.cli} has no buildx plugin",
                hint="install docker-buildx, or set ATTNFORGE_DOCKER to a docker CLI that has it",
            )
        found = subprocess.run(
            [self.cli, "buildx", "inspect", builder], capture_output=True, text=True,
            timeout=60, env=self.env,
        )  # fmt: skip
        if found.returncode != 0:
            raise UserError(
                f"docker buildx has no builder named {builder!r}",
                hint="`docker buildx ls` lists them; `docker buildx create --name NAME ...` makes one",
            )

    def build_argv(self, req: BuildRequest) -> list[str]:
        if req.via_buildctl:
            return req.buildctl_argv(shutil.which("buildctl") or "buildctl")
        return req.argv([self.cli], self.mode)

    def build(
        self, req: BuildRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> str:
        """As every engine builds, or on a named builder: its result comes back to this engine
        (loaded, or pushed to req.push_to and pulled), and the image id is that of this engine."""
        if req.builder is None:
            return super().build(req, log, on_line)
        argv = self.build_argv(req)
        log.write("$ " + " ".join(argv) + "\n")
        code = _stream(argv, log, on_line, self.env)
        if code != 0:
            raise BuildFailed(code)
        if req.push_to:
            return self.pull(req.push_to, log)
        if not req.via_buildctl:
            return req.iidfile.read_text().strip()
        # buildctl wrote an unnamed docker tarball: load it, and take the id it reported
        code = _stream([self.cli, "load", "-i", str(req.tarball)], log, None, self.env)
        image = json.loads(req.metadata_file.read_text()).get("containerimage.config.digest")
        if code != 0 or not image or self.image_id(image) is None:
            raise BuildFailed(code or 1)
        return image

    def describe(self) -> str:
        info = self.client.version()
        rootless = any("rootless" in o for o in self.client.info().get("SecurityOptions") or [])
        return (
            f"Docker {info.get('Version', '?')}{' rootless' if rootless else ''} via {self.cli} "
            f"({'buildx' if self.mode == 'buildx' else 'BuildKit'})"
        )

    def image_id(self, ref: str) -> str | None:
        import docker

        try:
            return self.client.images.get(ref).id
        except docker.errors.ImageNotFound:
            return None

    def tag(self, image: str, ref: str) -> None:
        repo, _, tag = ref.rpartition(":")
        self.client.images.get(image).tag(repo, tag)

    def labels(self, ref: str) -> dict[str, str]:
        return dict(self.client.images.get(ref).labels or {})

    def registry_digest(self, ref: str) -> str:
        """The manifest digest the registry serves for ref (read back, not computed here)."""
        import docker

        try:
            return self.client.images.get_registry_data(ref).id
        except docker.errors.APIError as exc:
            raise RegistryUnavailable(
                f"could not read {ref}'s digest back: {exc.explanation}"
            ) from None

    def repo_digests(self, ref: str) -> list[str]:
        """The registry digests the engine recorded for a pulled or pushed ref (no network)."""
        import docker

        try:
            return list(self.client.images.get(ref).attrs.get("RepoDigests") or [])
        except docker.errors.ImageNotFound:
            return []

    def data_root(self) -> str | None:
        """Where the engine keeps images (DockerRootDir), as it says; None when it does not."""
        try:
            return self.client.info().get("DockerRootDir") or None
        except Exception:  # noqa: BLE001 - an engine that does not say is a fact, not a crash
            return None

    def remote_has(self, ref: str) -> bool:
        """Whether the registry has ref, asked through the engine (its credentials, its
        insecure-registry settings); nothing is pulled. RegistryUnavailable when it cannot say."""
        import docker

        try:
            self.client.images.get_registry_data(ref)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as exc:
            text = str(exc.explanation or exc)
            if "manifest unknown" in text or "not found" in text.lower():
                return False
            raise RegistryUnavailable(
                f"registry {_registry_of(ref)} did not answer for {ref}: {text.splitlines()[0][:200]}"
            ) from None


# Where Podman differs from Docker (docs/engines.md says the same for users):
# - the OCI image format, Buildah's default, drops SHELL (every Dockerfile here sets one) and
#   HEALTHCHECK, so builds ask for Docker's format; --layers keeps each step as Buildah's cache;
# - image ids are printed bare (`fcad8e...`) where Docker, the iidfile and attnforge's stamps say
#   `sha256:fcad8e...`; the id of the same image is the same hex under both engines;
# - the registry's digest of a push is not the local image's `.Digest` (Podman re-serializes the
#   manifest on push), so it is taken from `podman push --digestfile`;
# - a plain-HTTP registry is allowed in registries.conf(.d) (`insecure = true`), never by
#   --tls-verify=false here; Docker allows 127.0.0.0/8 by itself;
# - a build that fails keeps Buildah's working container (the step's whole filesystem: for a
#   source build, the source tree and its objects) unless --force-rm, and one stopped by a signal
#   keeps it even then (podman 4.3: SIGINT, SIGTERM and SIGHUP alike), so the engine removes
#   the working containers an interrupted build left (`podman_left_behind`).
PODMAN_BUILD_FLAGS = ("--format", "docker", "--layers", "--force-rm")
# Buildah names a build's working container after the stage's base image: NAME-working-container,
# then -1, -2, ... while one of that name exists.
_WORKING_CONTAINER = re.compile(r"-working-container(-[0-9]+)?$")


def podman_left_behind(before: str, after: str) -> list[str]:
    """The ids of Buildah working containers in `after` and not in `before`, both what
    `podman ps -a --external --format '{{.ID}} {{.Names}}'` printed."""

    def working(listed: str) -> set[str]:
        rows = (line.split() for line in listed.splitlines())
        return {r[0] for r in rows if len(r) == 2 and _WORKING_CONTAINER.search(r[1])}

    return sorted(working(after) - working(before))


RLIMIT_REFUSED = "error setting rlimit"  # runc's words when it may not raise a container's limits


def podman_build_argv(req: BuildRequest, cli: str) -> list[str]:
    """`podman build` for req: Docker's image format and kept layers (see above). Secrets
    (`--secret id=ca,src=FILE`) and `RUN --mount=type=cache|bind|secret` are Buildah's own (1.28)."""
    argv = req.argv([cli], "podman")
    return [*argv[:2], *PODMAN_BUILD_FLAGS, *argv[2:]]


def podman_image_id(printed: str) -> str | None:
    """An id as Docker writes it (`sha256:HEX`) from what `podman image inspect` printed."""
    hexid = printed.strip()
    if not hexid:
        return None
    return hexid if hexid.startswith("sha256:") else f"sha256:{hexid}"


def podman_remote_verdict(ref: str, returncode: int, output: str) -> bool:
    """Whether `podman manifest inspect ref` found ref in its registry; RegistryUnavailable when
    the registry did not say. Podman 4 fetches an OCI single-image manifest and then refuses to
    show it ("Treating single images as manifest lists is not implemented"): that is a hit."""
    if returncode == 0 or "single images as manifest lists" in output:
        return True
    lowered = output.lower()
    if any(s in lowered for s in ("manifest unknown", "name unknown", "not found")):
        return False
    last = output.strip().splitlines()[-1][:200] if output.strip() else "no output"
    raise RegistryUnavailable(f"registry {_registry_of(ref)} did not answer for {ref}: {last}")


def _rlimits_refused() -> UserError:
    return UserError(
        "podman cannot start containers here: runc may not raise their open-file and process "
        "limits above this host's (no CAP_SYS_RESOURCE, as inside another container)",
        hint="set default_ulimits in a containers.conf.d drop-in to the host's hard limits "
        "(`tools/setup.sh podman` writes one), or run podman rootless",
    )


class PodmanEngine(_CliEngine):
    """Podman: everything through its CLI; it builds with Buildah, secrets and cache mounts included."""

    name = "podman"

    def __init__(self) -> None:
        cli = shutil.which("podman")
        if not cli:
            raise UserError(
                "podman is not installed", hint="apt-get install podman, or use --engine docker"
            )
        if subprocess.run([cli, "info"], capture_output=True, timeout=60).returncode != 0:
            raise UserError(
                "podman cannot reach its storage or service", hint="run `podman info` to see why"
            )
        self.cli, self.mode, self.env = cli, "podman", dict(os.environ)
        self._pushed: dict[str, str] = {}  # ref -> the digest its push wrote (--digestfile)

    def describe(self) -> str:
        out = subprocess.run([self.cli, "--version"], capture_output=True, text=True).stdout.strip()
        rootless = subprocess.run(
            [self.cli, "info", "--format", "{{.Host.Security.Rootless}}"],
            capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        return (out or "podman") + (" rootless" if rootless == "true" else "")

    def build_argv(self, req: BuildRequest) -> list[str]:
        return podman_build_argv(req, self.cli)

    def build(
        self, req: BuildRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> str:
        """Build as every engine does; when Ctrl-C stops it, remove the working containers the
        build left, which Podman keeps on a signal even with --force-rm (a SIGKILL of attnforge
        runs nothing: `podman ps -a --external` then lists what stayed).
        The ones that appeared while it ran are taken as its own: a second `podman build` started
        on the same storage in that moment would lose its working container too."""
        before = self._working_containers()
        try:
            return super().build(req, log, on_line)
        except BuildFailed:
            raise  # --force-rm: podman removed its container
        except BaseException:
            after = self._working_containers() if before is not None else None
            for cid in podman_left_behind(before, after) if after is not None else []:
                subprocess.run(
                    [self.cli, "rm", "-f", cid], capture_output=True, timeout=60, env=self.env
                )
                log.write(f"removed the interrupted build's working container {cid[:12]}\n")
            raise

    def _working_containers(self) -> str | None:
        """What `podman ps` lists of every container, Buildah's included; None if it failed (then
        nothing is removed: everything listed afterwards would look new)."""
        try:
            proc = subprocess.run(
                [self.cli, "ps", "-a", "--external", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
                capture_output=True, text=True, timeout=60, env=self.env,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        return proc.stdout if proc.returncode == 0 else None

    def image_id(self, ref: str) -> str | None:
        out = subprocess.run(
            [self.cli, "image", "inspect", "--format", "{{.Id}}", ref],
            capture_output=True,
            text=True,
        )
        return podman_image_id(out.stdout) if out.returncode == 0 else None

    def tag(self, image: str, ref: str) -> None:
        subprocess.run([self.cli, "tag", image, ref], check=True, capture_output=True)

    def labels(self, ref: str) -> dict[str, str]:
        out = subprocess.run(
            [self.cli, "image", "inspect", "--format", "{{json .Labels}}", ref],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return json.loads(out.stdout or "{}") or {}

    def run(
        self, req: RunRequest, input: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        proc = super().run(req, input, timeout)
        if proc.returncode != 0 and RLIMIT_REFUSED in proc.stderr:
            raise _rlimits_refused()
        return proc

    def run_streaming(
        self, req: RunRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> int:
        refused = []

        def watch(line: str) -> None:
            if RLIMIT_REFUSED in line:
                refused.append(line)
            if on_line:
                on_line(line)

        code = _stream(req.argv([self.cli]), log, watch, self.env)
        if code != 0 and refused:
            raise _rlimits_refused()
        return code

    def push(self, ref: str, log: IO[str]) -> None:
        with tempfile.TemporaryDirectory(prefix="attnforge-push-") as tmp:
            digestfile = Path(tmp) / "digest"
            argv = [self.cli, "push", "--digestfile", str(digestfile), ref]
            code = _stream(argv, log, None, self.env)
            if code != 0:
                raise UserError(
                    f"pushing {ref} failed (exit {code}); is the registry reachable and are you "
                    "logged in (podman login)? A plain-HTTP registry needs `insecure = true` in "
                    "registries.conf.d"
                )
            self._pushed[ref] = digestfile.read_text().strip()

    def registry_digest(self, ref: str) -> str:
        """The manifest digest the registry stored for ref, as `podman push` wrote it: the
        registry names a manifest by the sha256 of the very bytes pushed."""
        digest = self._pushed.get(ref, "")
        if not digest.startswith("sha256:"):
            raise RegistryUnavailable(
                f"no digest for {ref}: podman reports a registry's digest only for its own push"
            )
        return digest

    def repo_digests(self, ref: str) -> list[str]:
        """The registry digests podman recorded for a pulled or pushed ref (no network)."""
        try:
            out = subprocess.run(
                [self.cli, "image", "inspect", "--format", "{{json .RepoDigests}}", ref],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            return list(json.loads(out.stdout) or []) if out.returncode == 0 else []
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            return []

    def data_root(self) -> str | None:
        """Podman's image store (GraphRoot), as `podman info` says; None when it does not."""
        try:
            out = subprocess.run([self.cli, "info", "--format", "{{.Store.GraphRoot}}"],
                                 capture_output=True, text=True, timeout=60)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return None
        return (out.stdout.strip() or None) if out.returncode == 0 else None

    def remote_has(self, ref: str) -> bool:
        """Whether the registry has ref (podman's credentials and registries.conf); nothing is pulled."""
        out = subprocess.run(
            [self.cli, "manifest", "inspect", ref], capture_output=True, text=True, timeout=120
        )
        return podman_remote_verdict(ref, out.returncode, (out.stderr or out.stdout))


class LocalEngine:
    """--local: the same `RunRequest`s run by this host's Python instead of in an image. The
    image's `python3` is this interpreter, each mount's container path is its host folder, and
    the tree's validate/ and attnforge_kernels/ are importable (PYTHONPATH); devices are the host's
    own."""

    name = "local"

    def __init__(self, root: Path, python: str = sys.executable) -> None:
        self.root, self.python = root, python

    def describe(self) -> str:
        return f"this host's Python ({self.python})"

    def argv(self, req: RunRequest) -> list[str]:
        def host(arg: str) -> str:
            for src, target, _ in req.mounts:
                if arg == target or arg.startswith(target + "/"):
                    return str(src) + arg[len(target) :]
            return arg

        first, *rest = req.command
        return [self.python if first == "python3" else host(first), *map(host, rest)]

    def env(self, req: RunRequest) -> dict[str, str]:
        return dict(os.environ, PYTHONPATH=str(self.root), **req.env)

    def image_id(self, ref: str) -> str | None:
        return None  # no image: nothing here is stamped as validated

    def run(
        self, req: RunRequest, input: str | None = None, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(req), input=input, capture_output=True, text=True,
                              timeout=timeout, env=self.env(req), cwd=self.root)  # fmt: skip

    def run_streaming(
        self, req: RunRequest, log: IO[str], on_line: Callable[[str], None] | None = None
    ) -> int:
        return _stream(self.argv(req), log, on_line, self.env(req), cwd=self.root)


def connect(name: str) -> DockerEngine | PodmanEngine:
    """The engine by name; a UserError that says how to start one when it is not reachable."""
    check_engine_name(name)
    return DockerEngine() if name == "docker" else PodmanEngine()
