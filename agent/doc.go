// Package agent is tpsprof's per-node agent. Ranks on the node send one JSON
// object per line to its unix socket (docs/intake.md); the agent validates
// each line, fills in the node and GPU, batches records per job and
// publishes them on NATS (docs/wire.md). It also carries run events and
// metadata, samples the node's GPUs, reads the ranks' profiler traces and
// serves capture requests. Running a command under tpsprof is package
// launch's.
//
// The agent never blocks or breaks the training process: a bad line is
// counted and skipped, a NATS outage is buffered up to a bound and then
// counted as drops, and the clients (package client, the Python hook) never wait
// for it.
package agent
