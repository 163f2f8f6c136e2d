// Command etcd starts an etcd server; envtest runs it beside kube-apiserver on loopback.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
