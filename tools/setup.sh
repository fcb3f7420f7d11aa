#!/usr/bin/env bash
# Prepares this machine for `make demo` and `make test`: a Python venv with the dev extra, a
# reachable Docker engine, a local base image, a wheelhouse for the cpu stack and (for the
# tests) a local registry. Safe to run again: every step checks before it acts.
#
#   tools/setup.sh STEP [STEP ...]    steps: venv engine base-image wheelhouse registry buildx-tools hip-tools podman tritons newest-torch all
#
# Nothing here needs the network beyond the distro's package mirror and PyPI; no registry is
# pulled from: the base image is made with debootstrap and `docker import`.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3}
VENV=${VENV:-.venv}
BASE_IMAGE=${BASE_IMAGE:-attnforge-local/debian:bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WHEELHOUSE=${WHEELHOUSE:-build/wheelhouse}
REGISTRY_ADDR=${REGISTRY_ADDR:-127.0.0.1:5000}
BUILDX_IMAGE=${BUILDX_IMAGE:-attnforge-local/buildx-tools:trixie}
# The cpu stack's pins (recipes/layers/torch-cpu.yaml, triton.yaml, apps.yaml and the apps layer's
# lock, dockerfiles/scripts/apps-lock.txt); images run Debian 12's Python 3.11.
WHEELS=("torch==2.13.0+cpu" "triton==3.9.0" "numpy==2.4.6" "transformers==5.23.0" "diffusers==0.42.1")
APPS_LOCK=dockerfiles/scripts/apps-lock.txt
TRITONS_DIR=${TRITONS_DIR:-build/tritons}

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }
die() { printf '\033[31merror:\033[0m %s\n' "$*" >&2; exit 1; }

