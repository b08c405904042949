package natsconn

import (
	"net"
	"strings"
	"testing"
	"time"
)

// A port already in use fails at once with the system's reason, not after
// the server's 10 s start timeout with "did not start".
func TestEmbeddedPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	start := time.Now()
	_, err = StartEmbedded("127.0.0.1", port, "")
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("err = %v, want address already in use", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("took %v to fail", d)
	}
}

// The URLs printed for agents: loopback is this machine only; a wildcard
// address lists the host's reachable addresses, never nats://0.0.0.0.
func TestAgentURLs(t *testing.T) {
	urls, local := AgentURLs("127.0.0.1", 4222)
	if !local || len(urls) != 1 || urls[0] != "nats://127.0.0.1:4222" {
		t.Errorf("loopback: %v %v", urls, local)
	}
	urls, _ = AgentURLs("0.0.0.0", 4222)
	for _, u := range urls {
		if strings.Contains(u, "0.0.0.0") || !strings.HasSuffix(u, ":4222") {
			t.Errorf("wildcard gave %q", u)
		}
	}
	if len(urls) == 0 {
		t.Error("no URL for 0.0.0.0")
	}
	srv, err := StartEmbedded("0.0.0.0", 0, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	// every printed URL but the host name reaches the server
	port := srv.Server().Addr().(*net.TCPAddr).Port
	urls, _ = AgentURLs("0.0.0.0", port)
	for _, u := range urls {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(u, "nats://"), 2*time.Second)
		if err != nil {
			t.Errorf("%s: %v", u, err)
			continue
		}
		c.Close()
	}
}

// A server list is redacted member by member (the agent logs its URL list
// while NATS is unreachable).
func TestRedactedList(t *testing.T) {
	got := Redacted("nats://u:secret@a:4222, nats://b:4222,nats://v:pw@c:4222")
	if strings.Contains(got, "secret") || strings.Contains(got, "pw@") || !strings.Contains(got, "b:4222") || strings.Count(got, "nats://") != 3 {
		t.Errorf("redacted: %q", got)
	}
}
