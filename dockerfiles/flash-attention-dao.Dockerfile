# attnforge layer: flash-attention-dao (Dao-AILab/flash-attention upstream, AMD paths)
# Follows: Dao-AILab/flash-attention@0251105a README.md "AMD ROCm Support" and setup.py:
#   Triton backend: FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE" pip install --no-build-isolation .
#     (setup.py inits the third_party/aiter submodule and pip-installs it; the kernels are
#     aiter's, imported as aiter.ops.triton._triton_kernels.flash_attn_triton_amd)
#   CK backend:     GPU_ARCHS=<arch> pip install --no-build-isolation . (csrc/composable_kernel)
# and ROCm/aiter@9bab8388 setup.py/aiter/__init__.py (AITER_TRITON_ONLY=1: Triton ops only, no
# C++/CK JIT), the mode aiter's own CI installs flash-attention's Triton backend against.
# Installed with pip --no-deps --no-build-isolation so the torch and triton of earlier layers stay.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SOURCE_REPO
ARG SOURCE_REF
# `invoke build --mirror` sends the submodules' own URLs (.gitmodules) to the mirror through git's
# environment (url.<mirror>/git/.insteadOf https://); unset otherwise.
ARG GIT_CONFIG_COUNT
ARG GIT_CONFIG_KEY_0
ARG GIT_CONFIG_VALUE_0
ARG FLASH_ATTENTION_TRITON_AMD_ENABLE
ARG AITER_TRITON_ONLY
ARG GPU_ARCHS
ARG SETUPTOOLS_SCM_VERSION
ARG PATCH_SERIES=""
ARG MAX_JOBS=2
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /src
# One RUN fetches, builds and deletes the source tree, so no layer keeps it (hence cd, not
# WORKDIR); the pip cache is a cache mount (hence no --no-cache-dir). The one submodule the
# backend needs is fetched shallow before setup.py asks git for it (then a no-op).
# BUILD_TARGET=rocm: flash-attention's setup.py (BUILD_TARGET, default auto) otherwise takes the
# CUDA branch wherever torch.utils.cpp_extension.IS_HIP_EXTENSION is false (a torch whose ROCm
# home it cannot find); the rehearsal's build of this layer failed there ("CUDA_HOME environment
# variable is not set", 2026-12-04), as the fork's layer had. Read in the 2.8.3 tree; that
# 0251105a still reads it is unverified (a no-op if not).
# hadolint ignore=DL3003,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=.,target=/ctx \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && git init -q flash-attention && cd flash-attention \
 && git remote add origin "${SOURCE_REPO}" && git fetch -q --depth 1 origin "${SOURCE_REF}" \
 && git checkout -q FETCH_HEAD \
 && if [ -n "${PATCH_SERIES}" ]; then read -r -a series <<< "${PATCH_SERIES}" \
     && (cd /ctx && python3 attnforge/patches.py apply --component flash-attention-dao --src /src/flash-attention "${series[@]}"); fi \
 && if [ "${FLASH_ATTENTION_TRITON_AMD_ENABLE}" = "TRUE" ]; then \
        git submodule update -q --init --depth 1 third_party/aiter; \
    else git submodule update -q --init --depth 1 csrc/composable_kernel; fi \
 && pip install einops==0.8.1 packaging==25.0 ninja==1.13.0 psutil==7.0.0 \
        "setuptools-scm==${SETUPTOOLS_SCM_VERSION}" \
 && AITER_TRITON_ONLY="${AITER_TRITON_ONLY}" \
    FLASH_ATTENTION_TRITON_AMD_ENABLE="${FLASH_ATTENTION_TRITON_AMD_ENABLE}" GPU_ARCHS="${GPU_ARCHS}" \
    BUILD_TARGET=rocm MAX_JOBS="${MAX_JOBS}" pip install --no-deps --no-build-isolation . \
 && cd / && rm -rf /src/flash-attention

# flash_attn_interface.py reads FLASH_ATTENTION_TRITON_AMD_ENABLE at import to pick the Triton
# backend; aiter/__init__.py reads AITER_TRITON_ONLY at import (unset, it loads its C++/CK JIT).
ENV FLASH_ATTENTION_TRITON_AMD_ENABLE="${FLASH_ATTENTION_TRITON_AMD_ENABLE}" \
    AITER_TRITON_ONLY="${AITER_TRITON_ONLY}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
