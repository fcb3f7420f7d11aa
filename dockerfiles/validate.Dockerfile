# attnforge layer: validate
# Follows: attnforge's validate/ and kernels/ packages, which need only Python, torch and triton,
# and the contract/ package both import (standard library only; the build context adds
# contract/arches.json, recipes/arches.yaml rendered as JSON, so the image needs no PyYAML).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}

COPY validate /opt/attnforge/src/validate
COPY kernels /opt/attnforge/src/kernels
COPY contract /opt/attnforge/src/contract
ENV PYTHONPATH=/opt/attnforge/src
WORKDIR /opt/attnforge/src

COPY attnforge-manifest.json /opt/attnforge/versions.json
CMD ["python3", "-m", "validate", "all"]
