# attnforge layer: pytorch-org
# Follows: pytorch.org "Start Locally" for pip/Linux/ROCm 7.14, as pytorch/test-infra's
# get_wheel_install_command() writes it since pytorch/test-infra#8564 (2026-08-18):
#   pip3 install torchvision torch --index-url https://download.pytorch.org/whl/rocm7.14
# torch's ROCm 7.14 wheels bundle no ROCm libraries: they require
# rocm[libraries,device-all]==7.14.* (TheRock's SDK wheels, mirrored on the same index) and find
# them through RPATH into site-packages/_rocm_sdk_* (pytorch#190276, RFC pytorch#191688). So this
# layer needs no rocm-sdk layer and links no /opt/rocm: the image is what pip gives a user.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TORCH_INDEX_URL
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG ROCM_VERSION
ARG AOTRITON_EXPERIMENTAL=0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Two traps of this index, handled here:
# - pip stops with "maximum recursion depth exceeded" (pytorch#193979, TheRock#7362): the rocm
#   7.14.0 meta package requires itself (PKG-INFO `Requires-Dist: rocm==7.14.0`, root cause in
#   pytorch#193979 2026-08-18). TheRock#7461 dropped the self-dependency and 7.14.0.post1 was
#   published on pytorch.org's rocm7.14 indexes (TheRock#7362, 2026-08-21). rocm is pinned to
#   ROCM_VERSION (7.14.0.post1) in the same resolver call as torch, so pip never considers 7.14.0
#   (nor 7.14.1, which torch's ==7.14.* would otherwise let in).
# - torchvision is named before torch, the order pytorch.org's ROCm command uses since
#   pytorch/test-infra#8564.
# torch's requirement names the device-all extra, so every rocm-sdk-device-* wheel comes along
# (tens of GB), as it does for a user of this index; installing fewer would need --no-deps and
# leave torch's requirement unmet. Versions are exact pins, so pip cannot move any of them.
# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --find-links /wheelhouse --index-url "${TORCH_INDEX_URL}" \
        "torchvision==${TORCHVISION_VERSION}" \
        "torch==${TORCH_VERSION}" \
        "rocm==${ROCM_VERSION}"

ENV TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL="${AOTRITON_EXPERIMENTAL}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
# What the recipe could only infer, read from the installed files into the manifest's "observed"
# (AOTriton in torch, libtorch_hip's targets, the Triton beside torch, HIP): docs/build-checks.md.
RUN --mount=type=bind,source=.,target=/ctx python3 /ctx/attnforge/observe.py /opt/attnforge/versions.json
