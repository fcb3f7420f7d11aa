# attnforge layer: validate
# Follows: attnforge's validate/ and attnforge_kernels/ packages, which need only Python, torch and
# triton, and the contract/ package both import (standard library only; the build context adds
# contract/arches.json, recipes/arches.yaml rendered as JSON, so the image needs no PyYAML).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

# The kernels' native launch path (attnforge_kernels/launch/replay.cpp; docs/kernels.md), compiled here for a GPU
# build of torch so that no container spends its first call compiling it. A build that fails is
# noted in the cache, and calls take the Python path (`python3 -m attnforge_kernels.native status`
# says why); a CPU torch has no use for it. It is compiled from the two files it is made of
# (the source and native_build.py, which runs as a file), before the packages are copied in: an
# edit anywhere else in them does not compile it again (about 30 s a stack).
ENV ATTNFORGE_NATIVE_DIR=/opt/attnforge/native
COPY attnforge_kernels/launch/native_build.py attnforge_kernels/launch/replay.cpp /opt/attnforge/native-src/
RUN if python3 -c "import sys, torch; sys.exit(not (torch.version.hip or torch.version.cuda))"; \
    then python3 /opt/attnforge/native-src/native_build.py || echo "attnforge_kernels.native: not built; the Python path"; fi

COPY validate /opt/attnforge/src/validate
COPY attnforge_kernels /opt/attnforge/src/attnforge_kernels
COPY contract /opt/attnforge/src/contract
ENV PYTHONPATH=/opt/attnforge/src
WORKDIR /opt/attnforge/src

COPY attnforge-manifest.json /opt/attnforge/versions.json
CMD ["python3", "-m", "validate", "all"]
