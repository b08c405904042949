package agent

import (
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/wire"
)

// A meta line may carry the model's Hugging Face config (what the trainer
// callback of the Python package sends): the agent turns it into the
// model's shape; a later line merges into the earlier ones (the topology a
// rank sent stays); a config that names no model is rejected and counted.
func TestMetaHFConfigMerged(t *testing.T) {
	a, nc := startWithNATS(t, Config{Node: "n0", FlushInterval: 5 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	var mu sync.Mutex
	var last tps.RunMeta
	n := 0
	nc.Subscribe(wire.MetaSubject("hf"), func(m *nats.Msg) {
		var r tps.RunMeta
		if json.Unmarshal(m.Data, &r) == nil {
			mu.Lock()
			last, n = r, n+1
			mu.Unlock()
		}
	})
	nc.Flush()
	c, err := net.Dial("unix", a.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// GPT-2's published shape (huggingface.co/openai-community/gpt2, config.json)
	lines := `{"type":"meta","job":"hf","topology":{"dp":2,"tp":1,"pp":1}}
{"type":"meta","job":"hf","seq":1024,"hf_config":{"model_type":"gpt2","n_embd":768,"n_layer":12,"n_head":12,"n_inner":null,"vocab_size":50257,"id2label":{"0":"LABEL_0"}}}
{"type":"meta","job":"hf","hf_config":{"model_type":"mystery","hidden_size":64}}
`
	if _, err := c.Write([]byte(lines)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		done := n >= 2
		mu.Unlock()
		if done && a.Stats().Rejected["meta:hf_config"] == 1 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n < 2 {
		t.Fatalf("%d metadata messages, want 2", n)
	}
	if last.Topology.DP != 2 {
		t.Errorf("topology %+v after the model's line: the earlier line's is lost", last.Topology)
	}
	if last.Model == nil || last.Model.Layers != 12 || last.Model.Hidden != 768 || last.Model.FFN != 3072 || last.Model.Vocab != 50257 || !last.Model.Tied || last.Seq != 1024 {
		t.Errorf("model %+v seq %d, want GPT-2's shape (12 layers, 768 wide, FFN 3072, vocab 50257, tied) at 1024", last.Model, last.Seq)
	}
	if got := a.Stats().Rejected["meta:hf_config"]; got != 1 {
		t.Errorf("%d meta:hf_config rejections, want 1 (a config without layers, heads or vocab)", got)
	}
}
