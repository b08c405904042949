package launch

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/natsconn"
)

// Launch does not send to a socket another user squats on the default
// path; it says whose it is.
func TestSquattedSocket(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give the socket to another uid")
	}
	dir, _ := os.MkdirTemp("", "tpsprof-squat")
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	os.Chown(path, 4242, 4242)
	var stderr strings.Builder
	code, err := Run(context.Background(), Config{Job: "j", Agent: agent.Config{Socket: path}, Command: []string{"true"}, Stdout: io.Discard, Stderr: &stderr, PythonDir: "-"})
	if code != 2 || err == nil || !strings.Contains(err.Error(), "uid 4242") {
		t.Errorf("launch on a squatted socket: exit %d, %v", code, err)
	}
}

// The command launch runs gets no NATS secret: its ranks write to the
// agent's socket, and a token in their environment would let any of them
// forge records into any job or delete the durable stream.
func TestLaunchKeepsNATSSecretsFromRanks(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "a.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go io.Copy(io.Discard, c)
		}
	}()
	t.Setenv("TPSPROF_NATS_TOKEN", "s3cret-token")
	t.Setenv("TPSPROF_NATS_PASSWORD", "s3cret-pass")
	t.Setenv("TPSPROF_UNRELATED", "kept")
	envFile := filepath.Join(dir, "env")
	var stderr strings.Builder
	code, err := Run(context.Background(), Config{Job: "j", Agent: agent.Config{Socket: path},
		Command: []string{"sh", "-c", "env > " + envFile}, Stdout: io.Discard, Stderr: &stderr, PythonDir: "-"})
	if code != 0 || err != nil {
		t.Fatalf("launch: exit %d, %v\n%s", code, err, stderr.String())
	}
	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "s3cret") || !strings.Contains(string(env), "TPSPROF_UNRELATED=kept") || !strings.Contains(string(env), EnvJob+"=j") {
		t.Errorf("the command's environment:\n%s", env)
	}
}

// A command that ran and sent no step record is said to be silent
// ("is it instrumented?"): the launch was silent about it.
func TestSilentCommandSaid(t *testing.T) {
	srv, err := natsconn.StartEmbedded("127.0.0.1", -1, "")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	var stderr strings.Builder
	code, err := Run(context.Background(), Config{Job: "quiet", Agent: agent.Config{Socket: filepath.Join(t.TempDir(), "a.sock"), NATS: natsconn.Options{URL: srv.URL()}},
		Command: []string{"sleep", "2.2"}, Stdout: io.Discard, Stderr: &stderr, PythonDir: "-"})
	if code != 0 || err != nil || !strings.Contains(stderr.String(), "sent no step record: is it instrumented?") {
		t.Errorf("exit %d, %v: %s", code, err, stderr.String())
	}
}
