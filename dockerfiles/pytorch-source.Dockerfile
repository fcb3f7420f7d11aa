# attnforge layer: pytorch-source
# Follows: pytorch/pytorch README, "From Source" ("If you're compiling for AMD ROCm then first run
# python tools/amd_build/build_amd.py"), cmake/External/aotriton.cmake (AOTRITON_INSTALLED_PREFIX
# takes a preinstalled AOTriton), and ROCm/TheRock@89553ce3 external-builds/pytorch/
# build_prod_wheels.py (USE_ROCM=ON USE_CUDA=OFF PYTORCH_ROCM_ARCH, USE_FLASH_ATTENTION and
# USE_MEM_EFF_ATTENTION together, CMAKE_PREFIX_PATH=$(rocm-sdk path --cmake)). Triton is the
# version the tree pins in .ci/docker/triton_version.txt (PyPI's triton wheels carry the AMD backend).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SOURCE_REPO
ARG SOURCE_REF
# `invoke build --mirror` sends the submodules' own URLs (.gitmodules) to the mirror through git's
# environment (url.<mirror>/git/.insteadOf https://); unset otherwise.
ARG GIT_CONFIG_COUNT
ARG GIT_CONFIG_KEY_0
ARG GIT_CONFIG_VALUE_0
ARG PYTORCH_ROCM_ARCH
ARG PYTORCH_BUILD_VERSION
ARG AOTRITON_EXPERIMENTAL=0
ARG PATCH_SERIES=""
ARG MAX_JOBS=2
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /src
# One RUN fetches, builds and deletes the source tree, so no layer keeps it (hence cd, not
# WORKDIR); the pip cache is a cache mount (hence no --no-cache-dir). The built wheel is kept in
# /opt/attnforge/wheels, so that `invoke export` carries the very wheel this image installed.
# hadolint ignore=DL3003,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cache/ccache \
    --mount=type=bind,source=.,target=/ctx \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && git init -q pytorch && cd pytorch \
 && git remote add origin "${SOURCE_REPO}" && git fetch -q --depth 1 origin "${SOURCE_REF}" \
 && git checkout -q FETCH_HEAD \
 && git submodule update -q --init --recursive --depth 1 \
 && python3 /ctx/dockerfiles/scripts/check_aotriton_pin.py . /opt/attnforge/versions.json \
 && if [ -n "${PATCH_SERIES}" ]; then read -r -a series <<< "${PATCH_SERIES}" \
     && (cd /ctx && python3 attnforge/patches.py apply --component pytorch --src /src/pytorch "${series[@]}"); fi \
 && pip install -r requirements.txt "triton==$(cat .ci/docker/triton_version.txt)" \
 && python3 tools/amd_build/build_amd.py \
 && USE_ROCM=1 USE_CUDA=0 USE_FLASH_ATTENTION=1 USE_MEM_EFF_ATTENTION=1 \
    PYTORCH_ROCM_ARCH="${PYTORCH_ROCM_ARCH}" AOTRITON_INSTALLED_PREFIX=/opt/aotriton \
    CMAKE_PREFIX_PATH="$(rocm-sdk path --cmake)" CMAKE_C_COMPILER_LAUNCHER=ccache \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache PYTORCH_BUILD_VERSION="${PYTORCH_BUILD_VERSION}" \
    PYTORCH_BUILD_NUMBER=1 MAX_JOBS="${MAX_JOBS}" \
    pip wheel --no-build-isolation --no-deps -w /opt/attnforge/wheels . \
 && pip install --no-deps /opt/attnforge/wheels/torch-*.whl \
 && cd / && rm -rf /src/pytorch

ENV TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL="${AOTRITON_EXPERIMENTAL}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
# What the recipe could only infer, read from the installed files into the manifest's "observed"
# (AOTriton in torch, libtorch_hip's targets, the Triton beside torch, HIP): docs/build-checks.md.
RUN --mount=type=bind,source=.,target=/ctx python3 /ctx/attnforge/observe.py /opt/attnforge/versions.json
