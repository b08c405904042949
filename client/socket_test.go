package client_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tpsprof/tpsprof/client"
	"github.com/tpsprof/tpsprof/tps"
)

// A socket squatted by another user gets nothing: the client checks the
// owner before connecting. (chown needs root: CI runs as root.)
func TestSocketOfAnotherUserRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give the socket to another uid")
	}
	path := filepath.Join(t.TempDir(), "squat.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	conns := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	if err := os.Chown(path, 4242, 4242); err != nil {
		t.Fatal(err)
	}
	if err := client.CheckSocket(path); !errors.Is(err, client.ErrNotOwner) {
		t.Fatalf("a socket of uid 4242: %v", err)
	}
	c := client.New(path, client.Options{RetryInterval: 10 * time.Millisecond})
	c.RecordStep(tps.StepRecord{Job: "j", Step: 1, WorldSize: 1, Tokens: 1})
	c.Close(300 * time.Millisecond)
	select {
	case <-conns:
		t.Fatal("the client connected to another user's socket")
	default:
	}
	if sent, _, _ := c.Counts(); sent != 0 {
		t.Errorf("%d records sent to another user's socket", sent)
	}
	// the user's own (or root's) socket is used
	os.Chown(path, os.Getuid(), os.Getgid())
	if err := client.CheckSocket(path); err != nil {
		t.Errorf("own socket refused: %v", err)
	}
}
