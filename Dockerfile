# syntax=docker/dockerfile:1
# qpid-flow images. Targets:
#   runtime (default)  qpid-flow only:            docker build -t qpid-flow .
#   test               + test extra, RabbitMQ and Proton C examples, for `compose run tests`
# Pinned to bookworm: the Debian packages used by the test image (rabbitmq-server 3.10,
# libqpid-proton11-dev-examples) are those the test harness was measured with.

FROM python:3.11-slim-bookworm AS build
# python-qpid-proton builds from source with cffi: it needs a compiler and, for TLS, OpenSSL headers.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY qpid_flow ./qpid_flow
COPY plugins ./plugins
# Wheels for qpid-flow and every dependency, test and analytics extras included, so the later
# stages install offline and without a compiler. The first-party plugins the test suite covers
# too (PLUGINS in .ci/install-deps): each is a package of its own, built from plugins/.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[test,analytics]' ./plugins/qpid-flow-rabbitmq-depth

FROM python:3.11-slim-bookworm AS runtime
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels qpid-flow \
 && useradd --system --uid 10001 --no-create-home qpidflow
USER qpidflow
# 5673 AMQP 1.0 for clients, 8673 admin HTTP.
EXPOSE 5673 8673
CMD ["qpid-flow", "serve", "--listen", "0.0.0.0:5673"]

FROM runtime AS test
USER root
# The `rabbitmq` fixture uses the compose broker (QPID_FLOW_TEST_BROKER_URL), but kill/restart
# tests (`fresh_rabbitmq`) start a private RabbitMQ they control, and load tests build the
# Proton C example clients: both need these packages in the test image.
# The report tests run Spark (a Java runtime) and open the report in headless Chromium.
# iproute2: ss, with which tests find and reset one TCP connection; Node.js and npm: rhea,
# the second AMQP client of the differential tests (as .ci/install-deps installs them).
RUN apt-get update \
 && apt-get install -y --no-install-recommends rabbitmq-server libqpid-proton11-dev \
      libqpid-proton11-dev-examples pkg-config gcc libc6-dev openjdk-17-jre-headless chromium openssl \
      iproute2 nodejs npm \
 && rm -rf /var/lib/apt/lists/*
# qpid-flow with its test extra and, as .ci/install-deps installs them for the test suite, the
# first-party plugins (the runtime image leaves them out, as `install-deps --runtime` does).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels 'qpid-flow[test,analytics]' qpid-flow-rabbitmq-depth
WORKDIR /src
COPY pyproject.toml ./
# Tests read the docs (the plugin example, the hook reference) and run the bench tools.
COPY docs ./docs
COPY bench ./bench
COPY tests ./tests
RUN npm install --prefix tests/integration/harness/rhea --no-package-lock --no-audit --no-fund --loglevel=error
CMD ["python", "-m", "pytest", "tests/integration"]
