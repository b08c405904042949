package tps

import "fmt"

// CheckKeys reports an error when a JSON object's keys are not written
// exactly as the wire names are: lower case, no escapes. encoding/json
// matches keys case-insensitively ("TOKENS", "Tokens" and "tokens" fill
// one field, the last one winning), so a producer's typo or a second key
// differing in case would silently change a record. It scans the text
// once, without decoding; malformed JSON is left to the decoder.
func CheckKeys(data []byte) error {
	for i := 0; i < len(data); i++ {
		if data[i] != '"' {
			continue
		}
		start, escaped, upper := i+1, false, false
		for i++; i < len(data) && data[i] != '"'; i++ {
			switch c := data[i]; {
			case c == '\\':
				escaped = true
				i++ // skip the escaped byte
			case c >= 'A' && c <= 'Z':
				upper = true
			}
		}
		end := min(i, len(data))
		j := i + 1
		for j < len(data) && (data[j] == ' ' || data[j] == '\t' || data[j] == '\n' || data[j] == '\r') {
			j++
		}
		if j < len(data) && data[j] == ':' && (escaped || upper) {
			key := data[start:end]
			if len(key) > 40 {
				key = key[:40]
			}
			return fmt.Errorf("%w: key %q: keys are lower case, as documented (docs/intake.md)", ErrInvalidRecord, key)
		}
	}
	return nil
}
