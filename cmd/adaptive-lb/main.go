// Command adaptive-lb is the adaptive-lb operator, simulator and tooling in one binary.
package main

import (
	"os"
)

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}
