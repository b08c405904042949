// Package client sends step records, events and run metadata from a Go
// training program to the node's tpsprof agent, over its intake socket.
// It needs the standard library and package tps only: a training binary
// that imports it links neither NATS, Prometheus nor NVML.
//
// It owns the socket's writer side. It never blocks the training program:
// records queue and are dropped, counted, when the agent is slow or gone.
//
//	c := client.New(client.DefaultSocket(), client.Options{})
//	defer c.Close(2 * time.Second)
//	rec, _ := tps.NewRecorder(tps.RecorderConfig{Job: "llama", WorldSize: 8, Rank: rank}, c)
package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tpsprof/tpsprof/tps"
)

// Options tune a Client.
type Options struct {
	// Queue bounds the records waiting to be written (default 4096); a
	// record that finds it full is dropped and counted, never waited for.
	Queue int
	// WriteTimeout bounds one write to the socket (default 1s).
	WriteTimeout time.Duration
	// RetryInterval is the pause between connection attempts (default 1s).
	RetryInterval time.Duration
}

type clientItem struct {
	step tps.StepRecord
	raw  []byte // a pre-encoded line (event, meta) when not nil
}

// Client sends records to an agent's intake socket. It implements tps.Sink,
// so a Recorder can send through it. Sends never block the caller: they
// queue, a background goroutine writes, and when the agent is gone or slow
// the records are dropped and counted.
type Client struct {
	path string
	opt  Options
	q    chan clientItem

	sent, dropped, failed atomic.Int64
	closeOnce             sync.Once
	done                  chan struct{}
	stopped               chan struct{}
}

// New returns a client for the socket at path. It connects in the
// background and keeps reconnecting; it never fails.
func New(path string, opt Options) *Client {
	if opt.Queue <= 0 {
		opt.Queue = 4096
	}
	if opt.WriteTimeout <= 0 {
		opt.WriteTimeout = time.Second
	}
	if opt.RetryInterval <= 0 {
		opt.RetryInterval = time.Second
	}
	c := &Client{path: path, opt: opt, q: make(chan clientItem, opt.Queue), done: make(chan struct{}), stopped: make(chan struct{})}
	go c.run()
	return c
}

var _ tps.Sink = (*Client)(nil)

// RecordStep queues a step record; it returns at once.
func (c *Client) RecordStep(r tps.StepRecord) { c.enqueue(clientItem{step: r}) }

// SendEvent queues a run event.
func (c *Client) SendEvent(e tps.Event) { c.sendJSON("event", e) }

// SendMeta queues run metadata.
func (c *Client) SendMeta(m tps.RunMeta) { c.sendJSON("meta", m) }

func (c *Client) sendJSON(kind string, v any) {
	b, err := json.Marshal(v)
	if err != nil || len(b) < 2 {
		c.failed.Add(1)
		return
	}
	// Insert the discriminator: {"type":"event",...}
	line := append([]byte(`{"type":"`+kind+`",`), b[1:]...)
	if string(b) == "{}" {
		line = []byte(`{"type":"` + kind + `"}`)
	}
	c.enqueue(clientItem{raw: append(line, '\n')})
}

func (c *Client) enqueue(it clientItem) {
	select {
	case <-c.done:
		c.dropped.Add(1)
		return
	default:
	}
	select {
	case c.q <- it:
	default:
		c.dropped.Add(1)
	}
}

// Counts returns records written, dropped (queue full, agent gone) and
// failed to encode.
func (c *Client) Counts() (sent, dropped, failed int64) {
	return c.sent.Load(), c.dropped.Load(), c.failed.Load()
}

func (c *Client) run() {
	defer close(c.stopped)
	var conn net.Conn
	var lastTry time.Time
	buf := make([]byte, 0, 1024)
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var it clientItem
		select {
		case it = <-c.q:
		case <-c.done:
			// drain what is queued, then stop
			select {
			case it = <-c.q:
			default:
				return
			}
		}
		if conn == nil {
			if time.Since(lastTry) < c.opt.RetryInterval && !lastTry.IsZero() {
				c.dropped.Add(1)
				continue
			}
			lastTry = time.Now()
			var err error
			if err = CheckSocket(c.path); err == nil {
				conn, err = net.DialTimeout("unix", c.path, c.opt.WriteTimeout)
			}
			if err != nil {
				conn = nil
				c.dropped.Add(1)
				continue
			}
		}
		line := it.raw
		if line == nil {
			b, err := json.Marshal(&it.step)
			if err != nil {
				c.failed.Add(1)
				continue
			}
			buf = append(append(buf[:0], b...), '\n')
			line = buf
		}
		conn.SetWriteDeadline(time.Now().Add(c.opt.WriteTimeout))
		if _, err := conn.Write(line); err != nil {
			conn.Close()
			conn = nil
			c.dropped.Add(1)
			continue
		}
		c.sent.Add(1)
	}
}

// Close writes what is queued (for at most timeout) and disconnects.
func (c *Client) Close(timeout time.Duration) {
	c.closeOnce.Do(func() { close(c.done) })
	select {
	case <-c.stopped:
	case <-time.After(timeout):
	}
}

// DefaultSocket is the intake socket the agent of this user listens on by
// default: $TPSPROF_SOCKET when set, else $XDG_RUNTIME_DIR/tpsprof.sock, else
// tpsprof-<uid>.sock in the temporary folder.
func DefaultSocket() string {
	if s := os.Getenv("TPSPROF_SOCKET"); s != "" {
		return s
	}
	return UserSocket()
}

// UserSocket is where an agent of this user listens unless told otherwise.
func UserSocket() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "tpsprof.sock")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("tpsprof-%d.sock", os.Getuid()))
}

// ErrNotOwner: the socket belongs to another user.
var ErrNotOwner = errors.New("not sending records to another user's socket")

// CheckSocket refuses an intake socket this user should not write to: a
// path that is not a socket, or a socket owned by another user (root
// aside, for an agent run as a node service). In a shared /tmp another
// user could otherwise squat the default path and receive the job's
// metadata, command line and step records.
func CheckSocket(path string) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("client: %s is not a socket", path)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != uint32(os.Getuid()) && st.Uid != 0 {
		return fmt.Errorf("client: %s belongs to uid %d, not to you (uid %d): %w (give the agent another socket, --socket or $XDG_RUNTIME_DIR)", path, st.Uid, os.Getuid(), ErrNotOwner)
	}
	return nil
}
