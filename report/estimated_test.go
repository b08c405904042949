package report

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/tps"
)

// The text report says which communication figures are carried from
// sampled steps: DDP's hidden part (ddp_buckets reducer) and that of
// functional collectives timed by their waits between samples (a
// _c10d_functional operator among sync_collectives); FSDP2's synchronous
// collectives alone carry nothing.
func TestEstimatedCommunicationSaid(t *testing.T) {
	for _, c := range []struct {
		hooks      map[string]string
		ddp, func_ bool
	}{
		{map[string]string{"ddp_buckets": "reducer"}, true, false},
		{map[string]string{"sync_collectives": "waits between samples: _c10d_functional::all_reduce, allreduce_"}, false, true},
		{map[string]string{"sync_collectives": "waits between samples: _allgather_base_, _reduce_scatter_base_"}, false, false},
		{nil, false, false},
	} {
		var text bytes.Buffer
		if err := WriteText(&text, &Report{Meta: &tps.RunMeta{Hooks: c.hooks}}); err != nil {
			t.Fatal(err)
		}
		out := text.String()
		if got := strings.Contains(out, DDPHiddenEstimated); got != c.ddp {
			t.Errorf("hooks %v: DDP's estimate said %v, want %v\n%s", c.hooks, got, c.ddp, out)
		}
		if got := strings.Contains(out, FunctionalHiddenEstimated); got != c.func_ {
			t.Errorf("hooks %v: the functional collectives' estimate said %v, want %v\n%s", c.hooks, got, c.func_, out)
		}
	}
}
