# attnforge layer: rocm-sdk
# Follows: ROCm/TheRock@89553ce3 RELEASES.md, "Installing ROCm Python packages" (the same
# commands on every channel's index, e.g. https://stable.repo.amd.com/rocm/whl-next/ for 10.x):
#   pip install --index-url <multi-arch index> "rocm[libraries,devel,device-gfx1151]"
# then `rocm-sdk init` (expands the devel tree; docs/packaging/python_packaging.md), and the
# environment of external-builds/pytorch/build_prod_wheels.py:_setup_common_build_env:
# ROCM_HOME/ROCM_PATH = `rocm-sdk path --root`, its bin on PATH, and
# HIP_DEVICE_LIB_PATH=<root>/lib/llvm/amdgcn/bitcode (clang otherwise finds the wrong device libs).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG ROCM_INDEX_URL
ARG ROCM_VERSION
ARG THEROCK_EXTRA
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --find-links /wheelhouse --index-url "${ROCM_INDEX_URL}" \
        "rocm[libraries,devel,${THEROCK_EXTRA}]==${ROCM_VERSION}" \
 && rocm-sdk init \
 && ln -s "$(rocm-sdk path --root)" /opt/rocm

ENV ROCM_PATH=/opt/rocm \
    ROCM_HOME=/opt/rocm \
    HIP_DEVICE_LIB_PATH=/opt/rocm/lib/llvm/amdgcn/bitcode \
    PATH=/opt/rocm/bin:${PATH}

COPY attnforge-manifest.json /opt/attnforge/versions.json
