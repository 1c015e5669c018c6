// Package syncpb is the generated Go code of sync.proto, the configuration
// sync protocol between a control plane and its data planes' gateways
// (service limitplane.sync.v1.SyncService). Do not edit sync.pb.go or
// sync_grpc.pb.go: change sync.proto and run generate.sh, which pins the
// protoc and plugin versions.
package syncpb

//go:generate ./generate.sh
