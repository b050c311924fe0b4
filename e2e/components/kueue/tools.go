//go:build tools

// The upstream program build.sh compiles. Importing it here keeps `go mod tidy` from dropping
// sigs.k8s.io/kueue and records every module it needs in go.sum.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
