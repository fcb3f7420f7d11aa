# attnforge layer: aotriton
# Follows: ROCm/aotriton@0.12b README, "Build Instructions", and .ci/build-release.sh:
#   pip install -r requirements.txt; pip wheel third_party/triton -w /tmp/triton_wheel/
#   cmake .. -DCMAKE_BUILD_TYPE=Release -DAOTRITON_GPU_BUILD_TIMEOUT=0 -DAOTRITON_TARGET_ARCH=<arch>
#         -DAOTRITON_NO_PYTHON=ON -DAOTRITON_USE_LOCAL_TRITON_WHEEL=<wheel> -G Ninja
#   ninja install/strip   ("do not run ninja separately")
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SOURCE_REPO
ARG SOURCE_REF
# `invoke build --mirror` sends the submodules' own URLs (.gitmodules) to the mirror through git's
# environment (url.<mirror>/git/.insteadOf https://); unset otherwise.
ARG GIT_CONFIG_COUNT
ARG GIT_CONFIG_KEY_0
ARG GIT_CONFIG_VALUE_0
ARG GPU_ARCH
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
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && git init -q aotriton && cd aotriton \
 && git remote add origin "${SOURCE_REPO}" && git fetch -q --depth 1 origin "${SOURCE_REF}" \
 && git checkout -q FETCH_HEAD \
 && git submodule update -q --init --recursive --depth 1 \
 && pip install -r requirements.txt "cmake>=3.26" "ninja>=1.11" \
 && pip wheel third_party/triton -w /tmp/triton_wheel/ \
 && cmake -S . -B build -G Ninja \
        -DCMAKE_PREFIX_PATH="${ROCM_PATH}" -DCMAKE_INSTALL_PREFIX=/opt/aotriton \
        -DCMAKE_BUILD_TYPE=Release -DAOTRITON_GPU_BUILD_TIMEOUT=0 \
        -DAOTRITON_TARGET_ARCH="${GPU_ARCH}" -DAOTRITON_NO_PYTHON=ON \
        -DAOTRITON_USE_LOCAL_TRITON_WHEEL="$(ls /tmp/triton_wheel/triton-*.whl)" \
 && ninja -C build -j "${MAX_JOBS}" install/strip \
 && cd / && rm -rf /src/aotriton /tmp/triton_wheel

COPY attnforge-manifest.json /opt/attnforge/versions.json
