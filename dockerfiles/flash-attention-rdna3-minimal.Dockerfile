# attnforge layer: flash-attention-rdna3-minimal (rocWMMA FlashAttention-2 for gfx11, wave32)
# Follows: Repeerc/flash-attention-v2-RDNA3-minimal@76d4433f README.md "Build and Test" (the
#   minimum integration is the rocwmma_fattn/ folder; `python bench_with_sdpa.py` on Linux) and
#   rocwmma_fattn/FlashAttn.py, which builds the extension with torch.utils.cpp_extension.load
#   (hipcc, -DROCWMMA_ARCH_GFX11=1 -DROCWMMA_WAVE32_MODE=1 ...) into rocwmma_fattn/build when
#   it is imported. The image imports it once, so the build happens here and not at first use.
# Needs complete rocWMMA headers (rocwmma/internal/...) in the ROCm SDK of an earlier layer.
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
ARG PATCH_SERIES=""
ARG MAX_JOBS=2
# pip's index where a line names none (unset: PyPI); `invoke build --mirror` sets it.
ARG PIP_INDEX_URL
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

WORKDIR /src
# One RUN fetches, installs and deletes the source tree (hence cd, not WORKDIR); the pip cache
# is a cache mount (hence no --no-cache-dir).
# hadolint ignore=DL3003,DL3042
RUN --mount=type=secret,id=ca,required=false \
    --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,source=.,target=/ctx \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca GIT_SSL_CAINFO=/run/secrets/ca; fi \
 && rocm="${ROCM_PATH:-/opt/rocm}" \
 && if [ ! -f "${rocm}/include/rocwmma/internal/accessors.hpp" ]; then \
        echo "rocWMMA headers are incomplete or missing under ${rocm}/include/rocwmma (rocwmma.hpp includes internal/accessors.hpp): this kernel cannot be built with this ROCm SDK" >&2; exit 1; fi \
 && git init -q fattn && cd fattn \
 && git fetch -q --depth 1 "${SOURCE_REPO}" "${SOURCE_REF}" && git checkout -q FETCH_HEAD \
 && if [ -n "${PATCH_SERIES}" ]; then read -r -a series <<< "${PATCH_SERIES}" \
     && (cd /ctx && python3 attnforge/patches.py apply --component flash-attention-rdna3-minimal --src /src/fattn "${series[@]}"); fi \
 && pip install ninja==1.13.0 \
 && site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cp -r rocwmma_fattn "${site}/rocwmma_fattn" \
 && cd / && rm -rf /src/fattn \
 && FLASH_ATTN_WMMA_ARCH="${GPU_ARCH}" MAX_JOBS="${MAX_JOBS}" \
    python3 -c "import rocwmma_fattn.FlashAttn as m; print('built', m.flash_attn_wmma.__file__)"

# FlashAttn.py (patched) reads the arch at import; the same value finds the extension built above.
# validate.suite plans validate/checks/rdna3_minimal.py wherever rocwmma_fattn is installed, so
# `python -m validate all` compares the kernel with SDPA in this image.
ENV FLASH_ATTN_WMMA_ARCH="${GPU_ARCH}"

COPY attnforge-manifest.json /opt/attnforge/versions.json
