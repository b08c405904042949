package tps

import (
	"encoding/json"
	"testing"
)

// encoding/json takes "TOKENS" for "tokens": CheckKeys refuses keys that
// are not the wire names exactly, and passes what producers write.
func TestCheckKeys(t *testing.T) {
	var r StepRecord
	if err := json.Unmarshal([]byte(`{"job":"a","TOKENS":5}`), &r); err != nil || r.Tokens != 5 {
		t.Fatalf("encoding/json no longer folds case (%v, %d): CheckKeys may be simplified", err, r.Tokens)
	}
	for _, bad := range []string{`{"job":"a","TOKENS":5}`, `{"Tokens" :5}`, `{"tok\u0065ns":5}`, `{"a":{"Nested":1}}`} {
		if err := CheckKeys([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	for _, good := range []string{`{"job":"a","node":"GPU-Node-7","tokens":5,"note":"A:B"}`, `{"gpu":"NVIDIA H100","x":["A","B"]}`, `{"s":"quote \" X:"}`} {
		if err := CheckKeys([]byte(good)); err != nil {
			t.Errorf("%s: %v", good, err)
		}
	}
}
