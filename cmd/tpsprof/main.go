// Command tpsprof measures the training throughput of distributed jobs:
// tokens per second per step, per GPU and cluster-wide, MFU and HFU, and
// where the lost time goes. Run "tpsprof help" for the commands.
package main

import (
	"os"

	"github.com/tpsprof/tpsprof/cmd/tpsprof/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
