# attnforge layer: cpp-extension (cpu reference stack)
# Follows: PyTorch's tutorial "Custom C++ and CUDA Extensions" (setuptools with
# torch.utils.cpp_extension's CppExtension and BuildExtension). The source is a TORCH_LIBRARY
# operator, so neither pybind11 nor Python's headers are needed. The build goes straight into
# site-packages (setup.py build --build-lib), with no pip wheel step.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG MAX_JOBS=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# One step: install g++, build, remove g++ again (about 300 MB the image does not need), keeping
# binutils, which the linkage smoke check reads ELF with. Package versions come from the base
# image's distro release, which the plan pins by digest. The source is bind-mounted read-write,
# so the build's scratch files stay out of the image.
# hadolint ignore=DL3003,DL3008
RUN --mount=type=bind,source=dockerfiles/scripts/torch_ext_demo,target=/src,rw \
    apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends g++ binutils \
 && site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cd /src \
 && MAX_JOBS="${MAX_JOBS:-2}" python3 setup.py -q build --build-base /tmp/ext-build --build-lib "${site}" \
 && rm -rf /tmp/ext-build \
 && DEBIAN_FRONTEND=noninteractive apt-get purge -y --auto-remove g++ \
 && rm -rf /var/lib/apt/lists/*

COPY attnforge-manifest.json /opt/attnforge/versions.json
