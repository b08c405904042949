package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/tpsprof/tpsprof/agent"
	"github.com/tpsprof/tpsprof/collector"
	"github.com/tpsprof/tpsprof/natsconn"
	"github.com/tpsprof/tpsprof/tps"
	"github.com/tpsprof/tpsprof/trace"
)

func runServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server did not start")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// deliver runs a collector and an agent with the given options against
// the server and reports how many of 8 records (2 steps × 4 ranks of job)
// the collector accepted.
func deliver(t *testing.T, url string, colOpts, agentOpts natsconn.Options, job string) int64 {
	t.Helper()
	colOpts.URL, agentOpts.URL = url, url
	col, err := collector.New(collector.Config{OutDir: t.TempDir(), NATS: colOpts, Grace: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer col.Close()
	dir, _ := os.MkdirTemp("", "tpsprof-sec")
	defer os.RemoveAll(dir)
	a, err := agent.Start(agent.Config{Socket: filepath.Join(dir, "a.sock"), NATS: agentOpts, FlushInterval: 10 * time.Millisecond, ResubscribeGrace: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	deadline := time.Now().Add(5 * time.Second)
	for !a.Stats().NATSConnected && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for s := int64(0); s < 2; s++ {
		for r := int64(0); r < 4; r++ {
			a.SubmitStep(stepRec(job, s, r, 4, 10, 1e9))
		}
	}
	time.Sleep(50 * time.Millisecond)
	a.Flush(2 * time.Second)
	col.Sync(2 * time.Second)
	time.Sleep(50 * time.Millisecond)
	col.Sync(2 * time.Second)
	return col.Stats().Records
}

func TestUserPasswordAndToken(t *testing.T) {
	s := runServer(t, &server.Options{Username: "tps", Password: "s3cret"})
	ok := natsconn.Options{User: "tps", Password: "s3cret"}
	if n := deliver(t, s.ClientURL(), ok, ok, "auth"); n != 8 {
		t.Errorf("with the password: %d records, want 8", n)
	}
	if n := deliver(t, s.ClientURL(), ok, natsconn.Options{User: "tps", Password: "wrong"}, "auth"); n != 0 {
		t.Errorf("wrong password delivered %d records", n)
	}
	ts := runServer(t, &server.Options{Authorization: "tok-123"})
	tok := natsconn.Options{Token: "tok-123"}
	if n := deliver(t, ts.ClientURL(), tok, tok, "tok"); n != 8 {
		t.Errorf("with the token: %d records, want 8", n)
	}
}

func TestNKeyAuth(t *testing.T) {
	kp, _ := nkeys.CreateUser()
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	os.WriteFile(seedFile, seed, 0o600)
	s := runServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	o := natsconn.Options{NKeyFile: seedFile}
	if n := deliver(t, s.ClientURL(), o, o, "nkey"); n != 8 {
		t.Errorf("with the NKey: %d records, want 8", n)
	}
}

// The documented permission layout: an agent may publish only its own job's
// subjects; records it sends for another job never reach the collector.
func TestAgentPermissionsPerJob(t *testing.T) {
	s := runServer(t, &server.Options{Users: []*server.User{
		{Username: "collector", Password: "c", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"tpsprof.v1.>", "_INBOX.>"}}}},
		{Username: "agent-jobA", Password: "a", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"tpsprof.v1.jobA.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}}}},
	}})
	col := natsconn.Options{User: "collector", Password: "c"}
	ag := natsconn.Options{User: "agent-jobA", Password: "a"}
	if n := deliver(t, s.ClientURL(), col, ag, "jobA"); n != 8 {
		t.Errorf("own job: %d records, want 8", n)
	}
	if n := deliver(t, s.ClientURL(), col, ag, "jobB"); n != 0 {
		t.Errorf("another job's subjects: %d records got through", n)
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := writeTestPKI(t, dir)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	s := runServer(t, &server.Options{TLS: true, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	url := strings.Replace(s.ClientURL(), "nats://", "tls://", 1)
	o := natsconn.Options{TLSCA: caFile}
	if n := deliver(t, url, o, o, "tls"); n != 8 {
		t.Errorf("over TLS: %d records, want 8", n)
	}
	// Without the CA the server's certificate is not trusted: nothing flows.
	if n := deliver(t, url, o, natsconn.Options{}, "tls"); n != 0 {
		t.Errorf("untrusted certificate: %d records got through", n)
	}
}

func TestSecretsRedacted(t *testing.T) {
	if got := natsconn.Redacted("nats://user:hunter2@10.0.0.1:4222"); strings.Contains(got, "hunter2") || !strings.Contains(got, "10.0.0.1:4222") {
		t.Errorf("redacted URL: %q", got)
	}
	_, err := natsconn.Connect(natsconn.Options{URL: "nats://user:hunter2@127.0.0.1:1", NKeyFile: "/nonexistent"})
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error leaks the password or is missing: %v", err)
	}
}

// writeTestPKI makes a CA and a server certificate for 127.0.0.1.
func writeTestPKI(t *testing.T, dir string) (ca, cert, key string) {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tpsprof test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(srvKey)
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o644)
	os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), 0o644)
	os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
	return ca, cert, key
}

// The collector's embedded server requires a token by default: a client
// without it (any other local user) is refused; the token file is the
// user's alone (0600); an agent of the same user finds it and delivers.
// Before, the embedded server took any client: read every record, forge
// records, delete the stream.
func TestEmbeddedServerRequiresToken(t *testing.T) {
	bin := buildBinary(t)
	home := t.TempDir()
	port := freePort(t)
	out := t.TempDir()
	env := append(os.Environ(), "XDG_CONFIG_HOME="+filepath.Join(home, "config"), "HOME="+home)
	cmd := exec.Command(bin, "collector", "--out", out, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--http", "", "--live", "0")
	cmd.Env = env
	var stdout syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	tokenPath := filepath.Join(home, "config", "tpsprof", "nats-token")
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(tokenPath); err == nil {
			if nc, err := nats.Connect(url, nats.Token("x")); err == nil {
				nc.Close()
				t.Fatal("a wrong token was accepted")
			} else if strings.Contains(strings.ToLower(err.Error()), "authorization") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector not up with a token:\n%s", stdout.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := nats.Connect(url); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("a client without the token: %v", err)
	}
	fi, err := os.Stat(tokenPath)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %v, mode %v", err, fi.Mode())
	}
	b, _ := os.ReadFile(tokenPath)
	nc, err := nats.Connect(url, nats.Token(strings.TrimSpace(string(b))))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	nc.Close()
	// An agent of the same user (same config dir), given no credentials.
	sock := filepath.Join(t.TempDir(), "a.sock")
	ag := exec.Command(bin, "agent", "--nats", url, "--socket", sock, "--gpu-interval", "0", "--stats", "0")
	ag.Env = env
	var agOut syncBuffer
	ag.Stdout, ag.Stderr = &agOut, &agOut
	if err := ag.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { ag.Process.Signal(os.Interrupt); ag.Wait() }()
	var conn net.Conn
	for conn == nil {
		if conn, err = net.Dial("unix", sock); err != nil {
			conn = nil
			if time.Now().After(deadline) {
				t.Fatalf("agent socket: %v\n%s", err, agOut.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	now := time.Now().UnixNano()
	fmt.Fprintf(conn, `{"job":"tok","step":0,"rank":0,"world_size":1,"tokens":100,"start_unix_ns":%d,"end_unix_ns":%d}`+"\n", now-1e9, now)
	conn.Close()
	for {
		rows, _ := trace.ReadAll[tps.ClusterStep](filepath.Join(out, "tok", trace.ClusterSteps))
		if len(rows) == 1 {
			break
		}
		if time.Now().After(deadline.Add(20 * time.Second)) {
			t.Fatalf("the agent's record never reached Parquet:\nagent: %s\ncollector: %s", agOut.String(), stdout.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}
