//go:build tools

// The upstream program build.sh compiles. Importing it here keeps `go mod tidy` from dropping
// helm.sh/helm/v3 and records every module it needs in go.sum.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
