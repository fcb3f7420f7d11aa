# attnforge layer: triton (cpu reference stack)
# Follows: triton-lang/triton README, "Quick Installation" (pip install triton); numpy is what
# TRITON_INTERPRET=1 needs. /wheelhouse is a bind mount of local wheels (--wheelhouse).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TRITON_VERSION
ARG NUMPY_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --find-links /wheelhouse "triton==${TRITON_VERSION}" "numpy==${NUMPY_VERSION}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
