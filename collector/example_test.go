package collector_test

import (
	"fmt"
	"os"

	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
)

// A collector reading what agents publish on a NATS server and writing the
// jobs' Parquet traces under an output folder.
func ExampleNew() {
	c, err := collector.New(collector.Config{OutDir: "traces", NATS: natsconn.Options{URL: "nats://127.0.0.1:4222"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	defer c.Close()
	st := c.Stats()
	fmt.Println(st.Records, "records accepted so far")
}
