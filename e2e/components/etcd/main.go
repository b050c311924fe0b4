// etcd's own entry point (go.etcd.io/etcd/v3's main.go does exactly this): the server module
// exposes etcdmain but no main package, so the binary needs these three lines.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
