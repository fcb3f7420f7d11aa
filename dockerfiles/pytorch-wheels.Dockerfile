# attnforge layer: pytorch-wheels
# Follows: ROCm/TheRock@89553ce3 RELEASES.md, "Installing PyTorch Python packages":
#   pip install --index-url <multi-arch index> "torch[device-gfx1151]"
# (torch depends on rocm[libraries], so the SDK from the previous layer must satisfy it; the
# smoke check proves it was not moved). AOTriton ships inside torch; on arches its version
# calls experimental, torch needs TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1 or SDPA silently
# falls back (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG ROCM_INDEX_URL
ARG TORCH_VERSION
ARG THEROCK_EXTRA
ARG AOTRITON_EXPERIMENTAL=0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --find-links /wheelhouse --index-url "${ROCM_INDEX_URL}" \
        "torch[${THEROCK_EXTRA}]==${TORCH_VERSION}"

ENV TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL="${AOTRITON_EXPERIMENTAL}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
