# attnforge layer: ck (Composable Kernel, fused MHA)
# Follows: ROCm/composable_kernel@8e22e1ae README, "Building CK":
#   cmake -D CMAKE_PREFIX_PATH=/opt/rocm -D CMAKE_CXX_COMPILER=/opt/rocm/bin/hipcc
#         -D CMAKE_BUILD_TYPE=Release -D GPU_TARGETS=<arch> -D DTYPES="fp16;bf16" ..
# DTYPES narrows the instances to the attention dtypes ("to speed build"); the MHA instances are
# built only for gfx90a/gfx94x (library/src/tensor_operation_instance/gpu/CMakeLists.txt).
# DTYPES arrives comma-separated (a build arg may not carry ';') and becomes the CMake list here.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SOURCE_REPO
ARG SOURCE_REF
# `invoke build --mirror` sends the submodules' own URLs (.gitmodules) to the mirror through git's
# environment (url.<mirror>/git/.insteadOf https://); unset otherwise.
ARG GIT_CONFIG_COUNT
ARG GIT_CONFIG_KEY_0
ARG GIT_CONFIG_VALUE_0
ARG GPU_TARGETS
ARG DTYPES
ARG MAX_JOBS=2
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /src
# One RUN fetches, builds and deletes the source tree, so no layer keeps it (hence cd, not
# WORKDIR); the pip cache is a cache mount (hence no --no-cache-dir).
# hadolint ignore=DL3003,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cache/ccache \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && git init -q ck && cd ck \
 && git fetch -q --depth 1 "${SOURCE_REPO}" "${SOURCE_REF}" && git checkout -q FETCH_HEAD \
 && pip install "cmake>=3.26" "ninja>=1.11" \
 && cmake -S . -B build -G Ninja \
        -DCMAKE_PREFIX_PATH=/opt/rocm -DCMAKE_CXX_COMPILER=/opt/rocm/bin/hipcc \
        -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_BUILD_TYPE=Release \
        -DGPU_TARGETS="${GPU_TARGETS}" -DDTYPES="${DTYPES//,/;}" -DCMAKE_INSTALL_PREFIX=/opt/ck \
 && ninja -C build -j "${MAX_JOBS}" install \
 && cd / && rm -rf /src/ck

COPY attnforge-manifest.json /opt/attnforge/versions.json
