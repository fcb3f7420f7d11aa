# attnforge layer: torch-cpu
# Follows: pytorch.org "Start Locally" for pip/Linux/CPU (index https://download.pytorch.org/whl/cpu).
# /wheelhouse is a bind mount of local wheels offered to pip (--wheelhouse); it adds no layer.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TORCH_VERSION
ARG TORCH_INDEX_URL=""
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The pip cache is a cache mount, so --no-cache-dir would only slow rebuilds down. PyTorch's
# index is asked only when the wheelhouse lacks the pinned wheel, so an offline build works.
# hadolint cannot see the pin through the optional index flag: torch is pinned to TORCH_VERSION.
# hadolint ignore=DL3013,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=wheelhouse,target=/wheelhouse \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && index=() \
 && if [ -n "${TORCH_INDEX_URL}" ] && ! compgen -G "/wheelhouse/torch-${TORCH_VERSION}-*.whl" >/dev/null; then \
        index=(--extra-index-url "${TORCH_INDEX_URL}"); fi \
 && pip install --find-links /wheelhouse "${index[@]}" "torch==${TORCH_VERSION}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
