# attnforge layer: triton (cpu reference stack)
# Follows: triton-lang/triton README, "Quick Installation" (pip install triton); numpy is what
# TRITON_INTERPRET=1 needs. The build context is bind-mounted at /ctx: its wheelhouse/ holds the
# local wheels (--wheelhouse), and PATCH_SERIES (the self-test series) is applied to site-packages
# by attnforge's patch engine, which fails the build on a conflict.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TRITON_VERSION
ARG NUMPY_VERSION
ARG PATCH_SERIES=""
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The pip cache is a cache mount; the patch engine resolves series paths from /ctx (hence cd).
# hadolint ignore=DL3003,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=.,target=/ctx \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --find-links /ctx/wheelhouse "triton==${TRITON_VERSION}" "numpy==${NUMPY_VERSION}" \
 && if [ -n "${PATCH_SERIES}" ]; then read -r -a series <<< "${PATCH_SERIES}" \
     && site="$(python3 -c 'import pathlib, triton; print(pathlib.Path(triton.__file__).parents[1])')" \
     && (cd /ctx && python3 attnforge/patches.py apply --component selftest --src "${site}" "${series[@]}"); fi

COPY attnforge-manifest.json /opt/attnforge/versions.json