# Debian's 20.10 CLI drives BuildKit itself; a newer CLI without the buildx plugin cannot.
docker_cli() { if [ -x /usr/bin/docker ]; then echo /usr/bin/docker; else command -v docker; fi; }

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  ((${#missing[@]})) || return 0
  [ "$(id -u)" = 0 ] || die "missing packages: ${missing[*]}; install them (sudo apt-get install ${missing[*]}) and re-run"
  say "installing ${missing[*]}"
  if [ -z "${APT_UPDATED:-}" ]; then apt-get update -q >/dev/null; APT_UPDATED=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

venv() {
  if [ ! -x "$VENV/bin/invoke" ] || [ pyproject.toml -nt "$VENV/bin/invoke" ]; then
    say "python venv at $VENV (editable attnforge with the dev extra)"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip >/dev/null
    # Compiled at install (not --no-compile, which installs 20 s faster): where
    # PYTHONDONTWRITEBYTECODE=1 is set, as on the CI machine, nothing would ever write the
    # bytecode, and every process would compile torch's modules again as it imports them
    # (docs/benchmarks.md, issue 29).
    # torch==2.13.0 is the +cpu build (the cpu stack's, no Triton requirement): configured
    # indexes first (a mirror that holds it), then PyTorch's CPU index, where it lives; PyPI's
    # own 2.13.0 is the CUDA build, whose triton==3.7.1 the dev extra's Triton pin refuses.
    "$VENV/bin/pip" install -q -e '.[dev]' \
      || "$VENV/bin/pip" install -q --extra-index-url https://download.pytorch.org/whl/cpu -e '.[dev]' \
      || die "could not install the dev extra into $VENV"
    touch "$VENV/bin/invoke"
  fi
}

# A session of many e2e runs grows BuildKit's cache by tens of GB (63 GB once, which filled the
# disk mid-test), and a run after a change to the rehearsals' stand-ins builds every AMD stack's
# layers afresh: about 25 GB of new layers beside the old ones (2026-12-05: two such runs filled a
# disk that had 33 GB free). Below MIN_FREE_GB free on the engine's disk, first drop BuildKit's
# copies of build contexts (`source.local` entries: each build sends its context again and its
# layers still hit, as they are keyed by the files' checksums; a warm CI run leaves about 5 GB of them,
# most used once: every test tree has a new path, 0.54 GB of wheelhouse a cpu-stack context); then,
# if that was not enough, trim the cache to its most recently used KEEP_CACHE_GB. The trim goes by
# last use, so what it keeps must hold a warm run's layers and what that run made once (planted
# defects, changed files: made last, so kept first): 17.4 GB and 5.1 GB on 2026-12-05, more than
# the 20 GB kept before (docs/ci.md). A roomy disk keeps its whole cache.
MIN_FREE_GB=${ATTNFORGE_MIN_FREE_GB:-35}
KEEP_CACHE_GB=${ATTNFORGE_KEEP_CACHE_GB:-25}
trimmed=
free_gb() { df -P -BG "$1" | awk 'NR == 2 {sub("G", "", $4); print $4}'; }
trim_build_cache() {  # once per run of this script (several steps start the engine)
  local cli root free
  [ -z "$trimmed" ] || return 0
  trimmed=1
  cli=$(docker_cli)
  root=$("$cli" info --format '{{.DockerRootDir}}' 2>/dev/null) || return 0
  [ -d "$root" ] || return 0  # a remote engine (DOCKER_HOST): its disk is not ours to read
  free=$(free_gb "$root")
  [ -n "$free" ] && [ "$free" -lt "$MIN_FREE_GB" ] || return 0
  say "only ${free} GB free under $root: dropping Docker's copies of build contexts"
  "$cli" builder prune -f --filter type=source.local >/dev/null ||
    say "could not drop the build contexts' copies"
  free=$(free_gb "$root")
  [ -n "$free" ] && [ "$free" -lt "$MIN_FREE_GB" ] || return 0
  say "still only ${free} GB free: trimming Docker's build cache to ${KEEP_CACHE_GB} GB"
  "$cli" builder prune -f --keep-storage "${KEEP_CACHE_GB}gb" >/dev/null ||
    say "could not trim the build cache; free some space before the e2e tests"
}

engine() {
  engine_up
  trim_build_cache
}

engine_up() {
  local cli
  if cli=$(docker_cli) && [ -n "$cli" ] && "$cli" info >/dev/null 2>&1; then return 0; fi
  if [ -n "${DOCKER_HOST:-}" ]; then die "DOCKER_HOST=$DOCKER_HOST does not answer; start that engine or unset DOCKER_HOST"; fi
  [ "$(id -u)" = 0 ] || die "no Docker engine is reachable. Start one (sudo systemctl start docker), or run this as root so it can install Debian's docker.io and start dockerd"
  apt_install docker.io
  say "starting dockerd (log: /tmp/attnforge-dockerd.log)"
  if command -v systemctl >/dev/null && systemctl start docker 2>/dev/null; then :; else
    setsid dockerd >/tmp/attnforge-dockerd.log 2>&1 < /dev/null &
  fi
  for _ in $(seq 60); do "$(docker_cli)" info >/dev/null 2>&1 && return 0; sleep 1; done
  die "dockerd did not come up; see /tmp/attnforge-dockerd.log"
}

base_image() {
  local cli; cli=$(docker_cli)
  "$cli" image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
  apt_install debootstrap
  local root; root=$(mktemp -d /tmp/attnforge-rootfs.XXXXXX)
  say "making $BASE_IMAGE with debootstrap (Debian 12, minbase + python3)"
  debootstrap --variant=minbase --include=python3,python3-venv bookworm "$root" "$DEBIAN_MIRROR" >/tmp/attnforge-debootstrap.log 2>&1 \
    || die "debootstrap failed; see /tmp/attnforge-debootstrap.log"
  tar -C "$root" -c . | "$cli" import -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
}

# `docker buildx` for the bake tests (tests/e2e/test_bake_buildx.py). Debian 12 packages no buildx;
# Debian 13 (trixie) has docker-buildx 0.13.1 and docker-cli 26.1 (`apt-cache policy
# docker-buildx` with trixie's archive, 2026-11-24). So: an image of trixie made with
# debootstrap, with both, that the tests run with the engine's socket mounted. Nothing is put on
# this host's PATH: builds keep using the 20.10 CLI that tools/setup.sh installs.
buildx_tools() {
  local cli; cli=$(docker_cli)
  "$cli" image inspect "$BUILDX_IMAGE" >/dev/null 2>&1 && return 0
  apt_install debootstrap
  local root; root=$(mktemp -d /tmp/attnforge-buildx-rootfs.XXXXXX)
  say "making $BUILDX_IMAGE with debootstrap (Debian 13, docker-cli + docker-buildx)"
  debootstrap --variant=minbase --include=docker-cli,docker-buildx trixie "$root" "$DEBIAN_MIRROR" \
      >/tmp/attnforge-debootstrap-buildx.log 2>&1 \
    || { rm -rf "$root"; die "debootstrap failed; see /tmp/attnforge-debootstrap-buildx.log"; }
  tar -C "$root" -c . | "$cli" import -c 'ENTRYPOINT ["docker"]' - "$BUILDX_IMAGE" >/dev/null
  rm -rf "$root"
}

# A real HIP compiler for the rehearsals' device code (tests/rehearsal.py): Debian experimental's
# ROCm 7.2.4 hipcc (Debian's clang/LLVM 22), which compiles HIP for gfx1100/gfx1151/gfx1201/gfx942/
# gfx950 on the CPU, in an image of Debian sid made with debootstrap, with only the ROCm source
# packages taken from experimental (the rest of experimental pinned away). About 160 MB downloaded
# and 1.3 GB unpacked; nothing is installed on this host. experimental's Release files can be
# expired, hence Check-Valid-Until false.
HIP_TOOLS_IMAGE=${HIP_TOOLS_IMAGE:-attnforge-local/hip-tools:sid}
hip_rootfs() {  # hip_rootfs ROOT: Debian sid in ROOT, with hipcc from experimental
  local root=$1 rc=0
  debootstrap --variant=minbase sid "$root" "$DEBIAN_MIRROR" || return 1
  echo "deb $DEBIAN_MIRROR experimental main" >"$root/etc/apt/sources.list.d/experimental.list"
  printf '%s\n' 'Package: *' 'Pin: release a=experimental' 'Pin-Priority: 1' '' \
    'Package: src:rocm-llvm src:rocm-hipamd src:rocr-runtime src:rocm-cmake src:rocm-device-libs src:rocm-compilersupport src:hipcc src:rocminfo' \
    'Pin: release a=experimental' 'Pin-Priority: 990' >"$root/etc/apt/preferences.d/rocm"
  echo 'Acquire::Check-Valid-Until "false";' >"$root/etc/apt/apt.conf.d/99attnforge"
  mount --bind /proc "$root/proc" || return 1
  { chroot "$root" apt-get update -q \
      && DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends \
        hipcc libamdhip64-dev \
      && chroot "$root" apt-get clean; } || rc=1
  umount "$root/proc"
  return $rc
}
hip_tools() {
  local cli; cli=$(docker_cli)
  "$cli" image inspect "$HIP_TOOLS_IMAGE" >/dev/null 2>&1 && return 0
  apt_install debootstrap
  local root; root=$(mktemp -d /tmp/attnforge-hip-rootfs.XXXXXX)
  local log=/tmp/attnforge-debootstrap-hip.log
  say "making $HIP_TOOLS_IMAGE with debootstrap (Debian sid, hipcc from experimental)"
  hip_rootfs "$root" >"$log" 2>&1 || { rm -rf "$root"; die "making $HIP_TOOLS_IMAGE failed; see $log"; }
  tar -C "$root" -c . | "$cli" import -c 'WORKDIR /work' - "$HIP_TOOLS_IMAGE" >/dev/null
  rm -rf "$root"
}

wheelhouse() {
  mkdir -p "$WHEELHOUSE"
  local want=() w all=("${WHEELS[@]}")
  mapfile -t -O "${#all[@]}" all < <(grep -Ev '^\s*(#|$)' "$APPS_LOCK")
  for w in "${all[@]}"; do
    # A wheel's file name spells the project with underscores (huggingface_hub, PyYAML -> pyyaml).
    local name=${w%%==*} ver=${w#*==}
    name=${name//[-.]/_}
    (shopt -s nocaseglob; compgen -G "$WHEELHOUSE/$name-${ver//+/?}-*.whl" >/dev/null) || want+=("$w")
  done
  ((${#want[@]})) || return 0
  say "wheelhouse $WHEELHOUSE: ${want[*]}"
  local pip=("$VENV/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.11
             --implementation cp --platform manylinux_2_28_x86_64
             --platform manylinux_2_17_x86_64 -d "$WHEELHOUSE")
  # torch's +cpu builds live on PyTorch's own index; try the configured indexes first.
  "${pip[@]}" "${want[@]}" 2>/dev/null \
    || "${pip[@]}" --extra-index-url https://download.pytorch.org/whl/cpu "${want[@]}" \
    || die "could not download ${want[*]}"
}

# The newest torch on PyPI with the Triton it requires (recipes/tritons.yaml's newest torch line,
# tests/validate/test_newest_torch.py checks they agree): a venv of their own, in which the
# validation suite and the kernels' CPU checks run, since that torch is what a user installs today
# while the cpu stack keeps the last +cpu build PyPI serves. PyPI's 2.15.0 is a CUDA build (5.4 GB
# with its nvidia-* wheels, 81 s to install here) that imports on a machine without a GPU. A
# machine-wide pip constraint (PIP_CONSTRAINT, pip.conf) that caps torch would refuse the pin, so
# this one install reads none. Made aside and renamed when complete.
NEWEST_TORCH=("torch==2.15.0" "triton==3.9.0")
# With the newest transformers (and the diffusers the apps layer pins), whose flash_attention_2
# falls back to a Hub kernel through Hugging Face's `kernels`, a required dependency since 5.25.0:
# tests/validate/test_newest_torch.py runs `validate apps` on it.
NEWEST_APPS=("transformers==5.25.0" "diffusers==0.42.1")
NEWEST_TORCH_VENV=${NEWEST_TORCH_VENV:-build/newest-torch}
newest_torch() {
  local want; want="${NEWEST_TORCH[*]} ${NEWEST_APPS[*]} numpy"
  [ "$(cat "$NEWEST_TORCH_VENV/.pins" 2>/dev/null)" = "$want" ] && return 0
  say "venv with ${NEWEST_TORCH[*]} ${NEWEST_APPS[*]} at $NEWEST_TORCH_VENV"
  rm -rf "$NEWEST_TORCH_VENV.tmp"
  "$PY" -m venv "$NEWEST_TORCH_VENV.tmp"
  local none; none=$(mktemp)
  PIP_CONSTRAINT=$none "$NEWEST_TORCH_VENV.tmp/bin/pip" install -q "${NEWEST_TORCH[@]}" "${NEWEST_APPS[@]}" numpy \
    || { rm -f "$none"; die "could not install ${NEWEST_TORCH[*]} into $NEWEST_TORCH_VENV.tmp"; }
  rm -f "$none"
  echo "$want" >"$NEWEST_TORCH_VENV.tmp/.pins"
  rm -rf "$NEWEST_TORCH_VENV"
  mv "$NEWEST_TORCH_VENV.tmp" "$NEWEST_TORCH_VENV"
}

# The Tritons the stacks ship (recipes/tritons.yaml, `python -m attnforge.tritons --versions`):
# each release's wheel in $TRITONS_DIR/wheels (the rehearsals relabel it into the stand-in Triton
# of a stack whose torch requires that line, tests/rehearsal.py), and, besides the venv's own,
# one folder each (pip --target, no dependencies) that tests/kernels/test_triton_versions.py puts
# first on PYTHONPATH over the venv's torch. Each is written aside and renamed when complete, so an
# interrupted download or install is redone, not used.
tritons() {
  local have v dir wheel versions
  have=$("$VENV/bin/python" -c 'import triton; print(triton.__version__)')
  versions=$("$VENV/bin/python" -m attnforge.tritons --versions)
  mkdir -p "$TRITONS_DIR/wheels"
  # A folder of a release no stack ships any more, or the venv's own (about 1 GB each), goes.
  for dir in "$TRITONS_DIR"/triton-*; do
    [ -d "$dir" ] || continue
    v=${dir##*/triton-}
    [ "$v" != "$have" ] && grep -qx -- "$v" <<<"$versions" || rm -rf -- "$dir"
  done
  for v in $versions; do
    wheel=$(compgen -G "$TRITONS_DIR/wheels/triton-$v-*.whl" | head -1) || true
    if [ -z "$wheel" ]; then
      say "triton $v wheel into $TRITONS_DIR/wheels"
      rm -rf "$TRITONS_DIR/wheels.tmp"
      "$VENV/bin/pip" download -q --no-deps --only-binary=:all: -d "$TRITONS_DIR/wheels.tmp" "triton==$v" \
        || die "could not download triton==$v"
      mv "$TRITONS_DIR"/wheels.tmp/triton-*.whl "$TRITONS_DIR/wheels/"
      rm -rf "$TRITONS_DIR/wheels.tmp"
      wheel=$(compgen -G "$TRITONS_DIR/wheels/triton-$v-*.whl" | head -1)
    fi
    dir=$TRITONS_DIR/triton-$v
    [ "$v" = "$have" ] || [ -d "$dir" ] && continue
    say "triton $v into $dir"
    rm -rf "$dir.tmp"
    "$VENV/bin/pip" install -q --no-deps --target "$dir.tmp" "$wheel" || die "could not install $wheel into $dir.tmp"
    mv "$dir.tmp" "$dir"
  done
}

registry() {
  # htpasswd (apache2-utils): tests/e2e/test_registry_login_e2e.py starts a second registry with a
  # login; openssl: `invoke verify --key` checks cosign signatures with it (tests/e2e/test_verify_signature.py).
  apt_install docker-registry apache2-utils openssl
  curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && return 0
  # Its storage is kept between runs, as the engines keep their build caches: each test run pushes
  # to repositories named for that run, and a layer the registry already holds is mounted into
  # them, not uploaded again (about 1.5 GB of the cpu stack, compressed on one core by the engine,
  # for Docker and for Podman). What every run adds (its manifests, the layers it changed) is
  # bounded: a store over REGISTRY_STORE_MAX_MB (10 GiB) starts empty. Only the registry's own
  # tree (docker/ in the store) is removed, whatever folder REGISTRY_STORE names.
  local store=${REGISTRY_STORE:-${XDG_CACHE_HOME:-$HOME/.cache}/attnforge/registry}
  if [ -d "$store/docker" ] && (($(du -sm "$store/docker" | cut -f1) > ${REGISTRY_STORE_MAX_MB:-10240})); then
    say "the registry's store $store is over ${REGISTRY_STORE_MAX_MB:-10240} MB: starting it empty"
    rm -rf -- "$store/docker"
  fi
  mkdir -p "$store"
  say "starting a local registry on $REGISTRY_ADDR (store: $store)"
  REGISTRY_STORAGE_FILESYSTEM_ROOTDIRECTORY=$store \
    setsid docker-registry serve .ci/registry.yml >/tmp/attnforge-registry.log 2>&1 < /dev/null &
  for _ in $(seq 30); do curl -fsS "http://$REGISTRY_ADDR/v2/" >/dev/null 2>&1 && return 0; sleep 1; done
  die "the registry did not come up; see /tmp/attnforge-registry.log"
}

# Podman next to Docker (`--engine podman`): the packages, the base image copied into Podman's own
# storage (`docker-daemon:` keeps its id), the loopback registry allowed over plain HTTP (Docker
# allows 127.0.0.0/8 by itself; Podman needs `insecure = true`), and, only where containers cannot
# start otherwise, default ulimits. Settings go in drop-ins named 50-attnforge-*.conf, never into
# the user's own files; as non-root they go under ~/.config/containers (rootless Podman).
podman_dropin() {  # podman_dropin DIR NAME CONTENT: (re)write DIR/NAME only if it differs
  local dir=$1 file=$1/$2 content=$3
  [ -f "$file" ] && [ "$(cat "$file")" = "$content" ] && return 0
  say "writing $file"
  mkdir -p "$dir"
  printf '%s\n' "$content" > "$file.tmp" && mv "$file.tmp" "$file"
}

podman_engine() {
  apt_install podman buildah
  local conf=/etc/containers
  [ "$(id -u)" = 0 ] || conf=${XDG_CONFIG_HOME:-$HOME/.config}/containers
  podman_dropin "$conf/registries.conf.d" 50-attnforge-loopback.conf "# tools/setup.sh podman: the local test registry speaks plain HTTP.
[[registry]]
location = \"$REGISTRY_ADDR\"
insecure = true"
  if ! podman image exists "$BASE_IMAGE"; then
    say "copying $BASE_IMAGE from Docker into Podman's storage"
    podman pull -q "docker-daemon:$BASE_IMAGE" >/dev/null || die "could not copy $BASE_IMAGE from Docker to Podman"
  fi
  local out
  out=$(podman run --rm "$BASE_IMAGE" true 2>&1) && return 0
  case "$out" in
    *"error setting rlimit"*)
      # Rootful Podman gives containers 1048576 open files and runc must set that; without
      # CAP_SYS_RESOURCE (Podman inside a container, as here) it may not go above this process's
      # hard limit. Podman 4.3 also lowers its own process limit to 32768 as it starts.
      local nofile nproc
      nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
      nproc=$(ulimit -Hu); { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
      podman_dropin "$conf/containers.conf.d" 50-attnforge-ulimits.conf "# tools/setup.sh podman: runc here may not raise rlimits above the host's hard limits.
[containers]
default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
      out=$(podman run --rm "$BASE_IMAGE" true 2>&1) && return 0 ;;
  esac
  die "podman cannot run $BASE_IMAGE: $out"
}

run_step() {
  case "$1" in
    venv) venv ;;
    engine) engine ;;
    base-image) engine; base_image ;;
    wheelhouse) venv; wheelhouse ;;
    registry) registry; apt_install chromium fonts-dejavu-core ;;  # + the report's browser test
    buildx-tools) engine; buildx_tools ;;
    hip-tools) engine; hip_tools ;;
    podman) engine; base_image; podman_engine ;;
    tritons) venv; tritons ;;
    newest-torch) newest_torch ;;
    all) venv; engine; base_image; wheelhouse ;;
    *) die "unknown step $1; valid: venv engine base-image wheelhouse registry buildx-tools hip-tools podman tritons newest-torch all" ;;
  esac
}

for step in "${@:-all}"; do run_step "$step"; done
