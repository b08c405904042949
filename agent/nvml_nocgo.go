//go:build !cgo

package agent

import "fmt"

// OpenNVML is unavailable in builds without cgo: go-nvml loads the driver
// library through cgo.
func OpenNVML() (GPUReader, error) {
	return nil, fmt.Errorf("%w: this binary was built without cgo", ErrNoNVML)
}
