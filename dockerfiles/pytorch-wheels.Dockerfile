# attnforge layer: pytorch-wheels
# Follows: AMD-Ecosystem/ai-ecosystem@fee8a501 docs/frameworks/pytorch/include/
# rocm10.1.0-pip-install.rst (read 2026-11-24):
#   pip install --index-url <channel index> "torch[device-gfx1151]==..." \
#       "torchvision[device-gfx1151]==..." "torchaudio==..."
# with the ROCm SDK of the previous layer (`rocm-sdk version`) pinned in the same call: torch depends on
# rocm[libraries], and one resolver call over exact pins is what keeps pip from moving any of the
# coupled wheels to another build (TheRock#7183: +rocm10.x labels sort below +rocm7.x as
# strings). AOTriton ships inside torch; on arches its version calls experimental, torch needs
# TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 or SDPA silently falls back
# (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG ROCM_INDEX_URL
ARG TORCH_VERSION
ARG TORCHVISION_VERSION
ARG TORCHAUDIO_VERSION
ARG THEROCK_EXTRA
ARG AOTRITON_EXPERIMENTAL=0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && rocm_version="$(rocm-sdk version)" \
 && pip install --find-links /wheelhouse --index-url "${ROCM_INDEX_URL}" \
        "rocm[libraries,devel,${THEROCK_EXTRA}]==${rocm_version}" \
        "torch[${THEROCK_EXTRA}]==${TORCH_VERSION}" \
        "torchvision[${THEROCK_EXTRA}]==${TORCHVISION_VERSION}" \
        "torchaudio==${TORCHAUDIO_VERSION}"

ENV TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL="${AOTRITON_EXPERIMENTAL}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
# What the recipe could only infer, read from the installed files into the manifest's "observed"
# (AOTriton in torch, libtorch_hip's targets, the Triton beside torch, HIP): docs/build-checks.md.
RUN --mount=type=bind,source=.,target=/ctx python3 /ctx/attnforge/observe.py /opt/attnforge/versions.json
