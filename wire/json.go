package wire

import (
	"encoding/json"
	"fmt"

	"github.com/tpsprof/tpsprof/tps"
)

// MaxGPUSamples bounds one GPU message (a node's GPUs over a few intervals).
const MaxGPUSamples = 4096

// EncodeGPUSamples encodes samples as a JSON array.
func EncodeGPUSamples(s []tps.GPUSample) ([]byte, error) { return json.Marshal(s) }

// DecodeGPUSamples decodes a JSON array of samples (not validated).
func DecodeGPUSamples(data []byte) ([]tps.GPUSample, error) {
	var s []tps.GPUSample
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("wire: gpu samples: %w", err)
	}
	if len(s) > MaxGPUSamples {
		return nil, fmt.Errorf("%w: %d gpu samples (limit %d)", ErrTooLarge, len(s), MaxGPUSamples)
	}
	return s, nil
}
