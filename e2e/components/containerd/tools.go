//go:build tools

// The upstream programs build.sh compiles. Importing them here keeps `go mod tidy` from dropping
// github.com/containerd/containerd/v2 and records every module they need in go.sum.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
