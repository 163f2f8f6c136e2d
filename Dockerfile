# Build: docker build -t adaptive-lb:dev --build-arg VERSION=dev .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY internal/ internal/
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /adaptive-lb ./cmd/adaptive-lb

# A static binary on distroless: no shell, no package manager, a non-root user.
FROM gcr.io/distroless/static:nonroot
COPY --from=build /adaptive-lb /adaptive-lb
USER 65532:65532
ENTRYPOINT ["/adaptive-lb"]
CMD ["run"]
