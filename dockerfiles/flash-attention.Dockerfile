# attnforge layer: flash-attention (ROCm fork)
# Follows: ROCm/flash-attention main_perf README, "AMD ROCm Support":
#   Triton backend: FLASH_ATTENTION_TRITON_AMD_ENABLE="TRUE" python setup.py install
#   CK backend:     GPU_ARCHS=<arch> MAX_JOBS=<n> python setup.py install (csrc/composable_kernel)
# installed with pip --no-deps --no-build-isolation so the torch and triton of earlier layers
# stay; the patch series (PATCH_SERIES) is applied by attnforge's patch engine, all or nothing.
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
ARG GPU_ARCHS
ARG PATCH_SERIES=""
ARG MAX_JOBS=2
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /src
# One RUN fetches, builds and deletes the source tree, so no layer keeps it (hence cd, not
# WORKDIR); the pip cache is a cache mount (hence no --no-cache-dir). The built wheel is kept in
# /opt/attnforge/wheels, so that `invoke export` carries the very wheel this image installed.
# BUILD_TARGET=rocm: setup.py otherwise infers CUDA or ROCm from the torch it imports
# (torch.utils.cpp_extension.IS_HIP_EXTENSION), and takes the CUDA branch where that torch is not
# a HIP build; this layer builds ROCm's fork for ROCm, so it says so.
# hadolint ignore=DL3003,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=.,target=/ctx \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && git init -q flash-attention && cd flash-attention \
 && git remote add origin "${SOURCE_REPO}" && git fetch -q --depth 1 origin "${SOURCE_REF}" \
 && git checkout -q FETCH_HEAD \
 && if [ -n "${PATCH_SERIES}" ]; then read -r -a series <<< "${PATCH_SERIES}" \
     && (cd /ctx && python3 attnforge/patches.py apply --component flash-attention --src /src/flash-attention "${series[@]}"); fi \
 && if [ "${FLASH_ATTENTION_TRITON_AMD_ENABLE}" != "TRUE" ]; then \
        git submodule update -q --init --depth 1 csrc/composable_kernel; fi \
 && pip install einops==0.8.1 packaging==25.0 ninja==1.13.0 psutil==7.0.0 \
 && FLASH_ATTENTION_TRITON_AMD_ENABLE="${FLASH_ATTENTION_TRITON_AMD_ENABLE}" GPU_ARCHS="${GPU_ARCHS}" \
    BUILD_TARGET=rocm MAX_JOBS="${MAX_JOBS}" pip wheel --no-deps --no-build-isolation -w /opt/attnforge/wheels . \
 && pip install --no-deps /opt/attnforge/wheels/flash_attn-*.whl \
 && cd / && rm -rf /src/flash-attention

# flash_attn_interface.py reads this at import to pick the Triton backend.
ENV FLASH_ATTENTION_TRITON_AMD_ENABLE="${FLASH_ATTENTION_TRITON_AMD_ENABLE}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
