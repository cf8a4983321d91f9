# syntax=docker/dockerfile:1
# The kedge-agent image: built from the repository root with
#   docker build -f deploy/images/kedge-agent.Dockerfile -t ghcr.io/kedge-dev/kedge-agent:$VERSION .
# Stage 1 compiles the agent's own profile (the workspace's `agent` profile: release,
# optimized for size, whole-program LTO, stripped: docs/performance.md "Footprint");
# stage 2 is distroless (glibc, CA certificates, no shell, no package manager) running as the
# non-root user 65532, the runAsUser of the charts and of `kubectl kedge install`.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile agent --locked -p kedge-agent --bin kedge-agent \
 && cp target/agent/kedge-agent /kedge-agent

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /kedge-agent /usr/local/bin/kedge-agent
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kedge-agent"]
