# attnforge layer: base
# Follows: ROCm/TheRock dockerfiles/rocm_runtime.Dockerfile (one Dockerfile for many distros
# through BASE_IMAGE; distro packages first) and TheRock RELEASES.md, "Installing releases
# using pip" (a Python venv). All variation arrives as build args.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG APT_PACKAGES="python3 python3-venv"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Versions come from the base image's distro release, which the plan pins by digest. The list is
# split into words by `read -a`, so the ARG itself is only ever expanded quoted.
# hadolint ignore=DL3008
RUN read -r -a packages <<< "${APT_PACKAGES}" \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${packages[@]}" \
 && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv /opt/venv
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

COPY attnforge-manifest.json /opt/attnforge/versions.json
