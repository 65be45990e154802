# sagapool image: saga-worker, saga-producer and sagactl on Debian bookworm.
#
#   ./dev image      (podman, offline: tools/image/build.sh)
#   docker build -t REGISTRY/sagapool:0.1.0 --build-arg VERSION=0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" --build-arg SOURCE=URL .
#
# The packages mirror what ./dev installs: the build stage takes the -dev
# packages the three programs compile against (not the test, benchmark or
# PostgreSQL server packages), the runtime stage their runtime libraries.
# Keep both lists in step with APT_PACKAGES in ./dev.
# ./dev test builds it and runs the Helm chart's pods from it (tests/pod);
# the ldd check below makes a missing runtime library fail the build
# instead of the pod.

FROM debian:bookworm AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      g++ cmake make pkg-config \
      librdkafka-dev prometheus-cpp-dev libspdlog-dev libsqlite3-dev libpq-dev \
      libmongoc-dev libcli11-dev nlohmann-json3-dev libtomlplusplus-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B build -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release \
 && cmake --build build -j"$(nproc)" --target saga-worker saga-producer sagactl

FROM debian:bookworm-slim
# ca-certificates: librdkafka verifies TLS brokers against the system CAs
# unless the chart's kafka.tls.caSecret names another CA.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      librdkafka1 librdkafka++1 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0 \
      libspdlog1.10 libsqlite3-0 libpq5 libmongoc-1.0-0 libbson-1.0-0 \
      libtomlplusplus3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 sagapool \
 && useradd --system --uid 10001 --gid sagapool --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin sagapool
COPY --from=build /src/build/bin/saga-worker /src/build/bin/saga-producer /src/build/bin/sagactl /usr/local/bin/
RUN ! ldd /usr/local/bin/saga-worker /usr/local/bin/saga-producer /usr/local/bin/sagactl | grep 'not found'
# Where the image came from, for scanners and for whoever pulls it.
ARG VERSION=unknown
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="sagapool" \
      org.opencontainers.image.description="saga-worker, saga-producer and sagactl" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION" \
      org.opencontainers.image.source="$SOURCE"
# Numeric, so Kubernetes can check runAsNonRoot without reading /etc/passwd.
# Nothing is written outside /tmp: run with a read-only root filesystem and
# an emptyDir on /tmp (the Helm chart does).
USER 10001:10001
# The MongoDB driver keeps diagnostic counters in /dev/shm/mongoc-<pid> by
# default; none of them are read, and a file left by a killed process makes a
# later process with its pid print a warning at start.
ENV MONGOC_DISABLE_SHM=1
EXPOSE 9464
ENTRYPOINT ["saga-worker"]
