# attnforge layer: cpp-extension (cpu reference stack)
# Follows: PyTorch's tutorial "Custom C++ and CUDA Extensions" (setuptools with
# torch.utils.cpp_extension's CppExtension and BuildExtension). The source is a TORCH_LIBRARY
# operator, so neither pybind11 nor Python's headers are needed. The build goes straight into
# site-packages (setup.py build --build-lib), with no pip wheel step.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG MAX_JOBS=""
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Versions come from the base image's distro release, which the plan pins by digest.
# hadolint ignore=DL3008
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*

# The source is bind-mounted read-write, so the build's scratch files stay out of the image.
# hadolint ignore=DL3003
RUN --mount=type=bind,source=dockerfiles/scripts/torch_ext_demo,target=/src,rw \
    site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cd /src \
 && MAX_JOBS="${MAX_JOBS:-2}" python3 setup.py -q build --build-base /tmp/ext-build --build-lib "${site}" \
 && rm -rf /tmp/ext-build

COPY attnforge-manifest.json /opt/attnforge/versions.json
