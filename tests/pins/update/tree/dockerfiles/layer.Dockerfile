# A stand-in: pins.check reads recipes and never builds.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
