# The cpn image: control plane, agent and CLI (`cpn ...`). CPU build of torch; for GPU nodes build
# with a CUDA wheel instead (e.g. --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu124).
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/cpn
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md ./
COPY agent ./agent
COPY contracts ./contracts
COPY cpn ./cpn
COPY control_layer ./control_layer
COPY orchestration ./orchestration
COPY proto ./proto
COPY resource_layer ./resource_layer
COPY service_layer ./service_layer
COPY training ./training
RUN pip install . && useradd --create-home --uid 10001 cpn \
    && mkdir -p /var/lib/cpn /var/lib/cpn-agent /enroll && chown cpn /var/lib/cpn /var/lib/cpn-agent /enroll

USER cpn
ENV CPN_DATA_DIR=/var/lib/cpn
EXPOSE 8080 50051
CMD ["cpn", "server", "--host", "0.0.0.0", "--grpc-host", "0.0.0.0"]
