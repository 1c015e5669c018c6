#!/usr/bin/env bash
# Regenerates sync.pb.go and sync_grpc.pb.go from sync.proto.
#
#   dataplane/syncpb/generate.sh        (from anywhere; or: go generate ./dataplane/syncpb)
#
# Pinned tools, because the generated files name their versions:
#   protoc              3.21.12, Debian 12's protobuf-compiler package
#                       (apt-get install protobuf-compiler)
#   protoc-gen-go       the google.golang.org/protobuf version in go.mod
#   protoc-gen-go-grpc  PROTOC_GEN_GO_GRPC_VERSION below
# .ci/run runs this script and fails when the committed code differs.
set -euo pipefail
cd "$(dirname "$0")"

PROTOC_VERSION="libprotoc 3.21.12"
PROTOC_GEN_GO_GRPC_VERSION="v1.6.2"

got=$(protoc --version 2>/dev/null || true)
if [ "$got" != "$PROTOC_VERSION" ]; then
  echo "generate.sh: need protoc \"$PROTOC_VERSION\" (Debian 12: apt-get install protobuf-compiler), found \"${got:-none}\"" >&2
  exit 1
fi
echo "generate.sh: $got"

# protoc-gen-go at the protobuf version go.mod requires, so the generated
# code matches the runtime it is compiled with.
protobuf_version=$(cd ../.. && go list -m -f '{{.Version}}' google.golang.org/protobuf)

bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
GOBIN="$bin" GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@${protobuf_version}"
GOBIN="$bin" GOFLAGS= go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@${PROTOC_GEN_GO_GRPC_VERSION}"

protoc \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out=. --go_opt=paths=source_relative \
  --go-grpc_out=. --go-grpc_opt=paths=source_relative \
  sync.proto
echo "generate.sh: protoc-gen-go $protobuf_version, protoc-gen-go-grpc $PROTOC_GEN_GO_GRPC_VERSION"
