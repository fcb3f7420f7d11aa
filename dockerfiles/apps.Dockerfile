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

# No Hub kernel mapped in at run time: USE_HUB_KERNELS=NO turns off transformers' kernel mapping
# (integrations/hub_kernels.py). It does not stop transformers 5.25.0's flash_attention_2 fallback
# to kernels.get_kernel("kernels-community/flash-attn2"), taken whenever flash_attn is missing and
# Hugging Face's `kernels` is installed (modeling_utils.py), which is why this layer stays below
# 5.25 (docs/validation.md). `python -m validate apps` fails a fallback it sees.
ENV USE_HUB_KERNELS=NO

COPY attnforge-manifest.json /opt/attnforge/versions.json
