# attnforge layer: apps
# Follows: huggingface/transformers README "Installation" and huggingface/diffusers README
# "Installation" (pip install). The build context is bind-mounted at /ctx: wheelhouse/ holds local
# wheels (--wheelhouse) and dockerfiles/scripts/apps-lock.txt every dependency, resolved once.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TRANSFORMERS_VERSION
ARG DIFFUSERS_VERSION
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# --no-deps over the lock installs exactly what it pins (no resolver run here, so nothing floats
# and torch is never touched); `pip check` then proves the set is complete and consistent.
# The pip cache is a cache mount, so --no-cache-dir would only slow rebuilds down.
# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=.,target=/ctx \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && pip install --no-deps --find-links /ctx/wheelhouse -r /ctx/dockerfiles/scripts/apps-lock.txt \
        "transformers==${TRANSFORMERS_VERSION}" "diffusers==${DIFFUSERS_VERSION}" \
 && pip check

# No attention kernel fetched from the Hub at run time: transformers (5.23 optionally, 5.25 always)
# can fall back from flash_attention_2 to kernels.get_kernel("kernels-community/flash-attn2")
# while USE_HUB_KERNELS is yes, its default (transformers integrations/hub_kernels.py).
# `python -m validate apps` fails a fallback it sees (validate/checks/apps.py).
ENV USE_HUB_KERNELS=NO

COPY attnforge-manifest.json /opt/attnforge/versions.json
